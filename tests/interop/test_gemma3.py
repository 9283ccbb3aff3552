"""Gemma 3 against Hugging Face's Gemma3ForCausalLM (tiny random configs): five sliding-window layers to one global,
two RoPE bases, q/k norms, sandwich norms scaled by 1 + w, GeGLU, embeddings * sqrt(d), scores / sqrt(a set scalar).
Logits, padding, greedy and beam generation past the window with each layer's own cache, files both ways, the
config's mapping and its refusals."""

from __future__ import annotations

import json

import pytest
import torch

import tformer
from tformer.core.config import preset
from tformer.generate import generate, pad_batch
from tformer.interop import config_from_hf, config_to_hf
from tformer.model import build, runner_for

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

VOCAB, WINDOW, T = 103, 6, 17  # odd sizes; sequences longer than the window
LAYERS = 6  # five sliding layers, then a global one


def _hf_config(**kw):
    base = dict(vocab_size=VOCAB, hidden_size=40, intermediate_size=56, num_hidden_layers=LAYERS,
                num_attention_heads=4, num_key_value_heads=2, head_dim=12, max_position_embeddings=64,
                sliding_window=WINDOW, query_pre_attn_scalar=10, rms_norm_eps=1e-6, pad_token_id=0, bos_token_id=2,
                eos_token_id=1, rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e5},
                                                 "sliding_attention": {"rope_type": "default", "rope_theta": 1e3}})
    return transformers.Gemma3TextConfig(**{**base, **kw})


