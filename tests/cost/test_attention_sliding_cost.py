"""The sliding-window ledger row against PyTorch (FlopCounterMode, the rolling cache's bytes) and its
growth: linear in n at a fixed window."""

from __future__ import annotations

import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.cost.attention_sliding import block_plan, cache_positions
from tformer.cost.ledger import ledger
from tformer.measure.flops import FlopCounter
from tformer.model import build


def _config(arch="decoder", **kw):
    base = dict(arch=arch, n_layers=2, d_model=48, n_heads=6, n_kv_heads=2, d_ff=64, vocab_size=50, max_positions=128,
                position="rope" if arch == "decoder" else "learned", attn_impl="sliding", attn_window=5)
    return ModelConfig(**{**base, **kw})


def _flops(fn) -> int:
    with FlopCounter() as fc:
        fn()
    return fc.get_total_flops()


@pytest.mark.parametrize("arch", ["decoder", "encoder"])
@pytest.mark.parametrize("dilation", [1, 2, [1, 3]])
def test_forward_and_train_matmul_flops_equal_flop_counter(arch, dilation):
    config = _config(arch, attn_dilation=dilation)
    model = build(config)
    batch, seq = 2, 23  # not a multiple of the window
    ids = torch.randint(0, config.vocab_size, (batch, seq))

    def run(train):
        model.train(train)
        with torch.set_grad_enabled(train):
            out = model(ids)
            t = out.logits if out.logits is not None else out.last_hidden_state
            if train:
                t.sum().backward()

    assert _flops(lambda: run(False)) == ledger(config, phase="forward", batch=batch, seq=seq).flops["matmul"]
    assert _flops(lambda: run(True)) == ledger(config, phase="train", batch=batch, seq=seq).flops["matmul"]


@pytest.mark.parametrize("dilation", [1, 2])
@pytest.mark.parametrize("context", [3, 30])
def test_decode_flops_and_rolling_cache_bytes_equal_the_model(dilation, context):
    config = _config(attn_dilation=dilation)
    model = build(config).eval()
    batch = 2
    cache = model.new_cache()
    with torch.no_grad():
        model(torch.randint(0, 50, (batch, context)), past_key_values=cache)
        flops = _flops(lambda: model(torch.randint(0, 50, (batch, 1)), past_key_values=cache))
    lg = ledger(config, phase="decode", batch=batch, seq=context + 1, context=context)
    assert lg.flops["matmul"] == flops
    assert lg.memory["kv_cache"] == cache.nbytes
    held = min(context + 1, cache_positions(5, dilation))
    assert cache.nbytes == 2 * config.n_layers * batch * config.n_kv_heads * held * config.head_dim * 4


def test_decode_cache_is_capped_at_the_window_in_the_ledger():
    config = _config(attn_window=64)
    short = ledger(config, phase="decode", batch=1, seq=33, context=32).memory["kv_cache"]
    long = [ledger(config, phase="decode", batch=1, seq=n + 1, context=n).memory["kv_cache"] for n in (64, 1000, 8000)]
    assert short < long[0] == long[1] == long[2]
    per_position = 2 * config.n_layers * config.n_kv_heads * config.head_dim * 4
    assert long[0] == 64 * per_position  # (w - 1)·1 + 1 positions


def _attention(lg, field):
    return sum(getattr(op, field) for op in lg.ops if op.kind in ("scores", "softmax", "context"))


@pytest.mark.parametrize("arch", ["decoder", "encoder"])
def test_attention_cost_grows_linearly_in_n_at_fixed_window(arch):
    config = _config(arch, attn_window=128, max_positions=8192)
    small, large = (ledger(config, phase="train", batch=1, seq=n) for n in (1024, 4096))
    for field in ("matmul_flops", "bytes_written", "scores_bytes"):  # scores_bytes: kept for the backward
        assert _attention(large, field) / _attention(small, field) == pytest.approx(4, rel=0.02), field
    dense = ledger(config.replace(attn_impl="reference"), phase="train", batch=1, seq=4096)
    assert 0 < _attention(large, "scores_bytes") < _attention(dense, "scores_bytes") / 10


def test_block_plan_pairs_are_about_2nw():
    plan = block_plan(1000, 1000, 0, 0, 10, 1, causal=True)
    assert (plan.rows, plan.block, plan.blocks, plan.span) == (1, 10, 100, 19)
    assert plan.pairs == 1000 * 19
    dilated = block_plan(1000, 1000, 0, 0, 10, 4, causal=False)
    assert (dilated.rows, dilated.cols, dilated.span) == (4, 250, 30)
    decode = block_plan(1, 38, 57, 20, 10, 4, causal=True)
    assert decode.pairs == 10  # one query against its w keys
    wide = block_plan(100, 100, 0, 0, 4096, 1, causal=True)
    assert wide.pairs == 100 * 100  # a window wider than the sequence: the dense pairs, no more
