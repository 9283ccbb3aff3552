"""Sparse attention with gathered blocks: the engine under strided, Longformer and BigBird.

softmax(Q K^T * scale) V over a fixed subset of pairs, formed without the n x n matrix. Queries fall in
blocks of b positions; each query block gathers a fixed-length list of m key blocks (a table built once
per sequence length and pattern, on the CPU, and cached), so scores are (B, H, n/b, b, m·b): FLOPs and
memory grow with n·m·b, never n². Inside the gathered blocks an element predicate (the pattern at token
level: the window's edge, its dilation) keeps the pairs the pattern allows, and with it padding,
causality and "each key block once" (a block listed twice in a row, say a random block that is also a
window block, counts once). Three extra parts share the same softmax (see tformer.core.sparse_layout):
strided columns, shared (global) keys, and dense global rows, which are computed apart and replace their
rows.

Shapes (B batch, H heads, Tq queries, Tk keys, D head size, b block, m slots, nqb / nkb query / key blocks):
  q (B, H, Tq, D), k and v (B, H_kv, Tk, D) -> out (B, H, Tq, D)
  gathered keys and values (B, H, nqb, m·b, D); scores (B, H, nqb, b, m·b [+ nkb columns] [+ g shared])
  dense rows (B, H, g_rows, Tk)
Queries are padded to whole blocks at both ends (their rows are dropped), keys at the end (never allowed).
A query with no allowed key outputs 0; no NaN reaches the output or the gradients.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tformer.core.errors import TformerError
from tformer.core.sparse_layout import SparseGeometry, sparse_geometry, window_blocks
from tformer.model.attention.groups import expand_kv
from tformer.model.attention.kind import AttentionKind
from tformer.model.masks import AttentionMask

LAYOUTS_KEPT = 8  # layouts cached per layer: a few sequence lengths, and the last decode steps


@dataclass(frozen=True)
class Layout:
    """One call's blocks, on the device: the static part of the pattern (no batch dependence)."""

    geometry: SparseGeometry
    table: torch.Tensor  # (nqb, m) key block per slot, -1 = none
    key_index: torch.Tensor  # (nqb, m·b) each gathered key's index into the padded keys (0 where none)
    allowed: torch.Tensor  # (nqb, b, m·b) pattern, causality, no duplicate block, key inside the sequence
    column_allowed: torch.Tensor | None  # (nqb, b, nkb) strided columns
    shared_allowed: torch.Tensor | None  # (nqb, b, g) shared keys


