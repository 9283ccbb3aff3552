"""The approximate attention kinds (issue 15): linear attention, Performer, Linformer and Reformer's LSH,
each against its formula written out densely, with padding, causality and decoding."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tformer.core.config import ModelConfig
from tformer.cost.ledger import Workload
from tformer.generate import generate
from tformer.measure.step import StepRunner
from tformer.model import build
from tformer.model.attention import make_attention
from tformer.model.attention.performer import orthogonal_features
from tformer.model.masks import build_mask

SCALE = 1 / math.sqrt(8)


def _kind(name, causal=True, **kw):
    config = ModelConfig(arch="decoder" if causal else "encoder", n_layers=1, d_model=32, n_heads=4, d_ff=8,
                         max_positions=64, attn_impl=name, lm_head=causal, **kw)
    return make_attention(config.attention_options(0), 4, 8)


def _qkv(B=2, H=4, T=10, D=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(3))


def _dense_kernel(qf, kf, v, allowed):
    """out_i = sum_j a_ij v_j / sum_j a_ij with a_ij = phi(q_i)·phi(k_j) over allowed pairs: O(n²), explicit."""
    a = (qf @ kf.transpose(-2, -1)) * allowed
    den = a.sum(-1, keepdim=True)
    return (a @ v) / torch.where(den > 0, den, torch.ones_like(den))


def _allowed(mask):
    allowed = mask.allowed()
    return torch.ones(1, 1, mask.tq, mask.tk, dtype=torch.float64) if allowed is None else allowed.double()


def _phi(kind, q, k):
    if hasattr(kind, "features"):  # Performer: the layer's own feature maps
        return kind.query_features(q, SCALE), kind.key_features(k, SCALE, None)[0]
    return F.elu(q) + 1, F.elu(k) + 1


# Linear attention and Performer: the O(n) forms equal the O(n²) formula -------------------------------
@pytest.mark.parametrize("name", ["linear", "performer"])
@pytest.mark.parametrize("block", [1, 3, 4, 64])
@pytest.mark.parametrize("padded", [False, True])
def test_causal_prefix_sums_equal_the_explicit_formula(name, block, padded):
    kind = _kind(name, attn_block=block, attn_features=16).double()
    q, k, v = _qkv()
    keep = torch.ones(2, 10, dtype=torch.long)
    if padded:
        keep[0, :3] = 0  # left padding: the first queries of row 0 have no key at all
    mask = build_mask(10, 10, causal=True, key_padding=keep)
    out, weights = kind(q, k, v, mask, SCALE)
    qf, kf = _phi(kind, q, k)
    expected = _dense_kernel(qf, kf, v, _allowed(mask))
    assert weights is None and torch.isfinite(out).all()
    assert torch.allclose(out, expected, atol=1e-5, rtol=0)
    if padded:
        assert (out[0, :, :3] == 0).all()  # dead rows: zero, never NaN


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_bidirectional_form_equals_the_explicit_formula_and_padding_adds_nothing(name):
    kind = _kind(name, causal=False, attn_features=16).double()
    q, k, v = _qkv()
    keep = torch.ones(2, 10, dtype=torch.long)
    keep[1, 7:] = 0
    mask = build_mask(10, 10, causal=False, key_padding=keep)
    out, _ = kind(q, k, v, mask, SCALE)
    qf, kf = _phi(kind, q, k)
    assert torch.allclose(out, _dense_kernel(qf, kf, v, _allowed(mask)), atol=1e-5, rtol=0)
    # Row 1 with its padded keys equals row 1 with those keys cut off.
    alone, _ = kind(q[1:], k[1:, :, :7], v[1:, :, :7], build_mask(10, 7, causal=False), SCALE)
    assert torch.allclose(out[1:], alone, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_recurrent_steps_equal_the_causal_forward(name):
    kind = _kind(name, attn_block=4, attn_features=16).double()
    q, k, v = _qkv(T=12)
    full, _ = kind(q, k, v, build_mask(12, 12, causal=True), SCALE)
    out, state = kind.step(q[..., :5, :], k[..., :5, :], v[..., :5, :], None, build_mask(5, 5, causal=True), SCALE)
    outs = [out]
    for t in range(5, 12):
        sizes = [tuple(s.shape) for s in state]
        out, state = kind.step(q[..., t:t + 1, :], k[..., t:t + 1, :], v[..., t:t + 1, :], state,
                               build_mask(1, t + 1, causal=True), SCALE)
        assert [tuple(s.shape) for s in state] == sizes  # O(1): the state never grows
        outs.append(out)
    assert torch.allclose(torch.cat(outs, dim=-2), full, atol=1e-5, rtol=0)
    m = 16 if name == "performer" else 8
    assert tuple(state[0].shape) == (2, 4, m, 8) and tuple(state[1].shape) == (2, 4, m)
    # Queries after cached keys, without a state (Tq < Tk): the same answer.
    tail, _ = kind(q[..., 9:, :], k, v, build_mask(3, 12, causal=True), SCALE)
    assert torch.allclose(tail, full[..., 9:, :], atol=1e-5, rtol=0)


def _decoder(name, **kw):
    return ModelConfig(arch="decoder", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=40,
                       max_positions=64, position="rope", attn_impl=name, attn_block=4, attn_features=16, **kw)


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_prefill_and_steps_with_the_state_equal_the_full_forward(name):
    torch.manual_seed(0)
    model = build(_decoder(name)).eval()
    ids = torch.randint(0, 40, (2, 14))
    with torch.no_grad():
        full = model(ids).logits
        cache = model.new_cache()
        logits = [model(ids[:, :6], past_key_values=cache).logits]
        after_prefill = cache.nbytes
        for t in range(6, 14):
            logits.append(model(ids[:, t:t + 1], past_key_values=cache).logits)
    assert torch.allclose(torch.cat(logits, dim=1), full, atol=1e-5, rtol=0)
    assert cache.length == 14 and cache.nbytes == after_prefill  # a fixed-size state, not keys


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_greedy_generation_with_the_state_equals_generation_without_a_cache(name):
    torch.manual_seed(1)
    model = build(_decoder(name)).eval()
    prompts = [[5, 6, 7, 8, 9], [3, 4]]  # left-padded: padding keys must add nothing
    short = generate(model, prompts, max_new_tokens=4)
    cached = generate(model, prompts, max_new_tokens=12)
    uncached = generate(model, prompts, max_new_tokens=12, use_cache=False)
    assert cached.sequences == uncached.sequences
    assert cached.cache_bytes == short.cache_bytes > 0  # the state does not grow with length


@pytest.mark.parametrize("name", ["linear", "performer"])
def test_decode_timing_restores_a_recurrent_state_between_steps(name):
    # KVCache.rewind cannot forget a position of a summed state; the timed step puts the state back.
    runner = StepRunner(_decoder(name), Workload(phase="decode", batch=2, seq=8, context=5))
    kv = runner.cache.kv
    assert kv.recurrent and kv.length == 5
    before = [t.clone() for t in kv.tensors()]
    for _ in range(3):
        runner.step()
        assert kv.length == 5
        assert all(torch.equal(a, b) for a, b in zip(before, kv.tensors(), strict=True))
    with pytest.raises(ValueError, match="cannot forget"):
        kv.rewind(1)


# Performer: random features -----------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [False, True])
def test_performer_error_against_softmax_shrinks_as_features_grow(causal):
    D, scale = 16, 1 / 4
    errors = []
    for m in (16, 64, 256, 1024):
        per_seed = []
        for seed in range(4):  # averaged over draws, so one lucky draw cannot order the sizes
            config = ModelConfig(arch="encoder", n_layers=1, d_model=64, n_heads=4, d_ff=8, max_positions=64,
                                 attn_impl="performer", attn_features=m, attn_seed=seed)
            kind = make_attention(config.attention_options(0), 4, D).double()
            g = torch.Generator().manual_seed(100 + seed)
            q, k, v = (torch.randn(2, 4, 32, D, generator=g, dtype=torch.float64) for _ in range(3))
            q, k = q / 2, k / 2  # moderate logits: the regime the estimator is built for
            out, _ = kind(q, k, v, build_mask(32, 32, causal=causal), scale)
            exact = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
            per_seed.append((out - exact).abs().mean().item())
        errors.append(sum(per_seed) / len(per_seed))
    assert errors == sorted(errors, reverse=True) and errors[-1] < errors[0] / 3
    assert errors[-1] < 0.025


def test_performer_features_are_orthogonal_blocks_with_chi_lengths():
    g = torch.Generator().manual_seed(0)
    w = orthogonal_features(40, 16, g).double()
    directions = w / w.norm(dim=1, keepdim=True)
    for start in (0, 16, 32):  # three blocks: 16, 16 and the last cut to 8 rows
        block = directions[start:start + 16]
        assert torch.allclose(block @ block.T, torch.eye(len(block), dtype=torch.float64), atol=1e-6)
    assert not torch.allclose(directions[:16] @ directions[16:32].T, torch.zeros(16, 16, dtype=torch.float64),
                              atol=1e-3)  # blocks are independent draws, not one basis repeated
    lengths = orthogonal_features(4096, 16, g).norm(dim=1)
    assert abs((lengths ** 2).mean().item() - 16) < 0.8  # chi(16)²: mean 16, like a Gaussian row's
    assert lengths.std().item() > 0.3  # lengths vary (not all sqrt(16))


def test_performer_features_are_fixed_by_seed_and_layer_and_not_saved():
    config = _decoder("performer", attn_seed=3)
    a, b = build(config), build(config)
    wa = [m.features for m in a.modules() if hasattr(m, "features") and isinstance(m.features, torch.Tensor)]
    wb = [m.features for m in b.modules() if hasattr(m, "features") and isinstance(m.features, torch.Tensor)]
    assert len(wa) == 2 and all(torch.equal(x, y) for x, y in zip(wa, wb, strict=True))
    assert not torch.equal(wa[0], wa[1])  # each layer draws its own
    other = [m.features for m in build(config.replace(attn_seed=4)).modules() if type(m).__name__ == "Performer"]
    assert not torch.equal(wa[0], other[0])
    assert not any("features" in name for name in a.state_dict())


# Linformer --------------------------------------------------------------------------------------------
def _encoder(name, **kw):
    return ModelConfig(arch="encoder", n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=40,
                       max_positions=24, attn_impl=name, attn_proj=6, lm_head=True, **kw)


def test_linformer_equals_its_formula_and_right_padding_equals_cut_keys():
    kind = _kind("linformer", causal=False, attn_proj=5).double()
    q, k, v = _qkv()
    keep = torch.ones(2, 10, dtype=torch.long)
    keep[1, 6:] = 0
    out, weights = kind(q, k, v, build_mask(10, 10, causal=False, key_padding=keep), SCALE)
    E, Fm = kind.E[:, :10], kind.F[:, :10]
    kz, vz = k * keep[:, None, :, None], v * keep[:, None, :, None]
    expected = torch.softmax(q @ (E @ kz).transpose(-2, -1) * SCALE, dim=-1) @ (Fm @ vz)
    assert weights is None and torch.allclose(out, expected, atol=1e-10, rtol=0)
    cut, _ = kind(q[1:], k[1:, :, :6], v[1:, :, :6], build_mask(10, 6, causal=False), SCALE)
    assert torch.allclose(out[1:], cut, atol=1e-10, rtol=0)
    dead, _ = kind(q, k, v, build_mask(10, 10, causal=False, key_padding=torch.zeros(2, 10)), SCALE)
    assert (dead == 0).all()


def test_linformer_parameters_are_in_the_state_dict_and_the_description():
    from tformer.cost.architecture import describe
    from tformer.cost.ledger import ledger

    config = _encoder("linformer")
    model = build(config)
    names = dict(model.named_parameters())
    assert names["encoder.layers.0.attn.attend.E"].shape == (6, 24)
    assert "encoder.layers.1.attn.attend.F" in model.state_dict()
    assert list(describe(config).parameters().items()) == [(n, tuple(p.shape)) for n, p in names.items()]
    owners = {op.name for op in ledger(config, Workload(seq=8)).ops if op.params}
    assert "encoder.layers.0.attn.attend" in owners and owners <= {n.rsplit(".", 1)[0] for n in names}
    bound = 1 / math.sqrt(24)
    E = names["encoder.layers.0.attn.attend.E"]
    assert E.abs().max() <= bound and E.std() > bound / 3  # initialised, not left empty


def test_linformer_is_refused_in_a_decoder_and_past_its_projection_length():
    from tformer.core.errors import TformerError

    with pytest.raises(TformerError, match="cannot be causal"):
        _decoder("linformer")
    model = build(_encoder("linformer", position="rope")).eval()
    with pytest.raises(TformerError, match="max_positions=24"):
        model(torch.randint(0, 40, (1, 30)))
    model(torch.randint(0, 40, (1, 24)))  # up to n_max is fine


def test_linformer_trains_its_projections():
    model = build(_encoder("linformer"))
    out = model(torch.randint(0, 40, (2, 12)))
    out.logits.sum().backward()
    grad = model.encoder.layers[0].attn.attend.E.grad
    assert grad is not None and grad[:, :12].abs().sum() > 0 and (grad[:, 12:] == 0).all()


# Reformer's LSH ------------------------------------------------------------------------------------------
def _lsh(causal, block, hashes=3, seed=0):
    return _kind("lsh", causal=causal, attn_block=block, attn_hashes=hashes, attn_seed=seed).double()


def _masked_softmax(scores, count, allowed, v):
    """softmax over the (round, key) pairs met: exp(s_ij) counted count_ij times; no key -> 0."""
    allowed = allowed & (count > 0)
    scores = (scores + count.clamp(min=1).log()).masked_fill(~allowed, float("-inf"))
    dead = ~allowed.any(-1, keepdim=True)
    return torch.softmax(scores.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0) @ v


@pytest.mark.parametrize("causal", [False, True])
def test_lsh_with_one_chunk_is_exact_attention(causal):
    kind = _lsh(causal, block=16)  # block >= n: one chunk, every key in reach
    q, k, v = _qkv(T=13)
    keep = torch.ones(2, 13, dtype=torch.long)
    keep[0, :4] = 0
    mask = build_mask(13, 13, causal=causal, key_padding=keep)
    out, _ = kind(q, k, v, mask, SCALE)
    allowed = mask.allowed()
    scores = (q @ k.transpose(-2, -1) * SCALE).masked_fill(~allowed, float("-inf"))
    dead = ~allowed.any(-1, keepdim=True)
    exact = torch.softmax(scores.masked_fill(dead, 0.0), -1).masked_fill(dead, 0.0) @ v
    assert torch.allclose(out, exact, atol=1e-10, rtol=0) and torch.isfinite(out).all()


def _chunk_of(buckets, block):
    """(B, H, T) buckets -> each position's chunk in the order sorted by (bucket, position)."""
    T = buckets.shape[-1]
    order = (buckets * T + torch.arange(T)).argsort(-1)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(T).expand_as(order))
    return rank // block


