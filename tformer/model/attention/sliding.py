"""Sliding-window attention (Longformer's local window; Mistral's ``sliding_window``), computed with
gathered blocks so that FLOPs and memory grow with n·w, not n².

The window, exactly as Hugging Face defines it (transformers.masking_utils: ``sliding_window_overlay``
and ``sliding_window_bidirectional_overlay``), for a query at position i and a key at position j:

    causal (Mistral)    i - w < j <= i        the w most recent positions, the query's own included
    bidirectional       |i - j| <= w          w on each side (2w + 1 keys), for encoders

With dilation d the same window is laid over every d-th position: the keys differ from the query by
a multiple of d, (i - j) / d counted as above (causal: i, i-d, ..., i-(w-1)d; w keys spanning
(w-1)·d + 1 positions). So every key a query sees shares its residue mod d: the sequence is permuted
into d residue classes (d rows of every d-th position) and the undilated window runs on each row.

How it is computed: each row's queries are cut into blocks of b = min(w, row length) consecutive
queries; each block is scored against the one contiguous span of keys its window can reach (causal:
b + w - 1 keys, the block's own and the previous w - 1; bidirectional: b + 2w, the previous and next
w as well), gathered by index and never wider than the keys there are (a window wider than the
sequence costs what dense attention does). Scores are (B, H, rows, blocks, b, span): about n·2w,
never n². Pairs inside a span but outside a query's window, keys beyond the sequence, padding (the
mask's ``keep``) and, causal, keys after the query are masked; a query with no allowed key gets 0.
Positions are the mask's (query i at ``q_start + i``, key j at ``k_start + j``), so cached decode
(Tq < Tk) and a rolling cache whose keys start at k_start > 0 work unchanged.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tformer.core.errors import TformerError
from tformer.cost.attention_sliding import BlockPlan, block_plan
from tformer.model.attention.groups import expand_kv
from tformer.model.attention.kind import AttentionKind
from tformer.model.attention.sdpa import sdpa
from tformer.model.masks import AttentionMask


def in_window(delta: torch.Tensor, window: int, dilation: int, causal: bool) -> torch.Tensor:
    """True where a key ``delta = i - j`` positions before its query lies in the window (the definition
    above; tests build the dense reference mask from this predicate)."""
    on_grid = delta.remainder(dilation) == 0
    steps = torch.div(delta, dilation, rounding_mode="floor")
    if causal:
        return on_grid & (steps >= 0) & (steps < window)
    return on_grid & (steps.abs() <= window)


def _indices(mask: AttentionMask, plan: BlockPlan, window: int, dilation: int, causal: bool, device):
    """Query and key indices of every gathered block, their positions and which are real.

    Returns q_idx (R, N, b) and k_idx (R, N, S) clamped into range, k_ok (R, N, S) bool (a key of the
    sequence), q_pos / k_pos positions. R rows (residues), N blocks, b queries per block, S keys per span."""
    first = mask.q_start
    residues = (first + torch.arange(plan.rows, device=device)) % dilation  # the classes that hold queries
    base = first // dilation  # the first compressed position (position // d) of any query
    col = torch.arange(plan.blocks * plan.block, device=device).view(plan.blocks, plan.block)
    q_pos = (base + col)[None] * dilation + residues[:, None, None]  # (R, N, b)
    lead = window - 1 if causal else window
    start = base + torch.arange(plan.blocks, device=device) * plan.block - lead  # each span's first (compressed)
    # A span wider than a block's reach is kept inside the keys there are (a window wider than the sequence).
    k_base = mask.k_start // dilation
    k_last = (mask.k_start + mask.tk - 1) // dilation
    start = start.clamp(min=k_base).clamp(max=k_last - plan.span + 1)
    k_comp = start[:, None] + torch.arange(plan.span, device=device)  # (N, S)
    k_pos = k_comp[None] * dilation + residues[:, None, None]  # (R, N, S)
    q_rel, k_rel = q_pos - mask.q_start, k_pos - mask.k_start
    k_ok = (k_rel >= 0) & (k_rel < mask.tk)
    return q_rel.clamp(0, mask.tq - 1), k_rel.clamp(0, mask.tk - 1), k_ok, q_pos, k_pos


def sliding_attention(q, k, v, mask: AttentionMask, scale: float, dropout_p: float = 0.0, *,
                      window: int, dilation: int = 1):
    """Window attention over gathered blocks. q (B, H, Tq, D); k, v (B, H_kv, Tk, D).
    Returns (out (B, H, Tq, D), None)."""
    if mask.position_bias is not None:
        raise TformerError("sliding attention adds no position bias (ALiBi / relative); use rope or learned positions")
    B, H, Tq, D = q.shape
    causal = mask.causal
    plan = block_plan(Tq, mask.tk, mask.q_start, mask.k_start, window, dilation, causal)
    q_idx, k_idx, k_ok, q_pos, k_pos = _indices(mask, plan, window, dilation, causal, q.device)

    qb = q[:, :, q_idx.flatten()].view(B, H, plan.rows, plan.blocks, plan.block, D)
    kb = k[:, :, k_idx.flatten()].view(B, k.shape[1], plan.rows, plan.blocks, plan.span, D)
    vb = v[:, :, k_idx.flatten()].view(B, v.shape[1], plan.rows, plan.blocks, plan.span, D)
    kb, vb = expand_kv(kb, H), expand_kv(vb, H)
    scores = torch.matmul(qb, kb.transpose(-2, -1))  # (B, H, R, N, b, S)
    if scale != 1.0:
        scores = scores * scale

    # Which pairs count: in the window (which also keeps a causal key at or before its query), a real key
    # of the sequence, and not padding.
    allowed = in_window(q_pos[..., :, None] - k_pos[..., None, :], window, dilation, causal)
    allowed = (allowed & k_ok[..., None, :])[None, None]  # (1, 1, R, N, b, S)
    if mask.keep is not None:
        allowed = allowed & mask.keep.bool()[:, k_idx][:, None, :, :, None, :]  # (B, 1, R, N, 1, S)
    dead = ~allowed.any(dim=-1, keepdim=True)
    # A row with no key would be softmax over nothing (NaN): it attends to its span and is zeroed after.
    weights = torch.softmax(scores.masked_fill(~(allowed | dead), float("-inf")), dim=-1)
    weights = weights.masked_fill(dead, 0.0)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    out = torch.matmul(weights, vb)  # (B, H, R, N, b, D)

    # Back to sequence order: query i sits at one slot of the (R, N, b) grid.
    # Query i (position p = q_start + i) sits in row i mod d (its residue class), column p // d - q_start // d.
    i = torch.arange(Tq, device=q.device)
    first = mask.q_start
    order = (i % dilation) * (plan.blocks * plan.block) + (first + i) // dilation - first // dilation
    return out.reshape(B, H, -1, D)[:, :, order], None


class SlidingAttention(AttentionKind):
    """Registered as "sliding": window w = options.window, dilation d = options.dilation (this layer's)."""

    def __init__(self, options, n_heads: int, head_dim: int):
        super().__init__(options, n_heads, head_dim)
        if options.window is None:
            raise TformerError("sliding attention needs a window; set attn_window (e.g. --set attn_window=256)")
        self.window, self.dilation = options.window, options.dilation

    def forward(self, q, k, v, mask, scale: float, dropout_p: float = 0.0):
        if mask.complete:  # a preallocated cache's mask already holds this layer's window (AttentionMask.given)
            return sdpa(q, k, v, mask, scale, dropout_p)
        return sliding_attention(q, k, v, mask, scale, dropout_p, window=self.window, dilation=self.dilation)

    def dense_mask(self, mask: AttentionMask) -> AttentionMask:
        """``mask`` with the window laid over it as a (1, 1, Tq, Tk) bias (-inf outside): the reference kind under
        it computes this layer's attention with its weights written out (the attention maps)."""
        if mask.complete:
            return mask
        q_pos = mask.q_start + torch.arange(mask.tq, device=mask.device)
        k_pos = mask.k_start + torch.arange(mask.tk, device=mask.device)
        inside = in_window(q_pos[:, None] - k_pos[None, :], self.window, self.dilation, mask.causal)
        band = torch.zeros(inside.shape, dtype=mask.dtype, device=mask.device).masked_fill(~inside, float("-inf"))
        bias = band[None, None] if mask.position_bias is None else mask.position_bias + band
        return AttentionMask(mask.tq, mask.tk, causal=mask.causal, keep=mask.keep, position_bias=bias,
                             q_start=mask.q_start, k_start=mask.k_start, dtype=mask.dtype, device=mask.device,
                             prefix=mask.prefix)

    def extra_repr(self) -> str:
        return f"window={self.window}, dilation={self.dilation}"


__all__ = ["SlidingAttention", "in_window", "sliding_attention"]
