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
    if scaling not in ("none", None, "linear"):
        raise TformerError(f"GGUF file {f.path}: RoPE scaling '{scaling}' is not supported yet (plain, linear, and "
                           "Llama 3's rope_freqs)")
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
    if scaling == "linear":
        config["rope_parameters"] = {"rope_type": "linear", "rope_theta": config["rope_theta"],
                                     "factor": _meta(f, a + "rope.scaling.factor", float, low=1.0)}
    if "rope_freqs.weight" in f.tensors:
        config["rope_parameters"] = _llama3_rope(f, config)
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


def _llama3_rope(f: GGUFFile, config: dict) -> dict:
    """Llama 3.1-3.3's RoPE scaling from the per-frequency divisors llama.cpp's converter stores (rope_freqs): factor
    = the largest divisor; low_freq_factor 1 (every release's); original context and high_freq_factor from the
    blended frequencies, whose 1 / divisor is linear in original / wavelength. Checked: the parameters must give the
    file's divisors back, else the file holds something else and is refused."""
    info = f.tensors["rope_freqs.weight"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    if info.ggml_type != "F32" or tuple(info.shape) != (head_dim // 2,):
        raise TformerError(f"GGUF file {f.path}: rope_freqs is {info.ggml_type} {tuple(info.shape)}, not F32 "
                           f"({head_dim // 2},); the file is damaged")
    divisors = np.frombuffer(f.raw("rope_freqs.weight").tobytes(), dtype=np.float32).astype(np.float64)
    theta = config["rope_theta"]
    wavelength = 2 * math.pi * theta ** (np.arange(0, head_dim, 2) / head_dim)
    factor = float(divisors.max())
    blend = (1 / divisors - 1 / factor) / (1 - 1 / factor) if factor > 1 else np.ones_like(divisors)
    medium = (divisors > 1 + 1e-6) & (divisors < factor * (1 - 1e-6))
    low, high = 1.0, 4.0
    if medium.sum() >= 2:  # original / wavelength = low + blend (high - low): two unknowns, least squares
        rows = np.stack([1 / wavelength[medium], -blend[medium]], axis=1)
        (original, spread), *_ = np.linalg.lstsq(rows, np.full(int(medium.sum()), low), rcond=None)
        high = low + spread
    elif medium.any():
        original = (low + blend[medium][0] * (high - low)) * wavelength[medium][0]
    else:  # no blended frequency: any original between the kept and the stretched wavelengths gives the same
        kept, stretched = wavelength[divisors <= 1 + 1e-6], wavelength[divisors > 1 + 1e-6]
        original = float(np.sqrt(high * kept.max() * stretched.min())) if len(kept) and len(stretched) else 8192.0
    # rounded as a config.json holds them (the divisors are float32: 3.9999992 is Llama's 4)
    spec = {"rope_type": "llama3", "rope_theta": theta, "factor": round(factor, 4), "low_freq_factor": low,
            "high_freq_factor": round(float(high), 4), "original_max_position_embeddings": int(round(float(original)))}
    # the parameters found must give the file's divisors back
    s = np.clip((spec["original_max_position_embeddings"] / wavelength - low) / (spec["high_freq_factor"] - low), 0, 1)
    again = 1 / ((1 - s) / spec["factor"] + s)
    if not (high > low and np.allclose(again, divisors, rtol=1e-4)):
        raise TformerError(f"GGUF file {f.path}: its rope_freqs are not Llama 3's scaling rule; tformer does not "
                           "support other RoPE frequency factors yet")
    return spec


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
