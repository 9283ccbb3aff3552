"""bench/finetune.py: its rows are the issue's methods, each one apply_peft builds on a small encoder with the
trainable count the ledger predicts, and a row's figures print as the table shows them."""

import importlib.util
from pathlib import Path

import pytest

from tformer.adapt import apply_peft, trainable_parameters
from tformer.core.config import ModelConfig
from tformer.cost.peft import trainable_parameters as predicted_trainable
from tformer.model import build

BENCH = Path(__file__).resolve().parents[2] / "bench"


def _bench():
    spec = importlib.util.spec_from_file_location("bench_finetune", BENCH / "finetune.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rows_cover_the_issue_methods():
    assert [label for label, _ in _bench().ROWS] == ["full", "head only", "BitFit", "LoRA r=4", "LoRA r=8",
                                                      "LoRA r=16", "adapters", "prompt tuning"]


@pytest.mark.parametrize("index", range(8))
def test_each_row_builds_with_the_ledgers_trainable_count(index):
    label, spec = _bench().ROWS[index]
    config = ModelConfig(arch="encoder", n_layers=2, d_model=68, n_heads=4, d_ff=72, vocab_size=50, max_positions=40,
                         type_vocab_size=2, task="sequence-classification", n_classes=2, pooling="mean")
    model = apply_peft(build(config), spec)
    assert trainable_parameters(model) == predicted_trainable(config, spec), label


def test_a_row_prints_its_figures():
    record = {"method": "head only", "trainable_parameters": 770, "parameters": 22_714_000,
              "predicted_peak_bytes": 98_000_000, "measured_peak_bytes": 96_600_000, "step_s": 0.25,
              "test_accuracy": 0.8125, "test_rows": 512}
    assert _bench().table_rows([record]) == [["head only", "770 (0.00%)", "98 MB", "97 MB", "250 ms", "81.2%"]]
