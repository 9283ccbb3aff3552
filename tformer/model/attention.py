"""Scaled dot-product attention, two ways, and multi-head attention with a KV cache.

Layouts: q (B, H, Tq, D), k and v (B, H_kv, Tk, D); H_kv divides H (MHA: equal, GQA: fewer,
MQA: one). Each key/value head serves H / H_kv consecutive query heads.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from tformer.model.linear import Linear
from tformer.model.masks import AttentionMask, causal_mask
from tformer.model.position import apply_rope


def attention_reference(q, k, v, mask: AttentionMask, scale: float, dropout_p: float = 0.0):
    """Attention(Q, K, V) = softmax(Q K^T * scale + bias) V, step by step. Returns (output, weights)."""
    k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    scores = torch.matmul(q, k.transpose(-2, -1))  # (B, H, Tq, Tk): every query against every key
    scores = scores * scale
    if mask.is_causal:
        allowed = causal_mask(q.shape[-2], k.shape[-2], q.device)
        scores = scores.masked_fill(~allowed, float("-inf"))
    elif mask.bias is not None:
        scores = scores + mask.bias  # -inf where a key is hidden, plus any position bias
    weights = torch.softmax(scores, dim=-1)  # each row: a distribution over keys
    if mask.dead_rows is not None:
        weights = weights.masked_fill(mask.dead_rows, 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    output = torch.matmul(weights, v)  # (B, H, Tq, D): weighted sum of values
    return output, weights


def attention_sdpa(q, k, v, mask: AttentionMask, scale: float, dropout_p: float = 0.0):
    """The same function through PyTorch's fused kernels (flash / memory-efficient / math)."""
    if k.shape[1] != q.shape[1]:
        k, v = _expand_kv(k, q.shape[1]), _expand_kv(v, q.shape[1])
    out = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask.bias, dropout_p=dropout_p, is_causal=mask.is_causal, scale=scale
    )
    if mask.dead_rows is not None:
        out = out.masked_fill(mask.dead_rows, 0.0)
    return out


def _expand_kv(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Repeat each key/value head for the query heads of its group: (B, H_kv, T, D) -> (B, H, T, D)."""
    groups = n_heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


class MultiHeadAttention(nn.Module):
    """Project to heads, attend, concatenate heads, project back (Vaswani et al. 2017, section 3.2.2).

    Self-attention reads keys and values from x; cross-attention from the encoder output
    (``memory``), whose projections are computed once and kept in the cache during decoding.
    """

    def __init__(self, config, layer_idx: int, cross: bool = False):
        super().__init__()
        d, self.n_heads, self.n_kv_heads, self.head_dim = config.d_model, config.n_heads, config.n_kv_heads, config.head_dim
        self.layer_idx, self.cross = layer_idx, cross
        self.q_proj = Linear(d, self.n_heads * self.head_dim, bias=config.bias)
        self.k_proj = Linear(d, self.n_kv_heads * self.head_dim, bias=config.bias)
        self.v_proj = Linear(d, self.n_kv_heads * self.head_dim, bias=config.bias)
        self.o_proj = Linear(self.n_heads * self.head_dim, d, bias=config.bias)
        self.scale = 1.0 / math.sqrt(self.head_dim) if config.scale_attention else 1.0
        self.dropout_p = config.attention_dropout
        self.impl = config.attn_impl

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)  # (B, n, T, head_dim)

    def forward(self, x, mask: AttentionMask, memory=None, rope=None, cache=None, need_weights: bool = False):
        """x: (B, T, d_model) -> ((B, T, d_model), weights (B, H, T, Tk) or None)."""
        q = self._heads(self.q_proj(x), self.n_heads)
        if self.cross and cache is not None and cache.has_cross(self.layer_idx):
            k, v = cache.get_cross(self.layer_idx)
        else:
            source = memory if self.cross else x
            k = self._heads(self.k_proj(source), self.n_kv_heads)
            v = self._heads(self.v_proj(source), self.n_kv_heads)
            if rope is not None:
                cos, sin = rope
                q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            if cache is not None:
                if self.cross:
                    cache.set_cross(self.layer_idx, k, v)
                else:
                    k, v = cache.update(self.layer_idx, k, v)

        dropout_p = self.dropout_p if self.training else 0.0
        weights = None
        if need_weights or self.impl == "reference":
            out, weights = attention_reference(q, k, v, mask, self.scale, dropout_p)
        else:
            out = attention_sdpa(q, k, v, mask, self.scale, dropout_p)
        B, _, T, _ = out.shape
        out = out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim)  # concatenate heads
        return self.o_proj(out), (weights if need_weights else None)
