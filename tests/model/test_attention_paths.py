"""Every registered attention kind equals the step-by-step reference; the hand LayerNorm equals F.layer_norm."""

import math

import pytest
import torch
import torch.nn.functional as F

from tformer.core.attention_kinds import ATTN_KINDS
from tformer.core.config import ModelConfig
from tformer.model import ATTENTION, build, with_attention
from tformer.model.attention import make_attention
from tformer.model.attention.reference import reference
from tformer.model.masks import build_mask
from tformer.model.norm import LayerNorm, RMSNorm, layer_norm_reference

B, H, D = 2, 4, 8
# Every exact kind equals the reference on every mask (small tiles, so the tiled kinds cross blocks).
FAST = [name for name in ATTENTION if name != "reference" and ATTN_KINDS[name].family == "exact"]
_KINDS = {name: make_attention(ModelConfig(attn_impl=name, attn_block=2).attention_options(0), H, D) for name in FAST}


def _qkv(tq, tk, kv_heads=H):
    return torch.randn(B, H, tq, D), torch.randn(B, kv_heads, tk, D), torch.randn(B, kv_heads, tk, D)


def _all(q, k, v, mask):
    """(reference output, its weights, {kind: output} for every other kind)."""
    scale = 1 / math.sqrt(D)
    ref, weights = reference(q, k, v, mask, scale, 0.0)
    return ref, weights, {name: _KINDS[name](q, k, v, mask, scale, 0.0)[0] for name in FAST}


@pytest.mark.parametrize("kind", FAST)
@pytest.mark.parametrize(
    "case",
    ["self", "causal", "padding", "causal+padding", "cross", "cross+padding", "gqa", "mqa", "cached-step", "chunk",
     "position-bias", "gqa+dead-rows"],
)
def test_every_kind_equals_reference(case, kind):
    keep = torch.ones(B, 6, dtype=torch.long)
    keep[1, 4:] = 0
    tq, tk, kv_heads, causal, pad, bias = 6, 6, H, False, None, None
    if case == "causal":
        causal = True
    elif case == "padding":
        pad = keep
    elif case == "causal+padding":
        causal, pad = True, keep
    elif case == "cross":
        tq, tk = 3, 6
    elif case == "cross+padding":
        tq, tk, pad = 3, 6, keep
    elif case == "gqa":
        kv_heads, causal = 2, True
    elif case == "mqa":
        kv_heads, causal = 1, True
    elif case == "cached-step":  # one new query against 6 cached keys
        tq, causal = 1, True
    elif case == "chunk":  # 3 new queries after 3 cached keys: the causal mask must be offset
        tq, causal = 3, True
    elif case == "position-bias":  # an additive (1, H, Tq, Tk) bias, as ALiBi and T5 add, plus padding
        causal, pad, bias = True, keep, torch.randn(1, H, tq, tk)
    elif case == "gqa+dead-rows":  # left padding in a causal batch: row 1's first two queries see nothing
        kv_heads, causal, pad = 2, True, keep.flip(-1)
    q, k, v = _qkv(tq, tk, kv_heads)
    mask = build_mask(tq, tk, causal=causal, key_padding=pad, position_bias=bias)
    assert (mask.dead_rows is not None) == (case == "gqa+dead-rows")
    ref, weights, others = _all(q, k, v, mask)
    fast = others[kind]
    assert fast.shape == ref.shape == (B, H, tq, D)
    assert torch.allclose(ref, fast, atol=1e-6, rtol=0), (ref - fast).abs().max()
    live = torch.ones(B, H, tq) if mask.dead_rows is None else (~mask.dead_rows[..., 0]).float().expand(B, H, tq)
    assert torch.allclose(weights.sum(-1), live, atol=1e-6)


def test_reference_weights_follow_the_definition():
    """softmax(QK^T / sqrt(d)) V computed independently, one head at a time, with plain loops."""
    q, k, v = _qkv(4, 5)
    out, weights = reference(q, k, v, build_mask(4, 5, causal=False), 1 / math.sqrt(D))
    for b in range(B):
        for h in range(H):
            for i in range(4):
                scores = torch.tensor([float(q[b, h, i] @ k[b, h, j]) / math.sqrt(D) for j in range(5)])
                w = torch.exp(scores - scores.max())
                w = w / w.sum()
                assert torch.allclose(weights[b, h, i], w, atol=1e-6)
                assert torch.allclose(out[b, h, i], (w[:, None] * v[b, h]).sum(0), atol=1e-5)



