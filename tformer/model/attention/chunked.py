"""Chunked query attention: exact attention one chunk of ``block`` queries at a time, each chunk against
every key, so the largest tensor is one chunk's (chunk, Tk) scores, not the (Tq, Tk) matrix.

Softmax runs along keys, and every chunk sees all its keys, so each chunk is plain softmax attention
(no running max as in ``tiled``). For training each chunk is checkpointed
(torch.utils.checkpoint, use_reentrant=False): the forward keeps only the chunk's inputs (views of
Q, K, V, no copies), and the backward recomputes one chunk's weights at a time, so the backward's
peak is also chunk x Tk, at the price of recomputing every chunk's weights (Q K^T and softmax; the
non-reentrant checkpoint stops there, the product with V is not rerun). Dropout works: the checkpoint
restores the RNG state, so the recomputed chunk drops the same weights.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from tformer.core.errors import TformerError
from tformer.model.attention.kind import AttentionKind
from tformer.model.attention.tiled import block_allowed, fold_bias, fold_heads
from tformer.model.masks import AttentionMask


def _chunk(qc, k, v, bias_c, mask: AttentionMask, scale: float, dropout_p: float, q0: int):
    """One chunk: qc (B, H_kv, g, c, D) against k, v (B, H_kv, Tk, D) -> (B, H_kv, g, c, D)."""
    B, kv, g, c, D = qc.shape
    tk = k.shape[2]
    scores = torch.matmul(qc.reshape(B, kv, g * c, D), k.transpose(-2, -1)).view(B, kv, g, c, tk)
    if scale != 1.0:
        scores = scores * scale
    if bias_c is not None:
        scores = scores + bias_c.to(scores.dtype)
    allowed = block_allowed(mask, q0, q0 + c, 0, tk)
    dead = None
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
        dead = ~allowed.any(dim=-1, keepdim=True)  # no key at all: attend anywhere, zero the output below
        scores = scores.masked_fill(dead, 0.0)
    weights = torch.softmax(scores, dim=-1)
    if dead is not None:
        weights = weights.masked_fill(dead, 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    return torch.matmul(weights.reshape(B, kv, g * c, tk), v).view(B, kv, g, c, D)


def chunked_attention(q, k, v, mask: AttentionMask, scale: float, dropout_p: float = 0.0, block: int = 64):
    """Exact attention, ``block`` queries at a time against all Tk keys (checkpointed when training).

    q (B, H, Tq, D); k, v (B, H_kv, Tk, D), H_kv dividing H; mask: padding, causality, queries offset,
    position bias (B|1, H|1, Tq, Tk). Returns (out (B, H, Tq, D), None).
    """
    if block < 1:
        raise TformerError(f"chunked attention needs a chunk of at least 1 query, got {block}; set attn_block")
    kv = k.shape[1]
    q5, bias5 = fold_heads(q, kv), fold_bias(mask.position_bias, kv)
    inputs = (q, k, v) if bias5 is None else (q, k, v, bias5)
    # Checkpoint only when a backward will run: in inference the chunk's weights are freed anyway.
    training = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
    outs = []
    for q0 in range(0, q.shape[2], block):
        q1 = min(q0 + block, q.shape[2])
        args = (q5[:, :, :, q0:q1], k, v, None if bias5 is None else bias5[..., q0:q1, :], mask, scale, dropout_p, q0)
        outs.append(checkpoint(_chunk, *args, use_reentrant=False) if training else _chunk(*args))
    out = torch.cat(outs, dim=3) if len(outs) > 1 else outs[0]
    return out.view(q.shape), None


class Chunked(AttentionKind):
    """The "chunked" kind: ``chunked_attention`` with the layer's ``attn_block`` as the chunk size."""

    def forward(self, q, k, v, mask, scale: float, dropout_p: float = 0.0):
        return chunked_attention(q, k, v, mask, scale, dropout_p, block=self.options.block)