class BlockSparseKind(AttentionKind):
    """A sparse kind computed with gathered blocks. Subclasses say which pairs their pattern allows:
    ``pairs`` inside the gathered blocks, ``column_pairs`` (strided), ``extra_blocks`` (BigBird's random and
    global blocks); the engine does the rest. Cross-attention never comes here (multihead.py keeps it exact)."""

    def __init__(self, options, n_heads: int, head_dim: int):
        super().__init__(options, n_heads, head_dim)
        self._layouts: OrderedDict = OrderedDict()

    # The pattern (subclasses) ---------------------------------------------------------------------------
    def pairs(self, q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool) -> torch.Tensor | None:
        """Bool (broadcast of the positions): the pattern allows query q_pos to see key k_pos; None = all
        pairs in the gathered blocks. Causality is applied on top, so a causal rule may ignore the future."""
        return None

    def column_pairs(self, q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool) -> torch.Tensor:
        raise NotImplementedError

    def extra_blocks(self, c: int, geometry: SparseGeometry, causal: bool) -> list[int]:
        """Key blocks beyond the window for query block c (a fixed count; -1 = none)."""
        return []

    # The engine ------------------------------------------------------------------------------------------
    def forward(self, q, k, v, mask: AttentionMask, scale: float, dropout_p: float = 0.0):
        if mask.position_bias is not None:
            raise TformerError(f"attn_impl='{self.options.kind}' adds no position bias; use rope or learned positions")
        if mask.k_start != 0:
            raise TformerError(f"attn_impl='{self.options.kind}' needs every key from position 0 (no rolling cache)")
        return block_sparse_attention(q, k, v, mask, scale, dropout_p, self.layout(mask, q.device)), None

    def layout(self, mask: AttentionMask, device) -> Layout:
        key = (mask.tq, mask.tk, mask.q_start, bool(mask.causal), str(device))
        if key not in self._layouts:
            self._layouts[key] = self._build(mask.tq, mask.tk, mask.q_start, bool(mask.causal), device)
            if len(self._layouts) > LAYOUTS_KEPT:
                self._layouts.popitem(last=False)
        return self._layouts[key]

    def _build(self, tq: int, tk: int, q_start: int, causal: bool, device) -> Layout:
        geo = sparse_geometry(self.options, tq, tk, q_start, causal)
        b, nkb = geo.block, geo.k_blocks
        rows = []
        for c in range(geo.first, geo.first + geo.q_blocks):
            blocks = window_blocks(self.options, c, causal) + self.extra_blocks(c, geo, causal)
            rows.append([j if 0 <= j < nkb else -1 for j in blocks])
        table = torch.tensor(rows, dtype=torch.long).view(geo.q_blocks, geo.slots)
        fresh = table >= 0
        for s in range(1, geo.slots):  # a block already listed earlier in the row counts once
            fresh[:, s] &= ~(table[:, :s] == table[:, s:s + 1]).any(dim=1)
        q_pos = torch.arange(geo.first * b, (geo.first + geo.q_blocks) * b).view(geo.q_blocks, b, 1)
        k_pos = (table[:, :, None] * b + torch.arange(b)).view(geo.q_blocks, 1, geo.slots * b)
        allowed = fresh.repeat_interleave(b, dim=1)[:, None, :] & (k_pos < tk) & (k_pos >= 0)
        allowed = _pattern(allowed, self.pairs(q_pos, k_pos, causal), causal, q_pos, k_pos)
        allowed = allowed.expand(geo.q_blocks, b, geo.slots * b)
        column_allowed = shared_allowed = None
        if geo.columns:  # row r of query block c meets row r of every key block
            col_pos = (torch.arange(nkb) * b)[None, None, :] + torch.arange(b)[None, :, None]
            column_allowed = _pattern(col_pos < tk, self.column_pairs(q_pos, col_pos, causal), causal, q_pos, col_pos)
            column_allowed = column_allowed.expand(geo.q_blocks, b, nkb)
        if geo.shared:
            shared_pos = torch.arange(geo.shared)[None, None, :]
            shared_allowed = _pattern(torch.ones(1, 1, geo.shared, dtype=torch.bool), None, causal, q_pos, shared_pos)
            shared_allowed = shared_allowed.expand(geo.q_blocks, b, geo.shared)
        to = (lambda t: None if t is None else t.to(device))
        return Layout(geo, to(table), to(k_pos.clamp(min=0).view(geo.q_blocks, -1)), to(allowed), to(column_allowed),
                      to(shared_allowed))


def _pattern(allowed, pattern, causal, q_pos, k_pos):
    if pattern is not None:
        allowed = allowed & pattern
    return allowed & (k_pos <= q_pos) if causal else allowed


def _padding(keep: torch.Tensor | None, index: torch.Tensor, length: int):
    """keep (B, Tk) read at ``index`` (any shape, into keys padded to ``length``) -> (B, *index.shape), or None."""
    if keep is None:
        return None
    return F.pad(keep.bool(), (0, length - keep.shape[1]))[:, index]


def _softmax(scores: torch.Tensor, allowed: torch.Tensor | None, dropout_p: float) -> torch.Tensor:
    """Softmax over the last axis among allowed keys; a row with none gets weights 0 (never NaN)."""
    if allowed is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        dead = ~allowed.any(dim=-1, keepdim=True)
        # A dead row attends everywhere (finite), then is zeroed: softmax over nothing would be NaN.
        weights = torch.softmax(scores.masked_fill(~(allowed | dead), float("-inf")), dim=-1).masked_fill(dead, 0.0)
    return F.dropout(weights, p=dropout_p) if dropout_p > 0.0 else weights


