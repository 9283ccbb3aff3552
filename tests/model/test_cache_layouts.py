"""The KV cache holds one layout per layer (tformer.model.cache): each layout's row operations against plain tensor
slicing, a model whose layers keep different layouts against the model run without a cache, and the container's
operations applied to every layer at once."""

import pytest
import torch
import torch.nn.functional as F

from tformer.core.config import ModelConfig
from tformer.cost.attention_sliding import cache_positions
from tformer.model import build, runner_for
from tformer.model.cache import KVCache, layer_layout
from tformer.model.growing_cache import GrowingKV
from tformer.model.recurrent_state import RecurrentState
from tformer.model.rolling_cache import RollingKV

B, H, D = 3, 2, 4


def _kv(t, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, H, t, D, generator=g), torch.randn(B, H, t, D, generator=g)


def _fill(layout, pieces=(4, 1, 1, 2), seed=0):
    """Write ``pieces`` positions at a time into ``layout``; return every position written, (B, H, T, D) each."""
    ks, vs = [], []
    for i, t in enumerate(pieces):
        k, v = _kv(t, seed + i)
        layout.update(k, v)
        ks.append(k)
        vs.append(v)
    return torch.cat(ks, 2), torch.cat(vs, 2)


def _model(**kw):
    fields = {"arch": "decoder", "n_layers": 2, "d_model": 32, "n_heads": 4, "n_kv_heads": 2, "d_ff": 64,
              "vocab_size": 41, "max_positions": 64, "position": "rope", "tied_embeddings": False}
    fields.update(kw)
    torch.manual_seed(0)
    model = build(ModelConfig(**fields)).eval()
    with torch.no_grad():  # larger weights: logits that depend on every earlier token
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def _cached_logits(model, cache, ids, prompt):
    """Prefill ``prompt`` tokens into ``cache``, then one token at a time: every position's logits (B, T, V)."""
    with torch.no_grad():
        out = [model(ids[:, :prompt], past_key_values=cache).logits]
        out += [model(ids[:, t:t + 1], past_key_values=cache).logits for t in range(prompt, ids.shape[1])]
    return torch.cat(out, dim=1)


# One model, different layouts per layer -----------------------------------------------------------------
def test_a_rolling_layer_beside_a_growing_one_gives_the_uncached_logits():
    """Layer 0 keeps the window's last positions, layer 1 every position: their keys start at different
    positions, and each layer's mask must say its own (one shared start would shift layer 1's keys)."""
    model = _model(attn_impl="sliding", attn_window=3)
    ids = torch.randint(0, 41, (2, 14), generator=torch.Generator().manual_seed(1))
    cache = KVCache([RollingKV.for_window(3), GrowingKV()])
    got = _cached_logits(model, cache, ids, prompt=5)
    with torch.no_grad():
        want = model(ids).logits
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    assert cache.starts == (14 - 3, 0) and cache.layers[0].held == 3 and cache.layers[1].held == 14


def test_per_layer_dilations_give_per_layer_spans_and_the_uncached_logits():
    model = _model(attn_impl="sliding", attn_window=3, attn_dilation=[1, 3])
    cache = model.new_cache()
    spans = [cache_positions(3, 1), cache_positions(3, 3)]
    assert [type(layout) for layout in cache.layers] == [RollingKV, RollingKV]
    assert [layout.span for layout in cache.layers] == spans  # 3 and 7: each layer's own reach
    ids = torch.randint(0, 41, (2, 16), generator=torch.Generator().manual_seed(2))
    got = _cached_logits(model, cache, ids, prompt=4)
    with torch.no_grad():
        want = model(ids).logits
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    per_position = 2 * 2 * model.config.n_kv_heads * model.config.head_dim * 4  # k and v, 2 rows, fp32
    assert cache.nbytes == sum(spans) * per_position


@pytest.mark.parametrize("settings, layout", [
    ({"attn_impl": "sdpa"}, GrowingKV),
    ({"attn_impl": "sliding", "attn_window": 4}, RollingKV),
    ({"attn_impl": "linear", "attn_block": 4}, RecurrentState),
    ({"attn_impl": "performer", "attn_block": 4, "attn_features": 8}, RecurrentState),
])
def test_each_layer_gets_the_layout_its_attention_needs(settings, layout):
    config = _model(**settings).config
    chosen = layer_layout(config, 1, reserve=9)
    assert type(chosen) is layout
    assert getattr(chosen, "reserve", 9) == 9  # only the growing layout reserves


# Each layout's row operations against plain slicing ---------------------------------------------------------
@pytest.mark.parametrize("reserve", [0, 5, 32])
def test_growing_select_rewind_and_writes_equal_slicing(reserve):
    layout = GrowingKV(reserve)
    k, v = _fill(layout)
    index = torch.tensor([2, 0, 2])
    layout.select(index)
    layout.rewind(3)
    new_k, new_v = _kv(2, 9)
    got_k, got_v = layout.update(new_k, new_v)
    assert torch.equal(got_k, torch.cat([k[index][:, :, :5], new_k], 2))
    assert torch.equal(got_v, torch.cat([v[index][:, :, :5], new_v], 2))
    assert layout.length == 7 and layout.nbytes == 2 * B * H * 7 * D * 4
    assert layout.capacity == (7 if not reserve else max(reserve, 10))


