"""The sparse kinds (strided, longformer, bigbird) equal dense attention under the same pattern written out as an
explicit boolean mask, built here from each pattern's definition, in outputs and in q/k/v gradients."""

import math

import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.core.sparse_layout import global_blocks, sparse_geometry
from tformer.model import build
from tformer.model.attention import MultiHeadAttention, make_attention
from tformer.model.masks import build_mask

B, H, D = 2, 4, 8
SCALE = 1 / math.sqrt(D)


def _options(kind, layer=0, **kw):
    fields = {"arch": "decoder", "n_layers": 2, "d_model": H * D, "n_heads": H, "max_positions": 64, "attn_impl": kind,
              "attn_window": 4, "attn_block": 4, "attn_random": 2}
    fields.update(kw)
    return ModelConfig(**fields).attention_options(layer)


# The patterns, from their definitions: may query position i see key position j? ---------------------------------
def _strided(o, i, j, causal):
    w = o.window
    return abs(i - j) < w or (i - j) % w == 0


def _longformer(o, i, j, causal):
    w, d, g = o.window, o.dilation, o.global_tokens
    if i < g or j < g:
        return True
    if (i - j) % d:
        return False
    return i - j <= (w - 1) * d if causal else abs(i - j) <= (w // 2) * d


def _bigbird_mask(kind, o, tk, causal):
    """BigBird at block level: the window blocks, the global blocks (rows and columns) and the random blocks the
    kind drew (read from it: they are random; their own properties are tested below)."""
    b, n_global = o.block, global_blocks(o)
    geo = sparse_geometry(o, tk, tk, 0, causal)
    allowed = torch.zeros(tk, tk, dtype=torch.bool)
    for i in range(tk):
        for j in range(tk):
            bi, bj = i // b, j // b
            window = bj in (bi - 1, bi) or (not causal and bj == bi + 1)
            allowed[i, j] = window or bi < n_global or bj < n_global or bj in kind.extra_blocks(bi, geo, causal)
    return allowed


def _pattern(kind, o, tk, causal):
    if o.kind == "bigbird":
        return _bigbird_mask(kind, o, tk, causal)
    rule = {"strided": _strided, "longformer": _longformer}[o.kind]
    return torch.tensor([[rule(o, i, j, causal) for j in range(tk)] for i in range(tk)])


def _dense(q, k, v, allowed):
    """softmax over the allowed keys; a row with none gives 0. allowed (B|1, 1, Tq, Tk)."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    scores = (q @ k.transpose(-2, -1) * SCALE).masked_fill(~allowed, float("-inf"))
    dead = ~allowed.any(-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0)
    return weights @ v


def _compare(o, tk, causal, tq=None, kv_heads=H, keep=None):
    tq = tq or tk
    torch.manual_seed(0)
    q = torch.randn(B, H, tq, D, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(B, kv_heads, tk, D, dtype=torch.float64, requires_grad=True) for _ in range(2))
    kind = make_attention(o, H, D)
    mask = build_mask(tq, tk, causal=causal, key_padding=keep, dtype=torch.float64)
    allowed = _pattern(kind, o, tk, causal)[tk - tq:]
    if causal:
        allowed &= torch.ones(tk, tk, dtype=torch.bool).tril()[tk - tq:]
    allowed = allowed[None, None] & (keep.bool()[:, None, None, :] if keep is not None else True)
    out = kind(q, k, v, mask, SCALE, 0.0)[0]
    want = _dense(q, k, v, allowed)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, want, atol=1e-5, rtol=0)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (q, k, v), grad)
    ref = torch.autograd.grad(want, (q, k, v), grad)
    for a, r in zip(got, ref):
        assert torch.isfinite(a).all() and torch.allclose(a, r, atol=1e-5, rtol=0)
    return out, allowed


KINDS = ["strided", "longformer", "bigbird"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n", [16, 19])  # a whole number of blocks, and not
def test_kind_equals_dense_attention_with_its_mask(kind, causal, n):
    _compare(_options(kind, attn_global=0), n, causal)


@pytest.mark.parametrize("kind", ["longformer", "bigbird"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("g", [1, 6])  # bigbird: 6 tokens round up to 2 global blocks
def test_global_tokens(kind, causal, g):
    _compare(_options(kind, attn_global=g), 21, causal)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("dilation", [1, 2])
def test_longformer_dilation(causal, dilation):
    _compare(_options("longformer", attn_dilation=dilation, attn_global=2, attn_window=3), 22, causal)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("causal", [True, False])
def test_padding_and_a_dead_row_and_gqa(kind, causal):
    keep = torch.ones(B, 18, dtype=torch.long)
    keep[0, :5] = 0  # left padding: under causality query 0 of row 0 sees nothing (a dead row)
    if not causal:
        keep[0] = 0  # bidirectional, a global or strided key always reaches a real one: pad the whole row
    keep[1, 3:] = 0  # right padding: the queries far past the real keys lose their whole window
    out, allowed = _compare(_options(kind, attn_global=1 if kind != "strided" else 0), 18, causal, kv_heads=2,
                            keep=keep)
    dead = ~allowed.any(-1)
    assert dead.any() and (out.masked_select(dead[..., None].expand_as(out)) == 0).all()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("tq", [1, 5])
def test_cached_decode_queries_are_the_last_positions(kind, tq):
    _compare(_options(kind, attn_global=2), 23, True, tq=tq, kv_heads=1)


def test_per_layer_dilation_differs_between_layers():
    config = ModelConfig(arch="decoder", n_layers=2, d_model=H * D, n_heads=H, max_positions=64, vocab_size=20,
                         attn_impl="longformer", attn_window=3, attn_dilation=[1, 2], attn_block=4)
    model = build(config)
    layers = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert [m.attend.options.dilation for m in layers] == [1, 2]
    for m in layers:  # each layer equals dense attention with its own dilation's mask
        _compare(m.attend.options, 20, True)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, H, 20, D) for _ in range(3))
    mask = build_mask(20, 20, causal=True)
    assert not torch.allclose(layers[0].attend(q, k, v, mask, SCALE)[0], layers[1].attend(q, k, v, mask, SCALE)[0])


def test_bigbird_random_blocks_are_fixed_reproducible_and_causal_ones_from_the_past():
    geo = sparse_geometry(_options("bigbird"), 64, 64, 0, True)
    first, again = make_attention(_options("bigbird", attn_random=2), H, D), make_attention(_options("bigbird"), H, D)
    other_layer = make_attention(_options("bigbird", layer=1), H, D)
    draws = [first.extra_blocks(c, geo, True) for c in range(16)]
    assert draws == [again.extra_blocks(c, geo, True) for c in range(16)]
    assert draws != [other_layer.extra_blocks(c, geo, True) for c in range(16)]
    for c, picks in enumerate(draws):
        real = [j for j in picks if j >= 0]
        assert len(real) == min(2, max(0, c - 1)) and all(j < c - 1 for j in real)
        assert len(set(real)) == len(real)
    bidirectional = [first.extra_blocks(c, geo, False) for c in range(16)]
    assert ModelConfig(attn_impl="bigbird").attn_window is None  # its window is blocks: no attn_window needed
    assert all(len(p) == 2 and all(j not in (c - 1, c, c + 1) for j in p) for c, p in enumerate(bidirectional))


# Whole models ---------------------------------------------------------------------------------------------------
def _model(kind, arch, **kw):
    fields = {"arch": arch, "n_layers": 2, "d_model": 32, "n_heads": 4, "n_kv_heads": 2, "d_ff": 32,
              "vocab_size": 30, "max_positions": 64, "attn_impl": kind, "attn_window": 4, "attn_block": 4,
              "attn_random": 1, "attn_global": 2, "position": "rope", "lm_head": True}
    fields.update(kw)
    return build(ModelConfig(**fields))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("arch", ["decoder", "encoder"])
def test_tiny_model_trains_one_step(kind, arch):
    torch.manual_seed(0)
    model = _model(kind, arch, attn_dilation=[1, 2]).train()
    ids = torch.randint(0, 30, (2, 27))
    mask = torch.ones_like(ids)
    mask[1, -5:] = 0
    logits = model(ids, attention_mask=mask).logits
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten())
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    torch.optim.SGD(model.parameters(), lr=0.1).step()


@pytest.mark.parametrize("kind", KINDS)
def test_decoding_with_the_kv_cache_equals_the_full_forward(kind):
    torch.manual_seed(0)
    model = _model(kind, "decoder").eval()
    ids = torch.randint(0, 30, (2, 26))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache()
        steps = [model(ids[:, :9], past_key_values=cache).logits]
        steps += [model(ids[:, t:t + 1], past_key_values=cache).logits for t in range(9, 26)]
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-5)
