"""Sliding-window attention ("sliding") equals dense attention with the explicit window mask, built here
from the definition (Hugging Face's: causal i - w < j <= i, bidirectional |i - j| <= w; dilation d keeps
the keys a multiple of d away), in outputs and gradients; and a sliding decoder decodes with a rolling
KV cache whose memory stays at the window."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.model import build, runner_for
from tformer.model.attention import attention_fn
from tformer.model.attention.sliding import SlidingAttention, sliding_attention
from tformer.model.masks import build_mask


def window_mask(tq, tk, q_start, k_start, w, d, causal):
    """(Tq, Tk) bool from the definition, position by position."""
    out = torch.zeros(tq, tk, dtype=torch.bool)
    for a in range(tq):
        for b in range(tk):
            i, j = q_start + a, k_start + b
            if (i - j) % d:
                continue
            steps = (i - j) // d
            out[a, b] = 0 <= steps < w if causal else abs(steps) <= w
    return out


def dense(q, k, v, allowed, scale):
    """SDPA with a boolean mask; a row with no allowed key gives 0."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    dead = ~allowed.any(-1, keepdim=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed | dead, scale=scale)
    return out.masked_fill(dead, 0.0)


CASES = [  # causal, dilation, Tq, Tk, k_start, padded, window
    (True, 1, 13, 13, 0, False, 4), (True, 1, 13, 13, 0, True, 4), (True, 2, 17, 17, 0, True, 4),
    (True, 3, 13, 13, 0, False, 4), (False, 1, 13, 13, 0, False, 4), (False, 1, 11, 11, 0, True, 4),
    (False, 2, 13, 13, 0, True, 4), (False, 3, 14, 14, 0, False, 4),
    (True, 1, 1, 9, 0, True, 4), (True, 2, 3, 11, 0, False, 4),  # cached decode: the last Tq of Tk positions
    (True, 1, 1, 5, 7, False, 4), (True, 3, 2, 9, 4, True, 4),  # a rolling cache: keys start at position k_start
    (True, 1, 9, 9, 0, True, 40), (False, 2, 9, 9, 0, False, 40),  # a window wider than the sequence
]


@pytest.mark.parametrize("causal,d,tq,tk,k_start,padded,w", CASES)
def test_equals_dense_attention_with_the_window_mask(causal, d, tq, tk, k_start, padded, w):
    torch.manual_seed(0)
    B, H, Hkv, D, scale = 2, 6, 2, 8, 0.35
    q = torch.randn(B, H, tq, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, Hkv, tk, D, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, Hkv, tk, D, dtype=torch.float64, requires_grad=True)
    keep = None
    if padded:  # row 1 loses its first keys: some of its queries see no key at all (dead rows)
        keep = torch.ones(B, tk, dtype=torch.long)
        keep[1, : min(tk - 1, 6)] = 0
    mask = build_mask(tq, tk, causal=causal, key_padding=keep, k_start=k_start, dtype=torch.float64)
    allowed = window_mask(tq, tk, mask.q_start, k_start, w, d, causal)[None, None]
    if keep is not None:
        allowed = allowed & keep.bool()[:, None, None, :]
    got, weights = sliding_attention(q, k, v, mask, scale, window=w, dilation=d)
    want = dense(q, k, v, allowed, scale)
    assert weights is None and not torch.isnan(got).any()
    assert (got - want).abs().max().item() < 1e-5
    grad = torch.randn_like(got)
    grads = [torch.autograd.grad((out * grad).sum(), (q, k, v)) for out in (got, want)]
    for a, b in zip(*grads):
        assert not torch.isnan(a).any() and (a - b).abs().max().item() < 1e-5
    if padded and causal and tq == tk:
        assert bool((got[1, :, :6] == 0).all())  # queries that see only padding: output 0


def test_registered_and_needs_a_window():
    assert attention_fn("sliding") is SlidingAttention
    with pytest.raises(TformerError, match="attn_window"):
        ModelConfig(arch="decoder", n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=20, attn_impl="sliding")


def _model(**kw):
    base = dict(arch="decoder", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=48, vocab_size=41,
                max_positions=96, position="rope", attn_impl="sliding", attn_window=4)
    torch.manual_seed(0)
    model = build(ModelConfig(**{**base, **kw})).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


