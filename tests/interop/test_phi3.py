"""Phi-3 / Phi-3.5 / Phi-4-mini from Hugging Face files: LLaMA's layers with q/k/v fused in qkv_proj and gate/up in
gate_up_proj (split into tformer's Linears when read, rows in that order), a window on every layer where the file
names one, against transformers' Phi3ForCausalLM; what tformer does not compute refused in one line."""

from __future__ import annotations

import pytest
import torch

import tformer
from tformer.core.errors import TformerError
from tformer.cost.ledger import ledger
from tformer.interop import config_from_hf

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

VOCAB, T = 97, 23


def _reference(window):
    config = transformers.Phi3Config(hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=6,
                                     num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=64,
                                     original_max_position_embeddings=64, sliding_window=window, pad_token_id=0,
                                     bos_token_id=1, eos_token_id=2)
    torch.manual_seed(0)
    model = transformers.Phi3ForCausalLM._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("window", [None, 5])
def test_logits_equal_phi3_for_causal_lm(window, tmp_path):
    hf = _reference(window)
    hf.save_pretrained(tmp_path)
    ours = tformer.load_hf(tmp_path).eval()
    c = ours.config
    want = ("sliding", 5) if window else ("sdpa", None)
    assert (c.attn_impl, c.attn_window, c.n_kv_heads, c.bias) == (*want, 2, False)
    ids = torch.randint(3, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (ours(ids).logits - hf(ids).logits).abs().max().item() < 1e-5
    # the fused rows went to q, k, v and gate, up in order: every tensor counted once
    assert ledger(c).params["total"] == sum(p.numel() for p in hf.parameters())


def test_what_tformer_does_not_compute_is_refused_in_one_line():
    d = _reference(None).config.to_dict()
    partial = {**d, "rope_parameters": {**d["rope_parameters"], "partial_rotary_factor": 0.75}}
    with pytest.raises(TformerError, match="partial_rotary_factor=0.75"):
        config_from_hf(partial)
    longrope = {**d, "rope_parameters": {**d["rope_parameters"], "rope_type": "longrope", "long_factor": [1.0] * 4,
                                         "short_factor": [1.0] * 4}}
    with pytest.raises(TformerError, match="longrope"):
        config_from_hf(longrope)
