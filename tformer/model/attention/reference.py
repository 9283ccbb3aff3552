"""Attention as the paper writes it: scores, softmax, weighted sum — the only kind that returns weights."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tformer.model.attention.groups import expand_kv
from tformer.model.masks import AttentionMask, causal_mask


def reference(q, k, v, mask: AttentionMask, scale: float, dropout_p: float = 0.0):
    """softmax(Q K^T * scale + bias) V, step by step.

    q (B, H, Tq, D); k, v (B, H_kv, Tk, D) with H_kv dividing H.
    Returns (out (B, H, Tq, D), weights (B, H, Tq, Tk)).
    """
    k, v = expand_kv(k, q.shape[1]), expand_kv(v, q.shape[1])
    scores = torch.matmul(q, k.transpose(-2, -1))  # (B, H, Tq, Tk): every query against every key
    # Scale and mask in place: the scores are this call's own fresh tensor and the matmul's backward
    # needs q and k, not its output, so autograd allows it; out of place, each would write another
    # (B, H, Tq, Tk) tensor and read it back (masked_fill clones first), the largest tensors of the layer.
    if scale != 1.0:
        scores.mul_(scale)
    if mask.is_causal:
        allowed = causal_mask(q.shape[-2], k.shape[-2], q.device)
        scores.masked_fill_(~allowed, float("-inf"))
    elif mask.bias is not None:
        scores.add_(mask.bias)  # -inf where a key is hidden, plus any position bias
    weights = torch.softmax(scores, dim=-1)  # each row: a distribution over keys
    if mask.dead_rows is not None:
        weights = weights.masked_fill(mask.dead_rows, 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    output = torch.matmul(weights, v)  # (B, H, Tq, D): weighted sum of values
    return output, weights
