"""bench/export.py runs end to end on a tiny model and prints its one table from live measurements."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("onnxruntime")
BENCH = Path(__file__).resolve().parents[2] / "bench" / "export.py"


def test_export_bench_prints_eager_and_ort_times_per_shape(capsys, tmp_path):
    spec = importlib.util.spec_from_file_location("bench_export", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out_json = tmp_path / "export.json"
    tiny = ["--set", "n_layers=1", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=40",
            "--set", "vocab_size=50"]
    assert module.main(["--models", "gpt2", "--batches", "1,2", "--lengths", "5", "--repeats", "2", "--threads", "1",
                        *tiny, "--json", str(out_json), "--no-save"]) == 0
    out = capsys.readouterr().out
    assert "ONNX Runtime vs PyTorch eager" in out
    row = r"^gpt2\s+0\.\dM\s+[\d.]+\s+\d+\s+\S+\s+[12]\s+5\s+[\d.]+\s+[\d.]+\s+[\d.]+x$"
    assert len(re.findall(row, out, re.MULTILINE)) == 2
    record = json.loads(out_json.read_text())["models"][0]
    assert record["max_difference"] < 1e-4 and record["onnx_bytes"] > 0
    assert all(s["eager_s"] > 0 and s["ort_s"] > 0 for s in record["shapes"])
