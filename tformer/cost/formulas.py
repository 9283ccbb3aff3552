"""Closed-form counts the course and the textbook use, for layouts our config cannot express
(e.g. attention without biases but an FFN with them) or that are not about one model at all.

They are built from the same primitives as the ledger (tformer.cost.ops), so a textbook formula
and a ledger row cannot disagree about what a linear layer or a norm costs.
"""

from __future__ import annotations

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


# Learning-rate formulas live with the training code; re-exported so the cost calculator and the
# textbook cases reach them through one namespace.
def noam_lr(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    from tformer.train.schedule import noam

    return noam(step, d_model, warmup, factor)


def adam_effective_step(alpha: float, beta1: float, beta2: float, t: int) -> float:
    from tformer.train.schedule import adam_effective_step as f

    return f(alpha, beta1, beta2, t)


def warmup_linear_lr(step: int, lr_max: float, warmup: int, total: int, lr_min: float = 0.0) -> float:
    from tformer.train.schedule import warmup_linear

    return warmup_linear(step, lr_max, warmup, total, lr_min)


def warmup_cosine_lr(step: int, lr_max: float, warmup: int, total: int, lr_min: float = 0.0) -> float:
    from tformer.train.schedule import warmup_cosine

    return warmup_cosine(step, lr_max, warmup, total, lr_min)
