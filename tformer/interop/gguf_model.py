"""A tformer model from a GGUF file (llama.cpp's format): the config from its metadata, the weights
dequantized to fp32 (bit-identical to gguf-py's dequantizer), under Hugging Face's names, then through the
same conversion ``load_hf`` uses, so one set of key tables serves both formats.

    model = load_gguf("smollm2-135m-instruct")          # a packaged name, or a path to a .gguf file
    model, tokenizer = load_gguf_with_tokenizer(path)

What llama.cpp's converter changed is undone here, as transformers' GGUF loader does: LLaMA-family Q and K
rows were permuted so that llama.cpp can rotate consecutive pairs; tformer rotates the two halves of a head
(as Hugging Face does), so the rows go back. A file without ``output.weight`` ties the head to the embedding.
The config comes from gguf_config, which checks every metadata value before a model is built.
"""

from __future__ import annotations

from pathlib import Path

import torch

from tformer.core.errors import TformerError
from tformer.interop.gguf_config import gguf_name, hf_config_from_gguf, resolve_gguf
from tformer.interop.gguf_file import GGUFFile, open_gguf
from tformer.interop.gguf_quants import dequantize
from tformer.interop.gguf_tokenizer import tokenizer_from_gguf
from tformer.interop.hf import model_from_hf

# GGUF tensor names -> Hugging Face's (LLaMA family), per layer and for the whole model.
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}


def unpermute(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """Q or K rows (n_head x head_dim, in) from llama.cpp's pair order back to Hugging Face's half order.

    llama.cpp's converter grouped each head's rows as (head_dim/2, 2) pairs; this regroups them as
    (2, head_dim/2) halves: the inverse of its reshape(n_head, 2, d/2, in).swapaxes(1, 2)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_state_from_gguf(f: GGUFFile, hf_config: dict) -> dict[str, torch.Tensor]:
    """Every tensor of the file, dequantized to fp32, under its Hugging Face name."""
    n_layers = hf_config["num_hidden_layers"]
    heads, kv_heads = hf_config["num_attention_heads"], hf_config["num_key_value_heads"]
    sd = {}
    for name, info in f.tensors.items():
        if name in _GLOBAL:
            hf = _GLOBAL[name]
        elif name.startswith("blk.") and name.count(".") >= 2:
            index, _, rest = name[4:].partition(".")
            if not index.isdigit() or int(index) >= n_layers or rest not in _LAYER:
                raise TformerError(f"GGUF file {f.path}: tensor {name} is not part of a llama model with "
                                   f"{n_layers} layers; the file is damaged or of another architecture")
            hf = f"model.layers.{int(index)}.{_LAYER[rest]}"
        elif name == "rope_freqs.weight":
            raise TformerError(f"GGUF file {f.path} carries rope_freqs (llama 3's RoPE scaling), which tformer "
                               "does not support yet")
        else:
            raise TformerError(f"GGUF file {f.path}: tensor {name} is not part of a llama model; the file is "
                               "damaged or of another architecture")
        w = dequantize(f.raw(name), info.ggml_type, info.shape)
        if hf.endswith("q_proj.weight"):
            w = unpermute(w, heads)
        elif hf.endswith("k_proj.weight"):
            w = unpermute(w, kv_heads)
        sd[hf] = w
    return sd


def load_gguf(name_or_path: str | Path, device=None, dtype=None, tokenizer: bool = False):
    """Our model from a GGUF file or a packaged model's name, weights dequantized (fp32 unless ``dtype``);
    with ``tokenizer=True``, (model, the file's tokenizer)."""
    path = resolve_gguf(name_or_path)
    with open_gguf(path) as f:
        hf_config = hf_config_from_gguf(f)
        tok = tokenizer_from_gguf(f.metadata) if tokenizer else None  # before the weights: a bad vocabulary fails fast
        if tok is not None:  # carried as read, so `export --format gguf` writes the tokenizer back unchanged
            tok.metadata = {k: v for k, v in f.metadata.items() if k.startswith("tokenizer.")}
            tok.metadata_types = {k: f.metadata_types[k] for k in tok.metadata}
        sd = hf_state_from_gguf(f, hf_config)
    model = model_from_hf(hf_config, sd, gguf_name(name_or_path, path), device=device, dtype=dtype)
    return (model, tok) if tokenizer else model


__all__ = ["hf_state_from_gguf", "load_gguf", "unpermute"]
