"""The ledger's row for sliding-window attention ("sliding"), and the block sizes the model's kind
(tformer.model.attention.sliding) computes with, kept here so both count the same pairs.

The kind permutes the queries into min(d, Tq) residue classes (dilation d), cuts each into blocks of
b = min(w, class length) queries and scores every block against one gathered span of keys (causal:
b + w - 1, bidirectional: b + 2w; never more than the keys there are). So the pairs charged are
rows x blocks x b x span, about 2·n·w for a causal prefill: linear in n at fixed w. A causal decode
reads only the keys a rolling KV cache holds, (w - 1)·d + 1 past positions plus the new ones,
whatever the context.
"""

from __future__ import annotations

from dataclasses import dataclass

from tformer.core.errors import TformerError
from tformer.cost import ops as O
from tformer.cost.attention_call import AttentionCall
from tformer.cost.ops import MatMul, Op
from tformer.cost.workload import MASK_BYTES


@dataclass(frozen=True)
class BlockPlan:
    """The gathered blocks of one call, in sizes only.

    rows: residue classes holding queries (min(d, Tq)); cols: query positions per row (its padded
    length before blocking); block: queries per block (b); blocks: per row; span: keys per block."""

    rows: int
    cols: int
    block: int
    blocks: int
    span: int

    @property
    def queries(self) -> int:
        """Query slots computed per (batch, head), padding included: rows x blocks x block."""
        return self.rows * self.blocks * self.block

    @property
    def pairs(self) -> int:
        """Query-key pairs scored per (batch, head)."""
        return self.queries * self.span

    @property
    def keys(self) -> int:
        """Key slots gathered per (batch, head): rows x blocks x span."""
        return self.rows * self.blocks * self.span


def _columns(start: int, n: int, dilation: int) -> int:
    """Columns of the residue grid that positions start .. start + n - 1 fill (position // d, first to last)."""
    return (start + n - 1) // dilation - start // dilation + 1


def block_plan(tq: int, tk: int, q_start: int, k_start: int, window: int, dilation: int, causal: bool) -> BlockPlan:
    """Sizes of the gathered blocks for ``tq`` queries from position ``q_start`` over ``tk`` keys from
    ``k_start``. A span never reaches past the keys there are: a window wider than the sequence costs
    what dense attention does, no more."""
    rows = min(dilation, tq)
    cols = _columns(q_start, tq, dilation)
    block = min(window, cols)
    blocks = -(-cols // block)
    span = min(block + window - 1 if causal else block + 2 * window, _columns(k_start, tk, dilation))
    return BlockPlan(rows, cols, block, blocks, span)


def cache_positions(window: int, dilation: int) -> int:
    """Positions a rolling KV cache keeps: the span of one query's window, (w - 1)·d + 1. The next query
    reaches (w - 1)·d of them (Hugging Face's sliding-window cache keeps w - 1); the one more lets a
    decode step be rewound by one position."""
    return (window - 1) * dilation + 1


def _window(call: AttentionCall) -> tuple[int, int]:
    opts = call.options
    if opts is None or opts.window is None:
        raise TformerError("sliding attention needs a window; set attn_window (e.g. --set attn_window=256)")
    return opts.window, opts.dilation


def sliding(call: AttentionCall) -> list[Op]:
    """Scores, softmax and context over the gathered blocks; the scores (B, H, rows, blocks, b, span)
    are written to memory and the softmax output is kept for the backward, like the reference path,
    but n x span instead of n x n."""
    w, d = _window(call)
    tk = call.tk
    held = cache_positions(w, d)
    if call.causal:  # a decode step reads only what the rolling cache holds, plus its own keys
        tk = min(tk, held + call.tq)
    plan = block_plan(call.tq, tk, call.tk - call.tq, call.tk - tk, w, d, call.causal)
    B, H, Hkv, dh, a = call.batch, call.heads, call.kv_heads, call.head_dim, call.act_bytes
    lead = (B, H, plan.rows, plan.blocks)
    elements = B * H * plan.pairs
    stored = elements * a
    q_bytes, k_bytes = B * H * plan.queries * dh * a, B * H * plan.keys * dh * a  # gathered (GQA: expanded)
    saved = stored + (elements * (MASK_BYTES + a) if call.dropout > 0 else 0)
    mm = O.matmul_flops(1, dh, 1, batch=elements)
    # What this layer's cache holds after the step: the last (w - 1)·d + 1 positions at most.
    cache = call.cache_bytes and B * Hkv * min(call.tk, held) * dh * a
    where = dict(layer=call.layer, phase="forward", stack=call.stack)
    batched = MatMul(B * H * plan.rows * plan.blocks, plan.block, dh, plan.span)
    return [
        Op(name=call.path + ".scores", kind="scores", **where, dims=batched,
           shapes=O.matmul_label((*lead, plan.block, dh), (*lead, dh, plan.span)) + " (window blocks)",
           matmul_flops=mm, bytes_read=q_bytes + k_bytes + B * Hkv * tk * dh * a, bytes_written=stored,
           saved_bytes=q_bytes + k_bytes, cache_bytes=cache),
        # scale, window/padding mask, softmax
        Op(name=call.path + ".softmax", kind="softmax", **where, shapes=str([*lead, plan.block, plan.span]),
           other_flops=elements * (2 + O.SOFTMAX_FLOPS_PER_ELEMENT), bytes_read=stored, bytes_written=stored,
           saved_bytes=saved, scores_bytes=saved),
        Op(name=call.path + ".context", kind="context", **where,
           dims=batched._replace(k=plan.span, n=dh),
           shapes=O.matmul_label((*lead, plan.block, plan.span), (*lead, plan.span, dh)),
           matmul_flops=mm, bytes_read=stored + k_bytes + B * Hkv * tk * dh * a,
           bytes_written=B * H * call.tq * dh * a, saved_bytes=k_bytes, cache_bytes=cache),
    ]


__all__ = ["BlockPlan", "block_plan", "cache_positions", "sliding"]
