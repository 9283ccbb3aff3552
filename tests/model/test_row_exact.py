"""Row-exact attention (tformer.model.attention.row_exact, C in tformer/model/csrc/attend_rows.h): the exact kinds'
numbers within fp32 rounding of the reference kind, and each query's output a function of its own vector and the
keys it sees, bit for bit: whatever queries, rows, padding columns and threads share the call. That second
property is what lets a served request on the block kernel answer what generate answers (tests/serve/
test_served_equals_generated.py); here it is checked on the routine itself."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from tformer.model import build, ggml_kernel
from tformer.model.attention.reference import reference
from tformer.model.attention.row_exact import row_exact
from tformer.model.attention.sliding import SlidingAttention
from tformer.model.masks import AttentionMask, build_mask
from tformer.model.quantized import quantized_path, use_path

pytestmark = pytest.mark.skipif(not ggml_kernel.available(), reason="the block kernel is not built (no C compiler)")


def _qkv(B=2, H=6, Hkv=2, T=37, D=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, T, D, generator=g), torch.randn(B, Hkv, T, D, generator=g),
            torch.randn(B, Hkv, T, D, generator=g))


@pytest.fixture
def threads():
    """The kernel's thread count for one test, then back."""
    before = ggml_kernel._THREADS
    yield lambda n: setattr(ggml_kernel, "_THREADS", n)
    ggml_kernel._THREADS = before


def _masks(T: int):
    """Every mask shape a cache hands attention: plain causal, left padding (a dead query included), a position
    bias (ALiBi-like slopes per head), a causal block after a past (chunked prefill), none at all (a decode step)."""
    keep = torch.ones(2, T, dtype=torch.bool)
    keep[1, :5] = False
    slopes = -torch.arange(1, 7, dtype=torch.float32)[:, None, None] / 8
    distance = (torch.arange(T)[None, :] - torch.arange(T)[:, None]).abs().float()
    return {
        "causal": build_mask(T, T, causal=True),
        "left padding": build_mask(T, T, causal=True, key_padding=keep),
        "position bias": build_mask(T, T, causal=True, position_bias=(slopes * distance)[None]),
        "after a past": build_mask(T - 12, T, causal=True),
        "none": build_mask(T, T, causal=False),
    }


@pytest.mark.parametrize("name", ["causal", "left padding", "position bias", "after a past", "none"])
@pytest.mark.parametrize("heads", [(6, 6), (6, 2), (6, 1)])
def test_it_computes_the_reference_kinds_attention(name, heads):
    H, Hkv = heads
    q, k, v = _qkv(H=H, Hkv=Hkv)
    mask = _masks(37)[name]
    q = q[:, :, -mask.tq:]
    got, weights = row_exact(q, k, v, mask, 0.125)
    want, _ = reference(q, k, v, mask, 0.125)
    assert weights is None and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)
    if mask.dead_rows is not None:  # a query with no key to see: zeros, as the other kinds give
        assert mask.dead_rows.any() and (got.masked_select(mask.dead_rows) == 0).all()


def test_a_sliding_window_read_as_its_band_is_the_sliding_kind():
    from tformer.core.config import ModelConfig

    q, k, v = _qkv(T=40)
    config = ModelConfig(arch="decoder", n_layers=1, d_model=384, n_heads=6, vocab_size=97, max_positions=128,
                         attn_impl="sliding", attn_window=7)
    kind = SlidingAttention(config.attention_options(0), 6, 64)
    mask = build_mask(40, 40, causal=True)
    got, _ = row_exact(q, k, v, kind.dense_mask(mask), 0.125)
    want, _ = kind(q, k, v, mask, 0.125)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=2e-6)


