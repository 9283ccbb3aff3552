"""The configuration a GGUF file's metadata describes, without reading its weights and without torch (what
`tformer count --gguf` and the other cost commands read; the model loader in gguf_model builds on it).

The file is untrusted: every metadata value is checked for its type and range before a config is made, and
its tensors' shapes are checked against it (token_embd against the vocabulary).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.data.gguf_models import PACKAGED_GGUF, gguf_path
from tformer.interop.gguf_families import READS, GgufFamily, gguf_family
from tformer.interop.gguf_file import GGUFFile, open_gguf
from tformer.interop.hf_config import config_from_hf

ARCHITECTURES = READS  # general.architecture values tformer reads (a record each in gguf_families)


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


def reading_family(f: GGUFFile) -> GgufFamily:
    """The record of the file's architecture, or the one-line refusal naming those tformer reads."""
    return gguf_family(f.metadata.get("general.architecture"), "reads", f"GGUF file {f.path}")


def hf_config_from_gguf(f: GGUFFile) -> dict:
    """The Hugging Face config.json (as a dict) equivalent to the file's metadata."""
    family = reading_family(f)
    a = f"{family.name}."
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
        "model_type": family.hf_model_type,
        "_name_or_path": f.metadata.get("general.name") or f.path.stem,
        "num_hidden_layers": _meta(f, a + "block_count", int, low=1),
        "hidden_size": hidden,
        "intermediate_size": _meta(f, a + "feed_forward_length", int, low=1),
        "num_attention_heads": heads,
        "num_key_value_heads": _meta(f, a + "attention.head_count_kv", int, default=heads, low=1),
        "rms_norm_eps": _meta(f, a + family.norm_eps_key, float, low=0.0),
        "rope_theta": _meta(f, a + "rope.freq_base", float, default=10000.0, low=1e-9),
        "max_position_embeddings": _meta(f, a + "context_length", int, low=1),
        "vocab_size": vocab,
        "tie_word_embeddings": "output.weight" not in f.tensors,
        "hidden_act": family.hidden_act,
    }
    if family.read_config is not None:  # the family's own keys, read as checked as the common ones
        family.read_config(lambda key, kind, default=None, low=None: _meta(f, a + key, kind, default, low), config)
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


def config_from_gguf(name_or_path: str | Path) -> ModelConfig:
    """The ModelConfig of a GGUF file (or a packaged model's name), from its metadata alone."""
    path = resolve_gguf(name_or_path)
    with open_gguf(path) as f:
        config = config_from_hf(hf_config_from_gguf(f))
    return config.replace(name=gguf_name(name_or_path, path))


def gguf_name(name_or_path: str | Path, path: Path) -> str:
    """A packaged model's own name, else the file's stem."""
    return str(name_or_path) if str(name_or_path) in PACKAGED_GGUF else path.stem


__all__ = ["ARCHITECTURES", "config_from_gguf", "gguf_name", "hf_config_from_gguf", "reading_family", "resolve_gguf"]
