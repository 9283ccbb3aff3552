"""bench/length_extrapolation.py runs end to end on a tiny local corpus and prints its loss table."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "length_extrapolation.py"


def load():
    spec = importlib.util.spec_from_file_location("bench_length_extrapolation", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_length_extrapolation_prints_the_loss_table_and_files_it(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path / "cache"))
    corpus = tmp_path / "tiny.txt"
    words = ["to", "be", "or", "not", "that", "is", "the", "question", "whether", "tis", "nobler"]
    corpus.write_text("\n".join(" ".join(words[(i * 7 + j) % len(words)] for j in range(9)) for i in range(600)))
    bench = load()
    monkeypatch.setattr(bench._results, "RESULTS", tmp_path / "results")
    assert bench.main(["--steps", "2", "--seq", "16", "--lengths", "16", "32", "--batch", "2", "--eval-chars", "64",
                       "--n-layers", "1", "--d-model", "16", "--n-heads", "2", "--d-ff", "32",
                       "--data", str(corpus)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^machine: .+ BLAS \S+", out, re.M)
    assert "trained at T=16" in out and "for 2 steps of batch 2" in out
    assert re.search(r"^positions\s+16\s+32$", out, re.M)
    assert re.search(r"^learned\s+[\d.]+\s+n/a \(table holds 16\)$", out, re.M)
    cells = {}
    for row in ("sinusoidal", "rope", "rope\\+linear", "alibi"):
        found = re.search(rf"^{row}\s+([\d.]+)\s+([\d.]+)$", out, re.M)
        assert found, row
        cells[row] = found.groups()
    assert cells["rope\\+linear"][0] == cells["rope"][0]  # at the trained length interpolation changes nothing
    assert "rope+sliding" in out  # a row, or the note that the kind is not there yet
    saved = json.loads(next((tmp_path / "results").glob("*.json")).read_text())["length_extrapolation"]
    assert saved["validation_loss"]["learned"]["32"] == "n/a (table holds 16)"
    assert saved["steps"] == 2 and saved["seq"] == 16
