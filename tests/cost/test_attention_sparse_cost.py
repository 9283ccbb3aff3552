"""The sparse kinds' ledger rows: matmul FLOPs equal FlopCounterMode on the model (forward, training, a decode
step), and the attention FLOPs and scores bytes grow with n·w (longformer, bigbird), strided as n·(2w + n/w)."""

import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.cost.ledger import ledger
from tformer.measure.flops import FlopCounter
from tformer.model import build


def _config(kind, arch, **kw):
    fields = {"arch": arch, "n_layers": 2, "d_model": 16, "n_heads": 4, "n_kv_heads": 2, "d_ff": 24,
              "vocab_size": 30, "max_positions": 64, "attn_impl": kind, "attn_window": 4, "attn_block": 4,
              "attn_random": 1, "attn_global": 2, "attn_dilation": [1, 2], "position": "rope", "lm_head": True}
    fields.update(kw)
    return ModelConfig(**fields)


def _counted(model, ids, train):
    model.train(train)
    with torch.set_grad_enabled(train), FlopCounter() as fc:
        out = model(ids)
        if train:
            out.logits.sum().backward()
    return fc.get_total_flops()


@pytest.mark.parametrize("kind", ["strided", "longformer", "bigbird"])
@pytest.mark.parametrize("arch", ["decoder", "encoder"])
def test_ledger_flops_equal_flop_counter(kind, arch):
    config = _config(kind, arch)
    torch.manual_seed(0)
    model = build(config)
    ids = torch.randint(0, 30, (2, 23))  # not a whole number of blocks
    fwd = _counted(model, ids, train=False)
    assert ledger(config, phase="forward", batch=2, seq=23).flops["matmul"] == fwd
    assert ledger(config, phase="train", batch=2, seq=23).flops["matmul"] == _counted(model, ids, train=True) == 3 * fwd
    if arch == "decoder":
        model.eval()
        cache = model.new_cache()
        with torch.no_grad():
            model(ids[:, :22], past_key_values=cache)
            with FlopCounter() as fc:
                model(ids[:, 22:], past_key_values=cache)
        assert ledger(config, phase="decode", batch=2, seq=23, context=22).flops["matmul"] == fc.get_total_flops()


def _attention(kind, n, window, block=64):
    config = ModelConfig(arch="decoder", n_layers=1, d_model=64, n_heads=4, d_ff=64, vocab_size=50, max_positions=n,
                         position="rope", attn_impl=kind, attn_window=window, attn_block=block, attn_random=3,
                         attn_global=2)
    lg = ledger(config, phase="train", batch=1, seq=n)
    flops = lg.total(lg.select(phase="forward", kind=("scores", "softmax", "context")), "flops")
    return flops, lg.total(lg.ops, "scores_bytes")


@pytest.mark.parametrize("kind", ["longformer", "bigbird"])
def test_cost_grows_linearly_in_n_at_fixed_window(kind):
    small, large = _attention(kind, 1024, 128), _attention(kind, 4096, 128)
    assert large[0] / small[0] == pytest.approx(4, rel=0.02) and large[1] / small[1] == pytest.approx(4, rel=0.02)
    dense = _attention("reference", 4096, 128)
    assert large[1] < dense[1] / 4 and large[0] < dense[0] / 4  # at n = 4096 already


def test_strided_costs_n_times_two_w_plus_n_over_w():
    def expected(n, w):  # per head: each query meets 2w local keys and n / w strided ones, twice (QK^T and AV)
        return 2 * 2 * 64 * n * (2 * w + n // w)  # 2 matmuls x 2 FLOPs x heads·head_dim (64)
    config = ModelConfig(arch="decoder", n_layers=1, d_model=64, n_heads=4, d_ff=64, vocab_size=50, max_positions=4096,
                         position="rope", attn_impl="strided", attn_window=16)
    for n in (1024, 4096):
        lg = ledger(config, phase="forward", batch=1, seq=n)
        assert lg.total(lg.select(kind=("scores", "context")), "matmul_flops") == expected(n, 16)
    # at fixed w the strided part (n²/w) dominates: x4 in n costs about x16; with w = √n, x8 (n·√n)
    fixed = _attention("strided", 4096, 16)[1] / _attention("strided", 1024, 16)[1]
    root = _attention("strided", 4096, 64)[1] / _attention("strided", 1024, 32)[1]
    assert 12 <= fixed <= 16 and root == pytest.approx(8, rel=0.02)