@pytest.mark.parametrize("arch", ["decoder", "encoder"])
@pytest.mark.parametrize("dilation", [1, 2])
def test_model_equals_reference_attention_under_the_window_mask(arch, dilation):
    """A whole model: the same weights with the dense reference kind and the window as an explicit mask."""
    model = _model(arch=arch, attn_dilation=dilation, **({"position": "learned"} if arch == "encoder" else {}))
    dense_model = build(model.config.replace(attn_impl="reference")).eval()
    dense_model.load_state_dict(model.state_dict())
    causal = arch == "decoder"
    allowed = window_mask(15, 15, 0, 0, 4, dilation, causal)
    for layer in dense_model.modules():
        if type(layer).__name__ == "FunctionKind":
            fn = layer.fn
            layer.fn = lambda q, k, v, m, s, p, fn=fn: fn(q, k, v, build_mask(
                m.tq, m.tk, causal=False, position_bias=torch.zeros(m.tq, m.tk).masked_fill(~allowed, float("-inf"))),
                s, p)
    ids = torch.randint(0, 41, (2, 15))
    with torch.no_grad():
        a, b = model(ids), dense_model(ids)
    t = "logits" if a.logits is not None else "last_hidden_state"
    assert (getattr(a, t) - getattr(b, t)).abs().max().item() < 1e-5


@pytest.mark.parametrize("arch", ["decoder", "encoder"])
@pytest.mark.parametrize("dilation", [1, 2])
def test_attention_maps_are_the_window_s_weights(arch, dilation):
    """output_attentions on a sliding layer: the weights of softmax over the window (zero outside the definition's
    mask, each row a distribution), and the outputs those weights give are the sliding kind's own."""
    model = _model(arch=arch, attn_dilation=dilation, **({"position": "learned"} if arch == "encoder" else {}))
    ids = torch.randint(0, 41, (2, 15))
    with torch.no_grad():
        plain, mapped = model(ids), model(ids, output_attentions=True)
    t = "logits" if plain.logits is not None else "last_hidden_state"
    assert (getattr(plain, t) - getattr(mapped, t)).abs().max().item() < 1e-5
    allowed = window_mask(15, 15, 0, 0, 4, dilation, arch == "decoder")
    for weights in mapped.attentions:
        assert weights.shape == (2, 4, 15, 15) and bool((weights[..., ~allowed] == 0).all())
        assert torch.allclose(weights.sum(-1), torch.ones(2, 4, 15))


@pytest.mark.parametrize("dilation", [1, 2])
def test_rolling_cache_greedy_decoding_equals_full_recompute(dilation):
    w = 4
    model = _model(attn_dilation=dilation)
    runner = runner_for(model)
    prompt = torch.randint(0, 41, (3, 6))
    span = (w - 1) * dilation + 1  # the positions one query's window covers: what the cache holds
    per_position = 2 * model.config.n_layers * 3 * model.config.n_kv_heads * model.config.head_dim * 4
    tokens = {}
    for kv in (True, False):
        cache = runner.new_cache(3, kv=kv)
        with torch.no_grad():
            logits = runner.prefill(cache, prompt)
            out = []
            for step in range(3 * w * dilation):
                out.append(logits.argmax(-1))
                logits = runner.step(cache, out[-1])
                if kv and step >= w:
                    assert cache.nbytes == span * per_position
                    assert cache.kv.held == span and cache.kv.start == cache.kv.length - span
        tokens[kv] = torch.stack(out, 1)
    assert torch.equal(tokens[True], tokens[False])


def test_rolling_cache_reorder_keeps_rows():
    model = _model()
    runner = runner_for(model)
    ids = torch.randint(0, 41, (3, 9))
    cache, single = runner.new_cache(3), runner.new_cache(1)
    with torch.no_grad():
        runner.prefill(cache, ids)
        runner.prefill(single, ids[2:3])
        cache.select(torch.tensor([2, 2]))
        step = torch.tensor([5, 5])
        a, b = runner.step(cache, step), runner.step(single, step[:1])
    assert torch.allclose(a, b.expand(2, -1), atol=1e-5)
