"""Mistral (sliding-window attention) against Hugging Face's MistralForCausalLM: logits, padding,
generation with a rolling KV cache whose memory stays capped at the window, files both ways, and the
mistral-7b preset's parameter count."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import tformer
from tformer.core.config import preset
from tformer.cost.ledger import ledger
from tformer.generate import generate, pad_batch
from tformer.interop import config_from_hf, config_to_hf
from tformer.model import runner_for

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

VOCAB, WINDOW, T = 101, 5, 13  # odd sizes; sequences longer than the window


def _reference(window=WINDOW, seed=0):
    config = transformers.MistralConfig(num_hidden_layers=2, hidden_size=36, num_attention_heads=6,
                                        num_key_value_heads=2, intermediate_size=52, vocab_size=VOCAB,
                                        max_position_embeddings=64,
                                        rms_norm_eps=1e-5, sliding_window=window, tie_word_embeddings=False,
                                        bos_token_id=0, eos_token_id=2, pad_token_id=1)
    torch.manual_seed(seed)
    model = transformers.MistralForCausalLM._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    hf = _reference()
    path = tmp_path_factory.mktemp("mistral")
    hf.save_pretrained(path)
    return hf, tformer.load_hf(path)


def test_loaded_config_is_the_sliding_kind(pair):
    _, ours = pair
    c = ours.config
    assert (c.attn_impl, c.attn_window, c.n_kv_heads, c.bias) == ("sliding", WINDOW, 2, False)


@pytest.mark.parametrize("padding", [None, "left", "right"])
def test_logits_equal_transformers(pair, padding):
    hf, ours = pair
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(3, VOCAB, (2, T), generator=g)
    batch = {"input_ids": ids}
    keep = torch.ones(2, T, dtype=torch.bool)
    if padding:
        mask = torch.ones(2, T, dtype=torch.long)
        mask[1, :4] = 0 if padding == "left" else 1
        if padding == "right":
            mask[1, T - 4:] = 0
        batch["attention_mask"] = mask
        batch["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
        keep = mask.bool()
    with torch.no_grad():
        a, b = ours(**batch).logits, hf(**batch).logits
    assert (a - b).abs()[keep].max().item() < 1e-5


def test_window_matters_here(pair, tmp_path):
    """The same weights without the window give other logits: the test above checks the window."""
    hf, ours = pair
    ids = torch.randint(3, VOCAB, (1, T))
    with torch.no_grad():
        full = tformer.model.with_attention(ours, "sdpa")(ids).logits
        assert (full - ours(ids).logits).abs().max().item() > 1e-3


def _prompts():
    g = torch.Generator().manual_seed(2)
    return [torch.randint(4, VOCAB, (n,), generator=g).tolist() for n in (7, 3, 6)]


def test_greedy_generation_equals_transformers_with_a_capped_cache(pair):
    hf, ours = pair
    new = 3 * WINDOW + 1  # well past the window
    ids, mask = pad_batch(_prompts(), 1, "left")
    out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False, eos_token_id=None,
                      pad_token_id=1, min_length=0, repetition_penalty=1.0)
    expected = out[:, ids.shape[1]:].tolist()
    for use_cache in (True, False):
        got = generate(ours, ids, attention_mask=mask, max_new_tokens=new, stop_tokens=[], use_cache=use_cache)
        assert got.sequences == expected, f"use_cache={use_cache}"


def test_beam_search_equals_transformers(pair):
    hf, ours = pair
    ids, mask = pad_batch(_prompts(), 1, "left")
    out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=2 * WINDOW, do_sample=False, num_beams=3,
                      eos_token_id=None, pad_token_id=1, min_length=0, early_stopping=False, length_penalty=1.0)
    got = generate(ours, ids, attention_mask=mask, max_new_tokens=2 * WINDOW, stop_tokens=[], num_beams=3,
                   early_stopping=False, length_penalty=1.0)
    assert got.sequences == out[:, ids.shape[1]:].tolist()


@pytest.mark.parametrize("static", [False, True])
def test_rolling_cache_holds_the_window_and_decodes_like_full_recompute(pair, static):
    _, ours = pair
    runner = runner_for(ours)
    ids, mask = pad_batch(_prompts(), 1, "left")
    rows, steps = ids.shape[0], 3 * WINDOW
    per_position = 2 * ours.config.n_layers * rows * ours.config.n_kv_heads * ours.config.head_dim * 4
    tokens = {}
    for kv in (True, False):
        cache = runner.new_cache(rows, ids.shape[1] + steps if static else None, kv=kv)
        with torch.no_grad():
            logits = runner.prefill(cache, ids, mask)
            out = []
            for step in range(steps):
                out.append(logits.argmax(-1))
                logits = runner.step(cache, out[-1])
                if kv and step >= WINDOW:
                    assert cache.nbytes == WINDOW * per_position  # (w - 1) past keys + 1: w positions
        tokens[kv] = torch.stack(out, 1)
    assert torch.equal(tokens[True], tokens[False])


def test_rolling_cache_rewinds_one_position_and_refuses_more(pair):
    _, ours = pair
    runner = runner_for(ours)
    ids = torch.randint(3, VOCAB, (2, 2 * WINDOW))
    cache = runner.new_cache(2)
    with torch.no_grad():
        runner.prefill(cache, ids)
        first = runner.step(cache, ids[:, 0])
        cache.rewind(1)
        again = runner.step(cache, ids[:, 0])
        assert torch.allclose(first, again, atol=1e-6)
        with pytest.raises(ValueError, match="rolling KV cache"):
            cache.rewind(2)


def test_saved_by_us_loads_in_transformers(pair, tmp_path):
    _, ours = pair
    tformer.save_hf(ours, tmp_path / "out")
    saved = json.loads((tmp_path / "out" / "config.json").read_text())
    assert (saved["model_type"], saved["sliding_window"]) == ("mistral", WINDOW)
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "out", attn_implementation="eager").eval()
    assert type(hf).__name__ == "MistralForCausalLM"
    ids = torch.randint(3, VOCAB, (2, T))
    with torch.no_grad():
        assert (hf(ids).logits - ours(ids).logits).abs().max().item() < 1e-5
    back = tformer.load_hf(tmp_path / "out")
    assert back.config.attn_window == WINDOW


def test_config_mapping():
    base = dict(model_type="mistral", hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
                intermediate_size=64, vocab_size=50)
    assert config_from_hf({**base, "sliding_window": None}).attn_impl == "sdpa"
    assert config_from_hf(base).attn_window == 4096  # HF's default when the file names none
    c = config_from_hf({**base, "sliding_window": 9})
    assert (c.attn_impl, c.attn_window) == ("sliding", 9)
    with pytest.raises(tformer.TformerError, match="sliding_window"):
        config_from_hf({**base, "model_type": "llama", "sliding_window": 9})
    with pytest.raises(tformer.TformerError, match="attn_dilation"):
        config_to_hf(c.replace(attn_dilation=2))  # Mistral has no dilation


def test_mistral_7b_preset_has_the_published_parameter_count():
    config = preset("mistral-7b")
    assert (config.attn_impl, config.attn_window, config.n_kv_heads, config.d_ff) == ("sliding", 4096, 8, 14336)
    assert ledger(config, phase="forward", batch=1, seq=16).params["total"] == 7_241_732_096
    run = subprocess.run([sys.executable, "-m", "tformer", "count", "--preset", "mistral-7b"], capture_output=True,
                         text=True, check=True)
    assert "7,241,732,096" in run.stdout
