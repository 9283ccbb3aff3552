"""The exact kinds tiled (FlashAttention's algorithm) and chunked (queries in chunks) against SDPA: outputs
and the gradients of q, k, v (and of a position bias) within 1e-5, under every mask the model builds."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils._python_dispatch import TorchDispatchMode

from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.model import build, with_attention
from tformer.model.attention import make_attention
from tformer.model.attention.chunked import Chunked, chunked_attention
from tformer.model.attention.reference import reference
from tformer.model.attention.sdpa import sdpa
from tformer.model.attention.tiled import Tiled, tiled_attention
from tformer.model.masks import build_mask

DT = torch.float64  # the comparison is of algorithms, so rounding must not hide a difference
KINDS = {"tiled": tiled_attention, "chunked": chunked_attention}


def _inputs(B, H, Hkv, tq, tk, D, seed=0, bias=False):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, t, D, generator=gen, dtype=DT).requires_grad_()
               for h, t in ((H, tq), (Hkv, tk), (Hkv, tk)))
    pb = torch.randn(1, H, tq, tk, generator=gen, dtype=DT).requires_grad_() if bias else None
    return q, k, v, pb


def _run(fn, q, k, v, mask, seed=1, scale=0.3):
    out, _ = fn(q, k, v, mask, scale, 0.0)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed), dtype=out.dtype).to(out.device)
    leaves = [t for t in (q, k, v, mask.position_bias) if t is not None]
    return out, torch.autograd.grad(out, leaves, grad)


def _assert_equal_to_sdpa(kind, block, q, k, v, mask):
    with sdpa_kernel(SDPBackend.MATH):
        want, want_grads = _run(sdpa, q, k, v, mask)
    got, got_grads = _run(lambda *a: KINDS[kind](*a, block=block), q, k, v, mask)
    assert torch.isfinite(got).all() and all(torch.isfinite(g).all() for g in got_grads)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=0)


CASES = {  # name: (B, H, Hkv, Tq, Tk, causal, padding, bias)
    "square": (2, 4, 4, 37, 37, False, None, False),
    "causal": (2, 4, 4, 37, 37, True, None, False),
    "gqa-causal": (2, 4, 2, 37, 37, True, None, False),
    "mqa": (1, 4, 1, 16, 16, True, None, False),
    "right-padding": (2, 4, 2, 37, 37, False, "right", False),
    "left-padding-causal-dead-rows": (2, 4, 2, 37, 37, True, "left", False),
    "cross": (2, 4, 2, 13, 29, False, "right", False),
    "cached-chunk": (2, 4, 2, 5, 37, True, None, False),
    "cached-chunk-padded": (2, 4, 2, 11, 37, True, "left", False),
    "bias": (2, 4, 4, 37, 37, False, None, True),
    "bias-causal-padded": (2, 4, 2, 37, 37, True, "left", True),
    "one-token": (2, 4, 2, 1, 20, True, None, False),
}


@pytest.mark.parametrize("block", [8, 64, 1])
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("kind", KINDS)
def test_equals_sdpa_in_outputs_and_gradients(kind, case, block):
    B, H, Hkv, tq, tk, causal, padding, bias = CASES[case]
    q, k, v, pb = _inputs(B, H, Hkv, tq, tk, 8, bias=bias)
    keep = None
    if padding:
        keep = torch.ones(B, tk)
        if padding == "left":
            keep[0, :tk - tq + 9] = 0  # 9 of the first sequence's queries see no key: dead rows
        else:
            keep[0, -7:] = 0
    mask = build_mask(tq, tk, causal=causal, key_padding=keep, position_bias=pb, dtype=DT)
    if padding == "left":
        assert mask.dead_rows is not None and mask.dead_rows.sum() == 9
    _assert_equal_to_sdpa(kind, block, q, k, v, mask)


@pytest.mark.parametrize("kind", KINDS)
def test_fp32_within_1e5(kind, device):
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 50, 16, generator=gen).to(device).requires_grad_() for _ in range(3))
    mask = build_mask(50, 50, causal=True, device=device)
    want, want_grads = _run(sdpa, q, k, v, mask, scale=0.25)
    got, got_grads = _run(lambda *a: KINDS[kind](*a, block=16), q, k, v, mask, scale=0.25)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", ["tiled", "chunked"])
def test_built_from_the_config_with_its_block(kind):
    config = ModelConfig(arch="decoder", n_layers=1, d_model=32, n_heads=4, n_kv_heads=2, d_ff=8, max_positions=64,
                         attn_impl=kind, attn_block=8)
    module = make_attention(config.attention_options(0), 4, 8)
    assert isinstance(module, {"tiled": Tiled, "chunked": Chunked}[kind]) and module.options.block == 8


# Dropout ---------------------------------------------------------------------------------------------------------
def test_tiled_dropout_equals_dense_attention_with_the_same_masks():
    """Each block's keep-mask comes from a generator seeded by the call's seed and the block: rebuilt here
    densely, attention with those masks is what tiled computed, in outputs and gradients."""
    B, H, T, D, p, block = 2, 2, 21, 8, 0.3, 8
    q, k, v, _ = _inputs(B, H, H, T, T, D)
    mask = build_mask(T, T, causal=True, dtype=DT)
    torch.manual_seed(5)
    got, got_grads = _run(lambda *a: tiled_attention(a[0], a[1], a[2], a[3], a[4], p, block=block), q, k, v, mask)
    torch.manual_seed(5)
    seed = int(torch.randint(0, 2 ** 62, (1,)).item())
    keep = torch.zeros(B, H, T, T, dtype=DT)
    for q0 in range(0, T, block):
        for k0 in range(0, min(T, q0 + block), block):
            q1, k1 = min(q0 + block, T), min(k0 + block, T)
            gen = torch.Generator().manual_seed((seed + q0 * (T + 1) + k0) % 2 ** 62)
            keep[:, :, q0:q1, k0:k1] = (torch.rand(B, H, q1 - q0, k1 - k0, generator=gen) >= p).to(DT)

    def dense(q, k, v, mask, scale, _):
        weights = reference(q, k, v, mask, scale)[1]
        return torch.matmul(weights * keep / (1 - p), v), None

    want, want_grads = _run(dense, q, k, v, mask)
    torch.testing.assert_close(got, want, atol=1e-10, rtol=0)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=0)


def test_chunked_dropout_backward_drops_the_same_weights_as_its_forward():
    q, k, v, _ = _inputs(1, 2, 2, 20, 20, 8)
    mask = build_mask(20, 20, causal=True, dtype=DT)
    torch.manual_seed(7)
    got = torch.autograd.grad(chunked_attention(q, k, v, mask, 0.3, 0.5, block=8)[0].sum(), (q, k, v))

    def plain(q, k, v):  # the same chunks without checkpointing: one forward, its own saved masks
        outs = []
        for q0 in range(0, 20, 8):
            sub = build_mask(min(8, 20 - q0), 20, causal=True, q_start=q0, dtype=DT)
            outs.append(reference(q[:, :, q0:q0 + 8], k, v, sub, 0.3, 0.5)[0])
        return torch.cat(outs, dim=2)

    torch.manual_seed(7)
    want = torch.autograd.grad(plain(q, k, v).sum(), (q, k, v))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-10, rtol=0)


def test_bad_block_and_dropout_are_one_line_errors():
    q, k, v, _ = _inputs(1, 1, 1, 4, 4, 2)
    mask = build_mask(4, 4, causal=False)
    for fn in KINDS.values():
        with pytest.raises(TformerError, match="attn_block"):
            fn(q, k, v, mask, 1.0, block=0)
    with pytest.raises(TformerError, match="attention_dropout"):
        tiled_attention(q, k, v, mask, 1.0, 1.0)


# Memory ------------------------------------------------------------------------------------------------------------
class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an op returns."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("causal", [True, False])
def test_tiled_never_allocates_an_n_by_n_tensor_forward_or_backward(causal):
    n, block = 512, 64
    q, k, v = (torch.randn(1, 2, n, 16, requires_grad=True) for _ in range(3))
    mask = build_mask(n, n, causal=causal, key_padding=torch.arange(n)[None] > 3)
    with _LargestTensor() as tiled_run:
        out, _ = tiled_attention(q, k, v, mask, 0.25, block=block)
        out.sum().backward()
    assert tiled_run.largest < n * n / 4
    with _LargestTensor() as dense_run:  # the same recorder sees the reference path's scores
        out, _ = reference(q, k, v, build_mask(n, n, causal=causal), 0.25)
        out.sum().backward()
    assert dense_run.largest >= n * n


# Whole models ------------------------------------------------------------------------------------------------------
def _model_grads(model, ids, extra):
    model.zero_grad()
    out = model(ids, **extra)
    out.logits.double().square().mean().backward()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder-decoder"])
@pytest.mark.parametrize("kind", KINDS)
def test_whole_model_logits_and_parameter_grads_equal_sdpa(arch, kind, device):
    torch.manual_seed(0)
    enc_dec = arch == "encoder-decoder"
    config = ModelConfig(arch=arch, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=50,
                         max_positions=64, attn_block=8, position="rope" if arch == "decoder" else "learned",
                         lm_head=True, decoder_start_token_id=0 if enc_dec else None)
    model = build(config, dtype=DT).train().to(device)
    ids = torch.randint(1, 50, (2, 21)).to(device)
    extra = {"attention_mask": (torch.arange(21)[None] >= torch.tensor([[0], [5]])).long().to(device)}
    if enc_dec:
        extra["decoder_input_ids"] = torch.randint(1, 50, (2, 11)).to(device)
    with sdpa_kernel(SDPBackend.MATH):
        want_logits, want = _model_grads(model, ids, extra)
    other = with_attention(model, kind)
    got_logits, got = _model_grads(other, ids, extra)
    torch.testing.assert_close(got_logits, want_logits, atol=1e-5, rtol=0)
    assert got.keys() == want.keys() and len(got) > 5
    for name in want:
        torch.testing.assert_close(got[name], want[name], atol=1e-5, rtol=0, msg=name)