@pytest.mark.parametrize("causal", [False, True])
def test_lsh_with_many_buckets_equals_dense_attention_over_the_same_pattern(causal):
    T, block, hashes = 37, 4, 3
    kind = _lsh(causal, block=block, hashes=hashes)
    q, k, v = _qkv(T=T)
    keep = torch.ones(2, T, dtype=torch.long)
    keep[1, -5:] = 0
    mask = build_mask(T, T, causal=causal, key_padding=keep)
    out, _ = kind(q, k, v, mask, SCALE)
    # The pattern, rebuilt from the rotations: angular LSH, sort, chunk, own and previous chunk.
    n_buckets = 2 * math.ceil(math.ceil(T / block) / 2)
    rotations = kind.rotations[:, :, : n_buckets // 2]
    count = torch.zeros(2, 4, T, T, dtype=torch.float64)
    def bucket(x, r):
        y = F.normalize(x, dim=-1) @ rotations[r]
        return torch.cat([y, -y], -1).argmax(-1)

    for r in range(hashes):
        cq, ck = _chunk_of(bucket(q, r), block), _chunk_of(bucket(k, r), block)
        gap = cq[..., :, None] - ck[..., None, :]
        count += ((gap == 0) | (gap == 1)).double()
    eye = torch.eye(T, dtype=torch.bool)
    count = torch.where(eye, float(hashes), count)  # own key: once per round; never from a chunk as well
    expected = _masked_softmax(q @ k.transpose(-2, -1) * SCALE, count, mask.allowed(), v)
    assert torch.allclose(out, expected, atol=1e-10, rtol=0)
    assert (count[..., ~eye] == 0).float().mean() > 0.5  # the pattern is sparse: most pairs never meet


def test_lsh_is_fixed_by_its_seed_and_never_reads_padding():
    q, k, v = _qkv(T=30)
    mask = build_mask(30, 30, causal=False, key_padding=torch.ones(2, 30).index_fill(1, torch.arange(25, 30), 0))
    a, _ = _lsh(False, block=4, seed=1)(q, k, v, mask, SCALE)
    b, _ = _lsh(False, block=4, seed=1)(q, k, v, mask, SCALE)
    c, _ = _lsh(False, block=4, seed=2)(q, k, v, mask, SCALE)
    assert torch.equal(a, b) and not torch.allclose(a, c)
    v2 = v.clone()
    v2[:, :, 25:] = 1e6  # padded values: never reached
    d, _ = _lsh(False, block=4, seed=1)(q, k, v2, mask, SCALE)
    assert torch.equal(a, d)


def test_lsh_decoder_trains_and_generates_with_a_kv_cache():
    torch.manual_seed(2)
    model = build(_decoder("lsh", attn_hashes=2))
    model(torch.randint(0, 40, (2, 20))).logits.sum().backward()
    assert model.decoder.layers[0].attn.q_proj.weight.grad.abs().sum() > 0
    out = generate(model.eval(), [[5, 6, 7, 8, 9], [3, 4]], max_new_tokens=6)
    assert [len(s) for s in out.sequences] == [6, 6] and out.cache_bytes > 0
    # The step rule: a new query meets the cached keys of its buckets (and itself), nothing after it.
    kind = _lsh(True, block=4, hashes=2)
    q, k, v = _qkv(T=12)
    step, _ = kind(q[..., -1:, :], k, v, build_mask(1, 12, causal=True), SCALE)
    hq, hk = kind.buckets(q[..., -1:, :], 12), kind.buckets(k, 12)
    count = (hq[:, :, :, None, :] == hk[:, :, None, :, :]).sum(-1).double()
    count[..., -1] = 2
    assert torch.allclose(step, _masked_softmax(q[..., -1:, :] @ k.transpose(-2, -1) * SCALE, count,
                                                torch.ones(1, 12, dtype=torch.bool), v), atol=1e-10, rtol=0)
