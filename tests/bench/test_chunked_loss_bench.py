"""bench/chunked_loss.py end to end on tiny settings: the table a user reads, from live measurements."""

import importlib.util
import json
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench" / "chunked_loss.py"


def test_the_bench_prints_predicted_and_measured_peaks_side_by_side(capsys, tmp_path):
    spec = importlib.util.spec_from_file_location("bench_chunked_loss", BENCH)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out_json = tmp_path / "chunked.json"
    assert bench.main(["--vocab", "4096", "--seq", "64", "--batch", "2", "--layers", "1", "--chunks", "0,16",
                       "--steps", "1", "--no-save", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "step peak predicted" in out and "whole logits" in out and "16 rows" in out
    plain, chunked = json.loads(out_json.read_text())["rows"]
    assert chunked["predicted_logits_bytes"] == 16 * 4096 * 4 < plain["predicted_logits_bytes"] == 128 * 4096 * 4
    assert chunked["measured_peak_bytes"] < plain["measured_peak_bytes"]
    assert chunked["predicted_peak_bytes"] < plain["predicted_peak_bytes"]
    assert abs(chunked["loss"] - plain["loss"]) < 1e-5