def block_sparse_attention(q, k, v, mask: AttentionMask, scale: float, dropout_p: float, layout: Layout):
    """q (B, H, Tq, D), k and v (B, H_kv, Tk, D) -> (B, H, Tq, D), over the pairs ``layout`` allows."""
    geo = layout.geometry
    B, H, tq, D = q.shape
    b, nqb, nkb = geo.block, geo.q_blocks, geo.k_blocks
    k, v = expand_kv(k, H), expand_kv(v, H)
    front = mask.q_start - geo.first * b
    qb = F.pad(q, (0, 0, front, nqb * b - tq - front)).view(B, H, nqb, b, D)
    kp, vp = (F.pad(t, (0, 0, 0, nkb * b - t.shape[2])) for t in (k, v))
    kb, vb = kp.view(B, H, nkb, b, D), vp.view(B, H, nkb, b, D)
    index = layout.key_index.view(-1)
    kg = kp[:, :, index].view(B, H, nqb, -1, D)  # (B, H, nqb, m·b, D): each query block's keys
    vg = vp[:, :, index].view(B, H, nqb, -1, D)

    scores = [torch.matmul(qb, kg.transpose(-2, -1))]  # (B, H, nqb, b, m·b)
    allowed = [_batch(layout.allowed, _padding(mask.keep, layout.key_index, nkb * b), lambda p: p[:, None, :, None, :])]
    if layout.column_allowed is not None:
        scores.append(torch.einsum("bhcrd,bhkrd->bhcrk", qb, kb))  # (B, H, nqb, b, nkb)
        col_index = (torch.arange(nkb, device=q.device) * b)[None, :] + torch.arange(b, device=q.device)[:, None]
        allowed.append(_batch(layout.column_allowed, _padding(mask.keep, col_index, nkb * b),
                              lambda p: p[:, None, None, :, :]))
    if layout.shared_allowed is not None:
        g = geo.shared
        scores.append(torch.einsum("bhcrd,bhgd->bhcrg", qb, k[:, :, :g]))  # (B, H, nqb, b, g)
        allowed.append(_batch(layout.shared_allowed, _padding(mask.keep, torch.arange(g, device=q.device), nkb * b),
                              lambda p: p[:, None, None, None, :]))
    sizes = [s.shape[-1] for s in scores]
    batch = max(a.shape[0] for a in allowed)
    allowed_all = torch.cat([a.expand(batch, 1, nqb, b, n) for a, n in zip(allowed, sizes)], dim=-1)
    weights = _softmax(torch.cat(scores, dim=-1) * scale, allowed_all, dropout_p).split(sizes, dim=-1)

    out = torch.matmul(weights[0], vg)
    if layout.column_allowed is not None:
        out = out + torch.einsum("bhcrk,bhkrd->bhcrd", weights[1], vb)
    if layout.shared_allowed is not None:
        out = out + torch.einsum("bhcrg,bhgd->bhcrd", weights[-1], v[:, :, :geo.shared])
    out = out.view(B, H, nqb * b, D)[:, :, front:front + tq]
    if geo.dense_rows:
        out = torch.cat([_dense_rows(q, k, v, mask, scale, dropout_p, geo.dense_rows), out[:, :, geo.dense_rows:]], 2)
    return out


def _batch(static: torch.Tensor, padding: torch.Tensor | None, place) -> torch.Tensor:
    """The static (nqb, b, n) pattern as (1|B, 1, nqb, b, n), with the batch's padding when there is any."""
    out = static[None, None]
    return out if padding is None else out & place(padding)


def _dense_rows(q, k, v, mask: AttentionMask, scale: float, dropout_p: float, rows: int):
    """The first ``rows`` queries (global) against every key: (B, H, rows, D)."""
    q_pos = torch.arange(mask.q_start, mask.q_start + rows, device=q.device)
    scores = torch.matmul(q[:, :, :rows], k.transpose(-2, -1)) * scale  # (B, H, rows, Tk)
    allowed = mask.allowed(q_pos)
    if allowed is not None:
        allowed = allowed.expand(allowed.shape[0], 1, rows, k.shape[2])
    return torch.matmul(_softmax(scores, allowed, dropout_p), v)