def test_a_query_s_output_is_the_same_whatever_shares_the_call(threads):
    """Prefill of 37 tokens (causal, 2 rows) against: each row alone, every query as a decode step over its keys,
    a chunk of queries after a past, the keys padded to 64 columns under a serving pool's bias, 1 to 3 threads."""
    q, k, v = _qkv()
    T = q.shape[2]
    whole, _ = row_exact(q, k, v, build_mask(T, T, causal=True), 0.125)
    for n in (1, 3):
        threads(n)
        assert torch.equal(row_exact(q, k, v, build_mask(T, T, causal=True), 0.125)[0], whole), n
    assert torch.equal(row_exact(q[1:], k[1:], v[1:], build_mask(T, T, causal=True), 0.125)[0], whole[1:])
    for t in (0, 5, 31, 32, 36):
        step, _ = row_exact(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1], build_mask(1, t + 1, causal=True), 0.125)
        assert torch.equal(step, whole[:, :, t:t + 1]), t
    chunk, _ = row_exact(q[:, :, 20:], k, v, build_mask(T - 20, T, causal=True), 0.125)
    assert torch.equal(chunk, whole[:, :, 20:])
    pad = torch.zeros(2, 2, 64, 64)
    kp, vp = pad.clone(), pad.clone()
    kp[:, :, :T], vp[:, :, :T] = k, v
    kp[:, :, T:], vp[:, :, T:] = 1e3, -1e3  # stale columns of a pool's row: hidden, so they must not count
    bias = torch.full((2, 1, T, 64), float("-inf"))
    for t in range(T):
        bias[:, :, t, :t + 1] = 0.0
    padded, _ = row_exact(q, kp, vp, AttentionMask.given(bias), 0.125)
    assert torch.equal(padded, whole)


def test_the_block_path_turns_it_on_and_training_runs_without_it():
    from tformer.adapt.quantize import quantize_model
    from tformer.core.config import ModelConfig

    config = ModelConfig(arch="decoder", position="rope", norm="rmsnorm", activation="silu", gated_mlp=True,
                         bias=False, n_layers=2, d_model=64, n_heads=4, n_kv_heads=2, d_ff=256, vocab_size=97,
                         max_positions=128, tied_embeddings=False)
    torch.manual_seed(0)
    model = quantize_model(build(config).eval(), "q8_0")
    layers = [m for m in model.modules() if hasattr(m, "row_exact")]
    assert layers and not any(m.row_exact for m in layers)
    ids = torch.randint(0, 97, (2, 20))
    with quantized_path(model, "blocks"):
        assert all(m.row_exact for m in layers)
        with torch.no_grad():
            on = model(ids).logits
    assert not any(m.row_exact for m in layers)  # back as it was
    use_path(model, "blocks")
    assert all(m.row_exact for m in layers)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, on)
    use_path(model, "reference")
    assert not any(m.row_exact for m in layers)
    fp32 = build(config)  # a gradient is wanted: torch's attention runs (the C routine has no backward)
    for m in fp32.modules():
        if hasattr(m, "row_exact"):
            m.row_exact = True
    fp32(ids).logits.sum().backward()
    assert all(p.grad is not None for p in fp32.parameters())


def test_a_compiled_graph_calls_the_same_routine():
    q, k, v = _qkv()
    bias = torch.zeros(2, 1, 37, 37).masked_fill(~torch.ones(37, 37, dtype=torch.bool).tril(), float("-inf"))

    def attend(q, k, v, bias):
        return row_exact(q, k, v, AttentionMask.given(bias), 0.125)[0]

    compiled = torch.compile(attend, backend="inductor", fullgraph=True)
    assert torch.equal(compiled(q, k, v, bias), attend(q, k, v, bias))


_PORTABLE = """
import torch
from tformer.model import ggml_kernel
from tformer.model.attention.reference import reference
from tformer.model.attention.row_exact import row_exact
from tformer.model.masks import build_mask
g = torch.Generator().manual_seed(0)
q, k, v = torch.randn(1, 4, 30, 72, generator=g), torch.randn(1, 2, 30, 72, generator=g), torch.randn(1, 2, 30, 72, generator=g)
m = build_mask(30, 30, causal=True)
torch.testing.assert_close(row_exact(q, k, v, m, 0.1)[0], reference(q, k, v, m, 0.1)[0], rtol=1e-5, atol=2e-6)
print(ggml_kernel.simd())
"""


def test_the_portable_path_computes_the_same_attention():
    """A CPU without AVX2 runs plain C (forced here); a head size that is no multiple of 8 takes the tails."""
    out = subprocess.run([sys.executable, "-c", _PORTABLE], env={**os.environ, "TFORMER_KERNEL_SIMD": "portable"},
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "portable C"
