"""Qwen2 / Qwen2.5 (biases on q, k and v alone) and Qwen3 (per-head RMSNorm of q and k, no biases, a head_dim of its
own) against Hugging Face's Qwen2ForCausalLM and Qwen3ForCausalLM: config, logits with padding, greedy tokens, files
both ways, the ledger's parameter count."""

from __future__ import annotations

import pytest
import torch

import tformer
from tformer.core.errors import TformerError
from tformer.cost.ledger import ledger
from tformer.generate import generate
from tformer.interop import config_from_hf, config_to_hf

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

VOCAB, T = 103, 11


def _reference(model_type: str, tied: bool):
    common = dict(num_hidden_layers=2, hidden_size=48, num_attention_heads=6, num_key_value_heads=2,
                  intermediate_size=56, vocab_size=VOCAB, max_position_embeddings=64, rms_norm_eps=1e-6,
                  rope_theta=10000.0, tie_word_embeddings=tied, bos_token_id=0, eos_token_id=2)
    if model_type == "qwen2":
        config, cls = transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
    else:  # head_dim 16, not 48 / 6: Qwen3's projections are wider than the model
        config, cls = transformers.Qwen3Config(head_dim=16, **common), transformers.Qwen3ForCausalLM
    torch.manual_seed(0)
    model = cls._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():  # biases and norm scales away from their zero / one init: they must matter
            p.add_(torch.randn_like(p) * 0.3)
    return model


@pytest.fixture(scope="module", params=[("qwen2", True), ("qwen2", False), ("qwen3", True), ("qwen3", False)],
                ids=lambda p: f"{p[0]}-{'tied' if p[1] else 'untied'}")
def pair(request, tmp_path_factory):
    model_type, tied = request.param
    hf = _reference(model_type, tied)
    path = tmp_path_factory.mktemp(model_type)
    hf.save_pretrained(path)
    return model_type, hf, tformer.load_hf(path), path


def test_config_reads_the_family_s_differences(pair):
    model_type, hf, ours, _ = pair
    c = ours.config
    assert (c.position, c.norm, c.n_kv_heads, c.bias, c.tied_embeddings) == ("rope", "rmsnorm", 2, False,
                                                                             hf.config.tie_word_embeddings)
    if model_type == "qwen2":
        assert (c.qkv_bias, c.qk_norm, c.head_dim) == (True, False, 8)
        assert ours.decoder.layers[0].attn.q_proj.bias is not None and ours.decoder.layers[0].attn.o_proj.bias is None
    else:
        assert (c.qkv_has_bias, c.qk_norm, c.head_dim) == (False, True, 16)


@pytest.mark.parametrize("padding", [None, "left"])
def test_logits_equal_transformers(pair, padding):
    _, hf, ours, _ = pair
    ids = torch.randint(3, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    batch, keep = {"input_ids": ids}, torch.ones(2, T, dtype=torch.bool)
    if padding:
        mask = torch.ones(2, T, dtype=torch.long)
        mask[1, :4] = 0
        batch |= {"attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
        keep = mask.bool()
    with torch.no_grad():
        a, b = ours(**batch).logits, hf(**batch).logits
    assert (a - b).abs()[keep].max().item() < 1e-5


def test_greedy_tokens_equal_transformers(pair):
    _, hf, ours, _ = pair
    prompt = torch.randint(3, VOCAB, (1, 6), generator=torch.Generator().manual_seed(2))
    want = hf.generate(prompt, max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)[0, 6:]
    got = generate(ours, prompt, max_new_tokens=8, stop_tokens=[]).sequences[0]
    assert got == want.tolist()


def test_saved_files_load_in_transformers_with_equal_logits(pair, tmp_path):
    model_type, hf, ours, _ = pair
    tformer.save_hf(ours, tmp_path)
    back = type(hf).from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert back.config.model_type == model_type
    ids = torch.randint(3, VOCAB, (1, T))
    with torch.no_grad():
        assert torch.equal(back(ids).logits, hf(ids).logits)


def test_the_ledger_counts_every_tensor(pair):
    _, hf, ours, _ = pair
    hf_params = sum(p.numel() for p in hf.parameters())  # a tied head is one tensor, counted once
    assert ledger(ours.config).params["total"] == hf_params == sum(p.numel() for p in ours.parameters())


def test_what_tformer_does_not_compute_is_refused_in_one_line(pair):
    model_type, hf, _, _ = pair
    d = hf.config.to_dict()
    with pytest.raises(TformerError, match="use_sliding_window"):
        config_from_hf(d | {"use_sliding_window": True})
    if model_type == "qwen3":
        with pytest.raises(TformerError, match="attention_bias"):
            config_from_hf(d | {"attention_bias": True})
    assert config_to_hf(config_from_hf(d))["model_type"] == model_type
