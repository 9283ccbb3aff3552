"""Closed-form counts the course and the textbook use, for layouts our config cannot express
(e.g. attention without biases but an FFN with them) or that are not about one model at all.

They are built from the same primitives as the ledger (tformer.cost.ops), so a textbook formula
and a ledger row cannot disagree about what a linear layer or a norm costs.
"""

from __future__ import annotations

import math

from tformer.cost.ops import linear_params, norm_params


def attention_params(d: int, bias: bool = False, kv_dim: int | None = None) -> int:
    """Q, K, V, O projections of one attention block (kv_dim < d: grouped-query attention)."""
    kv = d if kv_dim is None else kv_dim
    return linear_params(d, d, bias) * 2 + linear_params(d, kv, bias) * 2


def ffn_params(d: int, d_ff: int, bias: bool = True, gated: bool = False) -> int:
    return linear_params(d, d_ff, bias) * (2 if gated else 1) + linear_params(d_ff, d, bias)


def layer_params(d: int, d_ff: int, *, attn_bias: bool, ffn_bias: bool, norms: int = 2,
                 norm: str = "layernorm", cross_attention: bool = False, gated: bool = False) -> int:
    """One Transformer layer: self-attention (+ cross-attention), FFN, ``norms`` norms."""
    attn = attention_params(d, attn_bias) * (2 if cross_attention else 1)
    return attn + ffn_params(d, d_ff, ffn_bias, gated) + norms * norm_params(d, norm)


def embedding_params(rows: int, d: int) -> int:
    """A lookup table (tokens, positions or segments): rows x d."""
    return rows * d


def lora_params(layers: int, matrices_per_layer: int, rank: int, d_in: int, d_out: int | None = None) -> int:
    """LoRA adapters: each adapted d_in x d_out matrix gets A (rank x d_in) and B (d_out x rank)."""
    d_out = d_in if d_out is None else d_out
    return layers * matrices_per_layer * rank * (d_in + d_out)


def elementwise_flops(elements: int, flops_per_element: float) -> float:
    """An element-wise op's count: elements x the FLOPs charged per element (a convention, not a matmul)."""
    return elements * flops_per_element


def fraction(part: float, whole: float) -> float:
    """A plain fraction (0.56, not 56%)."""
    return part / whole


# Learning-rate schedules and Adam's step size: closed forms of the step, checked by hand against the
# textbook's cases; the training loop's schedules call these.
def warmup_cosine(step: int, lr_max: float, warmup: int, total: int, lr_min: float = 0.0) -> float:
    """Linear warmup to lr_max over ``warmup`` steps, then a half cosine down to lr_min at ``total``."""
    if warmup > 0 and step <= warmup:
        return lr_max * step / warmup
    if step >= total:
        return lr_min
    progress = (step - warmup) / max(1, total - warmup)
    return lr_min + 0.5 * (lr_max - lr_min) * (1.0 + math.cos(math.pi * progress))


def warmup_linear(step: int, lr_max: float, warmup: int, total: int, lr_min: float = 0.0) -> float:
    """Linear warmup, then linear decay to lr_min at ``total`` (BERT's schedule)."""
    if warmup > 0 and step <= warmup:
        return lr_max * step / warmup
    if step >= total:
        return lr_min
    return lr_min + (lr_max - lr_min) * (total - step) / max(1, total - warmup)


def noam(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The 2017 paper's schedule: d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).

    Rises linearly for ``warmup`` steps, then decays as the inverse square root of the step.
    """
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def adam_effective_step(alpha: float, beta1: float, beta2: float, t: int) -> float:
    """Size of Adam's first bias-corrected step scale alpha * sqrt(1 - beta2^t) / (1 - beta1^t)."""
    return alpha * math.sqrt(1 - beta2**t) / (1 - beta1**t)
