"""The same function as ``reference`` through PyTorch's fused kernels (flash / memory-efficient / math)."""

from __future__ import annotations

import torch.nn.functional as F

from tformer.model.masks import AttentionMask


def sdpa(q, k, v, mask: AttentionMask, scale: float, dropout_p: float = 0.0):
    """q (B, H, Tq, D); k, v (B, H_kv, Tk, D). Returns (out (B, H, Tq, D), None): fused kernels keep no weights.

    Grouped queries (H_kv < H) go to the kernel as they are (enable_gqa): each key/value head is read once for its
    H / H_kv query heads, never copied per query head (a decode step reads the whole cache: copying it would
    multiply its bytes by the group size)."""
    bias = mask.bias
    if bias is not None and bias.dtype != q.dtype:  # a mixed-dtype float mask silently gives wrong outputs
        bias = bias.to(q.dtype)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout_p, is_causal=mask.is_causal,
                                         scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    if mask.dead_rows is not None:
        out = out.masked_fill(mask.dead_rows, 0.0)
    return out, None
