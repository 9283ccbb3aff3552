"""A tformer model from a GGUF file (llama.cpp's format): the config from its metadata, the weights
dequantized to fp32 (bit-identical to gguf-py's dequantizer), under Hugging Face's names, then through the
same conversion ``load_hf`` uses, so one set of key tables serves both formats.

    model = load_gguf("smollm2-135m-instruct")          # a packaged name, or a path to a .gguf file
    model, tokenizer = load_gguf_with_tokenizer(path)

What llama.cpp's converter changed is undone here, as transformers' GGUF loader does: LLaMA-family Q and K
rows were permuted so that llama.cpp can rotate consecutive pairs; tformer rotates the two halves of a head
(as Hugging Face does), so the rows go back. A file without ``output.weight`` ties the head to the embedding.
Every metadata value is checked for its type and range before a model is built (the file is untrusted).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from tformer.core.errors import TformerError
from tformer.data.gguf_models import PACKAGED_GGUF, gguf_path
from tformer.interop.gguf_file import GGUFFile, open_gguf
from tformer.interop.gguf_quants import dequantize
from tformer.interop.hf import model_from_hf

ARCHITECTURES = ("llama",)  # general.architecture values tformer reads

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


def resolve_gguf(name_or_path: str | Path) -> Path:
    """A packaged model's name (fetched once into the cache) or a path to a .gguf file."""
    text = str(name_or_path)
    if text in PACKAGED_GGUF:
        return gguf_path(text)
    path = Path(text).expanduser()
    if not path.is_file():
        packaged = ", ".join(PACKAGED_GGUF)
        raise TformerError(f"--gguf {text}: no such file, and not a packaged model ({packaged}); give a .gguf "
                           "file's path or one of those names")
    return path


def _meta(f: GGUFFile, key: str, kind: type, default=None, low=None):
    """A metadata value of the expected kind (and >= low), or a one-line error naming the key."""
    value = f.metadata.get(key, default)
    if value is None:
        raise TformerError(f"GGUF file {f.path} lacks the metadata key {key}; the file is incomplete")
    ok = isinstance(value, kind) and not isinstance(value, bool) if kind is not bool else isinstance(value, bool)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value, ok = float(value), True
    if not ok or (low is not None and not value >= low) or (kind is float and not math.isfinite(value)):
        raise TformerError(f"GGUF file {f.path}: metadata {key} = {value!r} is not a {kind.__name__}"
                           + (f" >= {low}" if low is not None else "") + "; the file is damaged")
    if kind is float and f.metadata_types.get(key) == "f32":
        # The shortest decimal that is the same float32 (1e-05, not 9.999999747378752e-06): equal once the model
        # computes in fp32, and what the model's config said before conversion.
        value = float(str(np.float32(value)))
    return value


def hf_config_from_gguf(f: GGUFFile) -> dict:
    """The Hugging Face config.json (as a dict) equivalent to the file's metadata."""
    arch = f.metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        shown = arch if isinstance(arch, str) and len(arch) < 40 else type(arch).__name__
        raise TformerError(f"GGUF file {f.path} holds a '{shown}' model; tformer reads: {', '.join(ARCHITECTURES)}")
    a = f"{arch}."
    heads = _meta(f, a + "attention.head_count", int, low=1)
    hidden = _meta(f, a + "embedding_length", int, low=1)
    tokens = f.metadata.get("tokenizer.ggml.tokens")
    embed = f.tensors.get("token_embd.weight")
    if embed is None or len(embed.shape) != 2:
        raise TformerError(f"GGUF file {f.path} has no 2-d token_embd.weight; the file is incomplete")
    vocab = embed.shape[0]
    if tokens is not None and len(tokens) != vocab:
        raise TformerError(f"GGUF file {f.path}: {len(tokens)} tokens in tokenizer.ggml.tokens, but token_embd "
                           f"has {vocab} rows; the file is damaged")
    scaling = f.metadata.get(a + "rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise TformerError(f"GGUF file {f.path}: RoPE scaling '{scaling}' is not supported yet (only plain RoPE)")
    config = {
        "model_type": "llama",
        "_name_or_path": f.metadata.get("general.name") or f.path.stem,
        "num_hidden_layers": _meta(f, a + "block_count", int, low=1),
        "hidden_size": hidden,
        "intermediate_size": _meta(f, a + "feed_forward_length", int, low=1),
        "num_attention_heads": heads,
        "num_key_value_heads": _meta(f, a + "attention.head_count_kv", int, default=heads, low=1),
        "rms_norm_eps": _meta(f, a + "attention.layer_norm_rms_epsilon", float, low=0.0),
        "rope_theta": _meta(f, a + "rope.freq_base", float, default=10000.0, low=1e-9),
        "max_position_embeddings": _meta(f, a + "context_length", int, low=1),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in f.tensors,
        "hidden_act": "silu",
    }
    key_length = f.metadata.get(a + "attention.key_length")
    if key_length is not None:
        config["head_dim"] = _meta(f, a + "attention.key_length", int, low=1)
    for ours, key in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                      ("pad_token_id", "padding_token_id")):
        value = f.metadata.get(f"tokenizer.ggml.{key}")
        if value is not None:
            value = _meta(f, f"tokenizer.ggml.{key}", int, low=0)
            if value >= vocab:
                raise TformerError(f"GGUF file {f.path}: tokenizer.ggml.{key} = {value} is outside the vocabulary "
                                   f"of {vocab}; the file is damaged")
            config[ours] = value
    return config


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


def load_gguf(name_or_path: str | Path, device=None, dtype=None):
    """Our model from a GGUF file or a packaged model's name, weights dequantized (fp32 unless ``dtype``)."""
    path = resolve_gguf(name_or_path)
    with open_gguf(path) as f:
        hf_config = hf_config_from_gguf(f)
        sd = hf_state_from_gguf(f, hf_config)
    name = str(name_or_path) if str(name_or_path) in PACKAGED_GGUF else path.stem
    return model_from_hf(hf_config, sd, name, device=device, dtype=dtype)


__all__ = ["ARCHITECTURES", "hf_config_from_gguf", "hf_state_from_gguf", "load_gguf", "resolve_gguf", "unpermute"]