@pytest.mark.parametrize("case", ["causal", "position-bias", "unscaled"])
def test_reference_gradients_equal_sdpa_math(case):
    """The reference scales and masks its scores in place: the gradients of q, k, v (and of a learned
    position bias, as T5's and ALiBi's) must still equal PyTorch's own math kernel's."""
    torch.manual_seed(3)
    q, k, v = _qkv(5, 7)
    bias = torch.randn(1, H, 5, 7) if case == "position-bias" else None
    scale = 1.0 if case == "unscaled" else 1 / math.sqrt(D)
    grads = []
    for fn in ("reference", "math"):
        leaves = [t.clone().requires_grad_() for t in (q, k, v)] + ([bias.clone().requires_grad_()] if bias is not None else [])
        qq, kk, vv = leaves[:3]
        if fn == "reference":
            mask = build_mask(5, 7, causal=case != "position-bias", position_bias=leaves[3] if bias is not None else None)
            out = reference(qq, kk, vv, mask, scale)[0]
        else:
            allowed = torch.ones(5, 7, dtype=torch.bool).tril(diagonal=2)
            attn_bias = leaves[3] if bias is not None else torch.zeros(5, 7).masked_fill(~allowed, float("-inf"))
            with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
                out = F.scaled_dot_product_attention(qq, kk, vv, attn_mask=attn_bias, scale=scale)
        (out * torch.linspace(-1, 1, out.numel()).view_as(out)).sum().backward()
        grads.append([t.grad for t in leaves])
    for ours, theirs in zip(*grads):
        assert torch.allclose(ours, theirs, atol=1e-5, rtol=0), (ours - theirs).abs().max()

def test_causal_mask_hides_the_future():
    q, k, v = _qkv(5, 5)
    _, weights, _ = _all(q, k, v, build_mask(5, 5, causal=True))
    future = torch.triu(torch.ones(5, 5, dtype=torch.bool), diagonal=1)
    assert weights[..., future].abs().max() == 0


def test_fully_masked_rows_give_zeros_not_nan_in_every_kind_and_backward():
    # Left padding in a causal batch: the first query of row 1 can see only padding.
    keep = torch.tensor([[1, 1, 1, 1], [0, 0, 1, 1]])
    mask = build_mask(4, 4, causal=True, key_padding=keep)
    q, k, v = (t.requires_grad_() for t in _qkv(4, 4))
    ref, weights, others = _all(q, k, v, mask)
    outs = [ref, *others.values()]
    for out in outs:
        assert not torch.isnan(out).any()
        assert out[1, :, :2].abs().max() == 0  # the two padding queries attend nothing -> zero output
    assert weights[1, :, :2].abs().max() == 0
    sum(out.sum() for out in outs).backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def test_padding_keys_get_zero_weight():
    keep = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]])
    q, k, v = _qkv(6, 6)
    _, weights, _ = _all(q, k, v, build_mask(6, 6, causal=False, key_padding=keep))
    assert weights[1, :, :, 3:].abs().max() == 0


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "rope", "alibi", "relative"])
@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder-decoder"])
@pytest.mark.parametrize("kind", FAST)
def test_model_outputs_equal_under_every_kind(arch, position, kind):
    config = ModelConfig(arch=arch, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=50,
                         max_positions=32, position=position, lm_head=True,
                         decoder_start_token_id=0 if arch == "encoder-decoder" else None)
    model = build(config.replace(attn_impl=kind)).eval()
    ids = torch.randint(0, 50, (2, 9))
    keep = torch.ones(2, 9, dtype=torch.long)
    keep[1, 6:] = 0
    kwargs = dict(attention_mask=keep)
    if arch == "encoder-decoder":
        kwargs["decoder_input_ids"] = ids[:, :5]
    with torch.no_grad():
        fast = model(ids, **kwargs).logits
        ref = with_attention(model, "reference")(ids, **kwargs).logits
    valid = keep.bool() if arch != "encoder-decoder" else torch.ones(2, 5, dtype=torch.bool)
    assert torch.allclose(fast[valid], ref[valid], atol=1e-5, rtol=0)


def test_output_attentions_returns_one_distribution_per_query():
    model = build(ModelConfig(n_layers=2, d_model=32, n_heads=4, d_ff=64, vocab_size=50)).eval()
    out = model(torch.randint(0, 50, (1, 7)), output_attentions=True)
    assert len(out.attentions) == 2
    assert out.attentions[0].shape == (1, 4, 7, 7)
    assert torch.allclose(out.attentions[1].sum(-1), torch.ones(1, 4, 7), atol=1e-6)


@pytest.mark.parametrize("shape", [(3, 16), (2, 5, 64), (4, 3, 2, 33)])
def test_hand_layer_norm_equals_f_layer_norm(shape):
    norm = LayerNorm(shape[-1], eps=1e-5)
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(shape) * 3 + 1
    assert torch.allclose(norm.forward_reference(x), norm(x), atol=1e-6, rtol=0)
    assert torch.allclose(layer_norm_reference(x, norm.weight, norm.bias, 1e-5),
                          F.layer_norm(x, (shape[-1],), norm.weight, norm.bias, 1e-5), atol=1e-6, rtol=0)


def test_rms_norm_matches_its_definition_and_torch():
    norm = RMSNorm(24, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(5, 24)
    by_hand = x / torch.sqrt((x**2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    assert torch.allclose(norm(x), by_hand, atol=1e-6)
    assert torch.allclose(norm(x), F.rms_norm(x, (24,), norm.weight, 1e-6), atol=1e-6)
