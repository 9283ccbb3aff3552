"""Attention over a preallocated KV cache (tformer.model.slot_cache): every column of the buffers, under a bias.

The attention kinds read keys as long as the sequence; here the keys are the cache's whole buffers, of a
fixed length, and which columns a query sees is in the bias the cache built (causal, padding, the layer's
window, any position bias). So one exact formula serves every kind a preallocated cache holds (exact and
sliding-window), and its shapes never change from one decode step to the next.

Written out rather than through a fused kernel: with one query per row (a decode step) the products are
two small matrix-vector products that the compiler fuses with the softmax. Query heads are grouped under
their key/value head (G = H / H_kv), so grouped-query attention reads the buffers without copying them per head.
"""

from __future__ import annotations

import torch


def attend_cached(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, scale: float,
                  need_weights: bool = False):
    """q (N, H, T, D); k, v (N, H_kv, L, D), the whole buffers; bias (N, 1|H, T, L) additive.
    Returns (out (N, H, T, D), weights (N, H, T, L) if ``need_weights`` else None)."""
    N, H, T, D = q.shape
    H_kv, L = k.shape[1], k.shape[2]
    G = H // H_kv
    scores = torch.matmul(q.reshape(N, H_kv, G * T, D), k.transpose(-1, -2)) * scale  # (N, H_kv, G*T, L)
    scores = scores.view(N, H_kv, G, T, L) + bias.to(q.dtype).reshape(N, -1, G if bias.shape[1] > 1 else 1, T, L)
    weights = scores.softmax(dim=-1)
    out = torch.matmul(weights.view(N, H_kv, G * T, L), v)  # (N, H_kv, G*T, D)
    return out.view(N, H, T, D), (weights.reshape(N, H, T, L) if need_weights else None)


__all__ = ["attend_cached"]
