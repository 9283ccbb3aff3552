"""Reading single values out of a Hugging Face config.json, shared by every family's reader
(tformer.interop.hf_config for the text models, tformer.interop.hf_vision for ViT and CLIP)."""

from __future__ import annotations

import math
import warnings
from typing import Any

from tformer.core.errors import TformerError
from tformer.core.files import described

# HF activation names -> ours. "gelu" in HF is the exact erf form; gelu_new and
# gelu_pytorch_tanh are both the tanh approximation.
ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu",
    "swish": "silu",
}
# ViT and CLIP also read quick_gelu, x * sigmoid(1.702 x) (CLIP's; no text family here was released with it).
VISION_ACTIVATIONS = {**ACTIVATIONS, "quick_gelu": "quick_gelu"}
ACTIVATION_OUT = {"relu": "relu", "gelu": "gelu", "gelu_tanh": "gelu_new", "silu": "silu", "quick_gelu": "quick_gelu"}


def activation(name: Any, model_type: str, table: dict[str, str] = ACTIVATIONS) -> str:
    if name not in table:
        raise TformerError(
            f"{model_type} activation '{name}' is not supported; supported: {', '.join(table)}"
        )
    return table[name]


def refuse(model_type: str, problem: str) -> None:
    raise TformerError(f"this {model_type} config sets {problem}, which tformer's model cannot reproduce")


def token_id(d: dict, key: str, default: Any = None) -> int | None:
    value = d.get(key, default)
    if isinstance(value, list):  # several stop ids (Llama 3): our config keeps one
        if not value:
            return None
        if len(value) > 1:
            warnings.warn(f"config {key}={value} lists several ids; tformer keeps the first, {value[0]}", stacklevel=3)
        value = value[0]
    return value


def dropouts(model_type: str, **values: float) -> dict[str, float]:
    """Our three dropout rates from HF's; several HF rates folded into one take the largest."""
    out = {}
    for ours, rates in values.items():
        rates = [float(r) for r in (rates if isinstance(rates, (list, tuple)) else [rates]) if r is not None]
        if len(set(rates)) > 1:
            warnings.warn(f"{model_type} dropout rates {rates} share one setting in tformer ({ours}); "
                          f"using {max(rates)}", stacklevel=3)
        out[ours] = max(rates) if rates else 0.0
    return out


def labels_out(n: int) -> dict:
    """id2label / label2id for ``n`` classes, as save_pretrained writes them (num_labels is read off id2label)."""
    return dict(id2label={str(i): f"LABEL_{i}" for i in range(n)}, label2id={f"LABEL_{i}": i for i in range(n)})


# The JSON type of every config.json key a reader reads (tformer.interop.hf_config, hf_vision, hf_heads), checked
# before any reader runs: a wrong-typed value would otherwise end in arithmetic on a string (4 * "8" is "8888"),
# an unhashable lookup or a null read as "absent" where transformers reads it as false. Keys not listed are not read.
_COUNTS = ("max_position_embeddings", "original_max_position_embeddings")  # divided by in YaRN's factor
_WHOLE = ("n_layer", "n_embd", "n_head", "n_inner", "vocab_size", "n_positions", "hidden_size",
          "num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size", "num_hidden_layers",
          "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads", "encoder_ffn_dim",
          "decoder_ffn_dim", "d_model", "num_layers", "num_decoder_layers", "num_heads", "d_kv", "d_ff",
          "relative_attention_num_buckets", "relative_attention_max_distance", "n_layers", "dim", "n_heads",
          "hidden_dim", "num_hidden_groups", "inner_group_num", "embedding_size", "type_vocab_size", "num_channels",
          "num_labels", "projection_dim", "sliding_window", "query_pre_attn_scalar", "sliding_window_pattern")
_NUMBERS = ("layer_norm_epsilon", "layer_norm_eps", "rms_norm_eps", "rope_theta", "rope_local_base_freq", "resid_pdrop",
            "embd_pdrop", "final_logit_softcapping", "attn_logit_softcapping", "attn_pdrop", "attention_dropout", "hidden_dropout_prob", "attention_probs_dropout_prob", "dropout",
            "activation_dropout", "dropout_rate", "logit_scale_init_value")
_BOOLS = ("scale_attn_by_inverse_layer_idx", "add_cross_attention", "scale_attn_weights", "attention_bias", "mlp_bias",
          "is_decoder", "tie_word_embeddings", "normalize_before", "add_final_layer_norm", "add_bias_logits",
          "static_position_embeddings", "normalize_embedding", "scale_embedding", "scale_decoder_outputs", "qkv_bias",
          "sinusoidal_pos_embds")
_STRINGS = ("model_type", "activation_function", "hidden_act", "activation", "feed_forward_proj",
            "position_embedding_type")
