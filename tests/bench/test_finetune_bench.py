"""bench/finetune.py's table: a built row shows its figures (the ledger's all-trainable prediction marked), a method
apply_peft does not offer yet shows "not built"."""

import importlib.util
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_finetune", BENCH / "finetune.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_cover_the_issue_methods_and_print_not_built():
    bench = _bench()
    assert [label for label, _ in bench.ROWS] == ["full", "head only", "BitFit", "LoRA r=4", "LoRA r=8", "LoRA r=16",
                                                  "adapters", "prompt tuning"]
    built = {"method": "head only", "built": True, "trainable_parameters": 770, "parameters": 22_714_000,
             "predicted_peak_bytes": 398_000_000, "predicted_counts_trainable_only": False,
             "measured_peak_bytes": 96_600_000, "step_s": 0.25, "test_accuracy": 0.8125, "test_rows": 512}
    rows = bench.table_rows([built, {"method": "LoRA r=4", "built": False}])
    assert rows[0] == ["head only", "770 (0.00%)", "398 MB *", "97 MB", "250 ms", "81.2%"]
    assert rows[1][:2] == ["LoRA r=4", "not built"]