def test_growing_drop_front_and_join_equal_padding_by_hand():
    a, b = GrowingKV(), GrowingKV(reserve=16)
    ka, va = _fill(a, (5, 1))
    kb, vb = _fill(b, (2,), seed=5)
    joined = GrowingKV.joined(a, b, 6)
    assert torch.equal(joined.k, torch.cat([ka, F.pad(kb, (0, 0, 4, 0))]))
    assert torch.equal(joined.v, torch.cat([va, F.pad(vb, (0, 0, 4, 0))]))
    joined.select(torch.tensor([4, 5]))  # only rows of ``b`` left: the first 4 columns are padding in each
    joined.drop_front(4)
    assert joined.length == 2 and torch.equal(joined.k, kb[1:])


def test_rolling_keeps_the_span_selects_rows_and_rewinds_only_what_it_holds():
    layout = RollingKV(span=4)
    k, v = _fill(layout, (3, 1, 1, 1, 1))  # 7 positions read, the last 4 held
    assert (layout.length, layout.start) == (7, 3) and torch.equal(layout.k, k[:, :, 3:])
    index = torch.tensor([1, 1])
    layout.select(index)
    assert torch.equal(layout.v, v[index][:, :, 3:])
    with pytest.raises(ValueError, match="rolling KV cache of 4 positions has dropped position 2.*at most 1"):
        layout.rewind(2)
    assert layout.length == 7  # refused before anything changed
    layout.rewind(1)
    new_k, _ = _kv(1, 9)
    got_k, _ = layout.update(new_k[:2], new_k[:2])
    assert torch.equal(got_k, torch.cat([k[index][:, :, 3:6], new_k[:2]], 2))  # the window a query reads


def test_recurrent_state_selects_rows_and_refuses_to_forget():
    layout = RecurrentState()
    s, z = torch.randn(B, H, 5, D), torch.randn(B, H, 5)
    layout.set((s, z), 4)
    index = torch.tensor([2, 1])
    layout.select(index)
    assert torch.equal(layout.state[0], s[index]) and torch.equal(layout.state[1], z[index])
    with pytest.raises(ValueError, match="cannot forget"):
        layout.rewind(1)
    with pytest.raises(ValueError, match="not keys"):
        layout.update(*_kv(1, 0))


# The container over layers of different layouts -------------------------------------------------------------
def test_the_container_rewinds_every_layer_or_none():
    cache = KVCache([GrowingKV(), RollingKV(span=3)])
    for layer in range(2):
        _fill(cache.layers[layer], (5,))
    cache.length = 5
    with pytest.raises(ValueError, match="rolling KV cache"):
        cache.rewind(2)
    assert cache.length == 5 and cache.layers[0].length == 5  # the growing layer was not cut first
    cache.rewind(1)
    assert cache.length == 4 and [layout.length for layout in cache.layers] == [4, 4]


def test_the_container_joins_growing_layers_and_refuses_others():
    a, b = KVCache(2), KVCache(2)
    for cache, t in ((a, 4), (b, 2)):
        for layer in range(2):
            cache.update(layer, *_kv(t, layer))
    both = a.join(b)
    assert both.length == 4 and [layout.k.shape for layout in both.layers] == [(2 * B, H, 4, D)] * 2
    assert torch.equal(both.layers[1].k[B:, :, :2], torch.zeros(B, H, 2, D))  # b's rows, left-padded
    rolling = KVCache([GrowingKV(), RollingKV(span=3)])
    assert a.joinable and not rolling.joinable
    with pytest.raises(ValueError, match="no rolling window"):
        a.join(rolling)


def test_snapshot_and_restore_return_every_layout_to_where_it_was():
    model = _model(attn_impl="sliding", attn_window=3)
    cache = KVCache([RollingKV.for_window(3), GrowingKV(reserve=16)])
    ids = torch.randint(0, 41, (2, 8), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        model(ids[:, :6], past_key_values=cache)
        saved = cache.snapshot()
        first = model(ids[:, 6:7], past_key_values=cache).logits
        model(ids[:, 7:8], past_key_values=cache)
        cache.restore(saved)
        again = model(ids[:, 6:7], past_key_values=cache).logits
    assert cache.length == 7 and torch.equal(first, again)


# The runner's cache records: what follows the rows ---------------------------------------------------------
def test_a_seq2seq_source_follows_the_rows_unless_only_beams_move():
    model = _model(arch="encoder-decoder", position="learned", decoder_start_token_id=0)
    runner = runner_for(model)
    cache = runner.new_cache(2)
    with torch.no_grad():
        runner.prefill(cache, torch.zeros(2, 1, dtype=torch.long), source=torch.tensor([[1, 2, 3], [4, 5, 6]]))
    memory = cache.memory
    cache.select(torch.tensor([1, 0]), within_inputs=True)
    assert cache.memory is memory
    cache.select(torch.tensor([1, 1, 0]))
    assert torch.equal(cache.memory, memory[[1, 1, 0]]) and cache.rows == 3
    assert cache.kv.get_cross(0)[0].shape[0] == 3  # the projected source keys follow every row