def _reference(seed=0, **kw):
    torch.manual_seed(seed)
    model = transformers.Gemma3ForCausalLM._from_config(_hf_config(**kw), attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():  # the norms start at 0 (scale 1): move every weight off its initial value
            p.add_(torch.randn_like(p) * 0.3)
    return model


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    hf = _reference()
    path = tmp_path_factory.mktemp("gemma3")
    hf.save_pretrained(path)
    return hf, tformer.load_hf(path)


def test_loaded_config_is_gemma3(pair):
    c = pair[1].config
    assert c.layer_types == ["sliding"] * 5 + ["full"]
    assert (c.attn_window, c.rope_theta, c.rope_local_theta, c.attn_scale_dim, c.head_dim) == (WINDOW, 1e5, 1e3, 10, 12)
    assert (c.norm, c.norm_placement, c.qk_norm, c.activation, c.scale_embeddings) == (
        "rmsnorm_offset", "sandwich", True, "gelu_tanh", True)


@pytest.mark.parametrize("padding", [None, "left"])
def test_logits_equal_transformers(pair, padding):
    hf, ours = pair
    ids = torch.randint(3, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    batch, keep = {"input_ids": ids}, torch.ones(2, T, dtype=torch.bool)
    if padding:
        mask = torch.ones(2, T, dtype=torch.long)
        mask[1, :4] = 0
        batch.update(attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
        keep = mask.bool()
    with torch.no_grad():
        a, b = ours(**batch).logits, hf(**batch).logits
    assert (a - b).abs()[keep].max().item() < 1e-5


def test_every_gemma_piece_matters_here(pair):
    """Each of the window, the local base, the q/k norms and the score scale changes the logits: the equality
    above checks each of them (a model missing one would differ)."""
    _, ours = pair
    ids = torch.randint(3, VOCAB, (1, T), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        base = ours(ids).logits
        for change in ({"layer_types": ["full"] * LAYERS}, {"rope_local_theta": 1e5}, {"attn_scale_dim": 12}):
            other = build(ours.config.replace(**change)).eval()
            other.load_state_dict(ours.state_dict())
            assert (other(ids).logits - base).abs().max().item() > 1e-3, change
        no_norm = build(ours.config.replace(qk_norm=False)).eval()
        no_norm.load_state_dict(ours.state_dict(), strict=False)
        assert (no_norm(ids).logits - base).abs().max().item() > 1e-3


def _prompts():
    g = torch.Generator().manual_seed(2)
    return [torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in (7, 3, 9)]


def test_greedy_generation_equals_transformers_past_the_window(pair):
    hf, ours = pair
    new = 3 * WINDOW + 2
    ids, mask = pad_batch(_prompts(), 0, "left")
    out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False, eos_token_id=None,
                      pad_token_id=0, min_length=0, repetition_penalty=1.0)
    expected = out[:, ids.shape[1]:].tolist()
    for use_cache in (True, False):
        got = generate(ours, ids, attention_mask=mask, max_new_tokens=new, stop_tokens=[], use_cache=use_cache)
        assert got.sequences == expected, f"use_cache={use_cache}"


def test_beam_search_equals_transformers(pair):
    hf, ours = pair
    ids, mask = pad_batch(_prompts(), 0, "left")
    out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2 * WINDOW, do_sample=False, num_beams=3,
                      eos_token_id=None, pad_token_id=0, min_length=0, early_stopping=False, length_penalty=1.0)
    got = generate(ours, ids, attention_mask=mask, max_new_tokens=2 * WINDOW, stop_tokens=[], num_beams=3,
                   early_stopping=False, length_penalty=1.0)
    assert got.sequences == out[:, ids.shape[1]:].tolist()


def test_each_layer_keeps_its_own_cache_flat_beyond_the_window_for_the_local_ones(pair):
    """Rolling caches on the five sliding layers (the last (w - 1) + 1 positions), a growing one on the global layer:
    past the window only the global layer's memory grows."""
    _, ours = pair
    runner = runner_for(ours)
    c = ours.config
    per_position = 2 * c.n_kv_heads * c.head_dim * 4  # K and V of one row, one layer, fp32
    cache = runner.new_cache(1)
    sizes = []
    with torch.no_grad():
        logits = runner.prefill(cache, torch.tensor([[5, 6, 7]]))
        for _ in range(4 * WINDOW):
            logits = runner.step(cache, logits.argmax(-1))
            sizes.append([layer.nbytes for layer in cache.kv.layers])
    read = 3 + 4 * WINDOW
    assert sizes[-1] == [WINDOW * per_position] * 5 + [read * per_position]
    assert sizes[-1][:5] == sizes[-WINDOW][:5] and sizes[-1][5] > sizes[-WINDOW][5]


def test_saved_by_us_loads_in_transformers(pair, tmp_path):
    _, ours = pair
    torch.manual_seed(4)
    mine = build(ours.config).eval()
    with torch.no_grad():
        for p in mine.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    tformer.save_hf(mine, tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (saved["model_type"], saved["sliding_window"], saved["query_pre_attn_scalar"]) == ("gemma3_text", WINDOW, 10)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    assert type(hf).__name__ == "Gemma3ForCausalLM"
    ids = torch.randint(3, VOCAB, (2, T))
    with torch.no_grad():
        assert (hf(ids).logits - mine(ids).logits).abs().max().item() < 1e-5
    assert tformer.load_hf(tmp_path / "out").config == mine.config.replace(name=mine.config.name)


def test_config_mapping_and_refusals():
    base = dict(model_type="gemma3_text", hidden_size=32, num_attention_heads=4, num_hidden_layers=7,
                intermediate_size=64, vocab_size=50, max_position_embeddings=128)
    c = config_from_hf(base)  # no layer_types: HF's period of six; its default window and bases
    assert c.layer_types == ["sliding"] * 5 + ["full", "sliding"]
    assert c.attn_window == 128  # HF's default 4096 reaches past this 128-position context: the context, exactly
    assert (c.rope_theta, c.rope_local_theta, c.head_dim, c.attn_scale_dim) == (1e6, 1e4, 256, 256)
    old = config_from_hf({**base, "sliding_window": 16, "rope_theta": 5e5, "rope_local_base_freq": 2e3,
                          "final_logit_softcapping": 30.0})
    assert (old.rope_theta, old.rope_local_theta, old.logit_softcap, old.attn_window) == (5e5, 2e3, 30.0, 16)
    for bad, message in (({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
                         ({"use_bidirectional_attention": True}, "bidirectional"),
                         ({"layer_types": ["chunked_attention"] * 7}, "layer_types"),
                         ({"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0}}},
                          "sliding layers")):
        with pytest.raises(tformer.TformerError, match=message):
            config_from_hf({**base, "sliding_window": 16, **bad})
    with pytest.raises(tformer.TformerError, match="rope_parameters.full_attention.rope_theta"):
        config_from_hf({**base, "rope_parameters": {"full_attention": {"rope_theta": "big"}}})
    assert config_to_hf(preset("gemma3-270m"))["model_type"] == "gemma3_text"


@pytest.mark.parametrize("change, message", [
    ({"layer_types": ["sliding", "full"]}, "layer_types lists 2 layers for n_layers=18"),
    ({"attn_window": 40000}, "attn_window=40000 is larger than the context"),
    ({"layer_types": ["local"] * 18}, "layer_types='local' is unknown"),
    ({"attn_impl": "performer"}, "attn_impl='performer' is not exact"),
    ({"layer_types": None}, "rope_local_theta is the RoPE base of sliding layers"),
])
def test_bad_gemma_configs_are_one_line_each(change, message):
    with pytest.raises(tformer.TformerError, match=message):
        preset("gemma3-270m", **change)


def test_published_parameter_counts():
    """Gemma 3 270M and 1B: 268,098,176 and 999,885,952 parameters (google/gemma-3-270m, -1b-pt), the embedding
    62.6% of the first (262,144 x 640)."""
    from tformer.cost.ledger import ledger
    assert ledger(preset("gemma3-270m"), seq=8).params["total"] == 268_098_176
    assert ledger(preset("gemma3-1b"), seq=8).params["total"] == 999_885_952


def test_compiled_decode_equals_eager_past_the_window(pair):
    """The model's own forward over a preallocated cache (per layer: a window's mask on the sliding layers, every key
    on the global one), traced by torch.compile, decodes what the eager model decodes."""
    _, ours = pair
    prompts = _prompts()
    eager = generate(ours, prompts, max_new_tokens=2 * WINDOW + 3, stop_tokens=[])
    compiled = generate(ours, prompts, max_new_tokens=2 * WINDOW + 3, stop_tokens=[], compile="eager")
    assert compiled.sequences == eager.sequences


def test_served_with_continuous_batching_equals_each_request_alone(pair):
    from tformer.generate.continuous import ContinuousBatcher, Request
    from tformer.generate.slot_pool import pool_serves

    _, ours = pair
    assert pool_serves(ours.config)  # the KV pool serves it: rows join and leave whatever their length
    prompts = _prompts() + [[9] * 11, [4, 5]]
    batcher = ContinuousBatcher(ours, max_batch=2)
    done = []
    seqs = [batcher.submit(Request(p, 2 * WINDOW, stop_tokens=()), lambda *event: done.append(event)) for p in prompts]
    batcher.start()
    assert batcher.shutdown(drain=True, timeout=60)
    for seq, prompt in zip(seqs, prompts):
        assert seq.tokens == generate(ours, [prompt], max_new_tokens=2 * WINDOW, stop_tokens=[]).sequences[0]
