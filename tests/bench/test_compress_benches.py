"""bench/distill.py and bench/prune.py on a tiny random model and fixed batches: every row of their tables is
produced (no timings asserted, no corpus or trained teacher needed)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
from fixed_source import FixedTokenSource

from tformer.core.config import ModelConfig
from tformer.model import build

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name: str):
    sys.path.insert(0, str(BENCH))  # the benches import their _helpers by name
    try:
        spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(BENCH))


def _teacher():
    torch.manual_seed(0)
    return build(ModelConfig(arch="decoder", n_layers=4, d_model=16, n_heads=4, d_ff=32, vocab_size=30,
                             max_positions=64)).eval()


def test_distill_bench_trains_the_three_students():
    bench = load("distill")
    rows = bench.students(_teacher(), FixedTokenSource(30, 32, 12), steps=2, alpha=0.5, temperature=2.0, lr=1e-3)
    assert [r["student"] for r in rows] == ["scratch", "copied", "distilled"]
    assert rows[1]["val_loss_before"] == rows[2]["val_loss_before"] != rows[0]["val_loss_before"]
    assert len({r["params"] for r in rows}) == 1


def test_prune_bench_tables_have_every_row():
    bench = load("prune")
    model, source = _teacher(), FixedTokenSource(30, 32, 12)
    batch = source.next_batch(4)
    mode = {"reps": 1, "decode_tokens": 2}
    unstr = bench.unstructured(model, source, batch, mode)
    struct = bench.structured(model, source, batch, mode)
    assert len(unstr) == 2 * len(bench.SPARSITIES) and len(struct) == 9 + 2
    assert len({r["params"] for r in unstr}) == 1  # zeros are still parameters
    assert struct[0]["params"] > struct[4]["params"] > struct[8]["params"]  # -1 head -25% FFN, -2 heads -50%
    text = bench.tables(unstr, struct)
    assert "per layer" in text and "gradient" in text and text.count("\n") > 20