# What transformers itself writes as null (n_inner, rope_scaling, ...): there null means "not set".
_NULLABLE = {"n_inner", "num_key_value_heads", "head_dim", "num_decoder_layers", "sliding_window",
             "original_max_position_embeddings", "problem_type", "_name_or_path", "architectures", "id2label",
             "rope_scaling", "rope_parameters", "text_config", "vision_config", "attention_factor", "mscale",
             "mscale_all_dim", "beta_fast", "beta_slow", "factor", "pad_token_id", "bos_token_id", "eos_token_id",
             "decoder_start_token_id", "final_logit_softcapping", "attn_logit_softcapping"}
HF_KEY_KINDS = {**dict.fromkeys(_COUNTS, "count"), **dict.fromkeys(_WHOLE, "whole"),
                **dict.fromkeys(_NUMBERS, "number"), **dict.fromkeys(_BOOLS, "bool"),
                **dict.fromkeys(_STRINGS, "string"), "problem_type": "string", "_name_or_path": "string",
                **dict.fromkeys(("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"), "ids"),
                "architectures": "names", "id2label": "object", "image_size": "size", "patch_size": "size",
                "rope_scaling": "rope", "rope_parameters": "rope", "text_config": "tower", "vision_config": "tower"}
ROPE_KEY_KINDS = {"rope_type": "string", "type": "string", "rope_theta": "number", "factor": "positive",
                  "original_max_position_embeddings": "count", "attention_factor": "number", "mscale": "number",
                  "mscale_all_dim": "number", "beta_fast": "number", "beta_slow": "number", "truncate": "bool",
                  # Gemma 3: one set per layer type
                  "full_attention": "rope", "sliding_attention": "rope"}
_EXPECTED = {"count": "a positive whole number", "whole": "a whole number", "number": "a finite number",
             "positive": "a finite positive number", "bool": "true or false", "string": "a string",
             "ids": "a token id (a whole number), a list of them or null", "names": "a list of class names (strings)",
             "object": "an object", "size": "a whole number or a list of two",
             "rope": "an object (RoPE scaling's settings)", "tower": "an object (the tower's config)"}


def _whole(value: Any) -> int | None:
    """``value`` as an int if it is a whole number (4.0 is: JSON writers differ), else None; never a bool."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int past 1e308
        return None
    return number if math.isfinite(number) else None


def _checked_value(kind: str, value: Any, key: str, model_type: str) -> tuple[bool, Any]:
    """(whether ``value`` is of ``kind``, the value to read: whole numbers as int, nested objects checked)."""
    if kind in ("count", "whole"):
        n = _whole(value)
        return n is not None and (kind == "whole" or n >= 1), n
    if kind in ("number", "positive"):
        x = _finite(value)
        return x is not None and (kind == "number" or x > 0), value if isinstance(value, int) else x
    if kind == "bool":
        return isinstance(value, bool), value
    if kind == "string":
        return isinstance(value, str), value
    if kind == "ids":
        items = value if isinstance(value, list) else [value]
        ids = [_whole(v) for v in items]
        return all(i is not None for i in ids), ids if isinstance(value, list) else ids[0]
    if kind == "names":
        return isinstance(value, list) and all(isinstance(v, str) for v in value), value
    if kind == "size":
        if isinstance(value, list):
            sides = [_whole(v) for v in value]
            return len(sides) == 2 and None not in sides, sides
        return _whole(value) is not None, _whole(value)
    if kind in ("object", "rope", "tower"):
        if not isinstance(value, dict):
            return False, value
        if kind == "rope":
            return True, checked_config(value, model_type, f"{key}.", ROPE_KEY_KINDS)
        if kind == "tower":
            return True, checked_config(value, model_type, f"{key}.")
        return True, value
    raise AssertionError(f"unknown kind {kind}")


def checked_config(d: dict, model_type: Any = None, prefix: str = "", kinds: dict[str, str] | None = None) -> dict:
    """A copy of a Hugging Face config.json (as a dict) whose every key a reader reads holds the JSON type it
    must; the first that does not is one TformerError naming the key, what it holds and what it should."""
    kinds = HF_KEY_KINDS if kinds is None else kinds
    family = model_type if isinstance(model_type, str) and len(model_type) <= 40 else "Hugging Face"
    out = dict(d)
    for key, kind in kinds.items():
        if key not in d:
            continue
        value = d[key]
        if value is None:
            if key in _NULLABLE:
                continue
            ok = False
        else:
            ok, out[key] = _checked_value(kind, value, prefix + key, model_type)
        if not ok:
            raise TformerError(f"{family} config key '{prefix}{key}' must be {_EXPECTED[kind]}, "
                               f"got {described(value)}")
    return out
