"""Reading single values out of a Hugging Face config.json, shared by every family's reader
(tformer.interop.hf_config for the text models, tformer.interop.hf_vision for ViT and CLIP)."""

from __future__ import annotations

import warnings
from typing import Any

from tformer.core.errors import TformerError

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
