"""Ledger rows of the exact kinds that compute attention piecewise: tiled (FlashAttention's algorithm,
tformer.model.attention.tiled) and chunked (query chunks against every key, .chunked).

Both charge what the model computes, so matmul FLOPs equal FlopCounterMode's, forward and train.

tiled   Block pairs (query block i, key block j) are computed whole; under a causal mask a key block
        wholly after the query block's last position is skipped, the diagonal block is computed in full
        (and masked). Q is read once, K and V once per query block; O and the fp32 log-sum-exp L are
        written and kept for the backward; no score reaches memory (scores_bytes 0), so its memory is
        linear in n. The backward (FlashAttention-2) recomputes Q K^T block by block before the
        usual four products (dV, dP, dQ, dK: the ledger's generic 2x forward); that recompute is one
        extra "scores" row in phase "recompute".
chunked Every chunk of ``block`` queries against all Tk keys: the same products as the reference path,
        with K and V read once per chunk, each chunk's (chunk, Tk) scores written and read. Training
        checkpoints each chunk, so the backward first reruns every chunk's forward as far as the
        weights (scores and softmax rows again, in phase "recompute"; the product with V is not
        rerun, checkpointing stops early); the backward holds one chunk's weights at a time.

A cost function's rows in phase "recompute" are work the backward pass does again; the op list keeps
them only when training and places them with the backward rows (tformer.cost.oplist).
"""

from __future__ import annotations

import math
from dataclasses import replace

from tformer.cost import ops as O
from tformer.cost.attention_call import LSE_BYTES, AttentionCall, dense_rows
from tformer.cost.ops import MatMul, Op
from tformer.cost.workload import MASK_BYTES

DEFAULT_BLOCK = 64  # ModelConfig.attn_block's default, for a call costed without the layer's options


def block_of(call: AttentionCall) -> int:
    return call.options.block if call.options is not None else DEFAULT_BLOCK


def tiled_blocks(tq: int, tk: int, block: int, causal: bool) -> tuple[int, int]:
    """(query-key pairs computed, keys read summed over query blocks) per (batch, head) of the tiled kind.

    Queries are the last tq of tk positions; key blocks start at multiples of ``block``. Under a
    causal mask query block [q0, q1) reads the key blocks that start at or before its last position.
    """
    pairs = keys_read = 0
    for q0 in range(0, tq, block):
        q1 = min(q0 + block, tq)
        stop = min(tk, tk - tq + q1) if causal else tk  # keys the block's last query may see
        keys = min(tk, math.ceil(stop / block) * block)  # whole key blocks, the last one ragged at tk
        pairs += (q1 - q0) * keys
        keys_read += keys
    return pairs, keys_read


def _block_dims(batch_heads: int, pairs: int, block: int, tq: int, tk: int, dh: int) -> tuple[MatMul, MatMul]:
    """(scores, context) products shaped like one block pair each, repeated: exact in FLOPs (m * n = pairs)."""
    m = math.gcd(pairs, min(block, tq)) or 1
    n = math.gcd(pairs // m, min(block, tk)) or 1
    repeats = batch_heads * (pairs // (m * n))
    return MatMul(repeats, m, dh, n), MatMul(repeats, m, n, dh)


def tiled(call: AttentionCall) -> list[Op]:
    """FlashAttention in PyTorch: block-pair products, Q once and K, V once per query block, O and L kept."""
    B, H, Hkv, dh, tq, tk, a = call.batch, call.heads, call.kv_heads, call.head_dim, call.tq, call.tk, call.act_bytes
    block = block_of(call)
    pairs, keys_read = tiled_blocks(tq, tk, block, call.causal)
    elements = B * H * pairs
    mm = O.matmul_flops(1, dh, 1, batch=elements)
    scores_dims, context_dims = _block_dims(B * H, pairs, block, tq, tk, dh)
    q_bytes = o_bytes = B * H * tq * dh * a
    kv_stream = B * Hkv * keys_read * dh * a  # K (or V) read once per query block
    kv_bytes = B * Hkv * tk * dh * a
    lse = B * H * tq * LSE_BYTES
    p, where = call.path, {"layer": call.layer, "stack": call.stack}
    skipped = " (future key blocks skipped)" if call.causal and pairs < tq * tk else ""
    label = f"{O.matmul_label((B, H, tq, dh), (B, H, dh, tk))} in {block} x {block} tiles{skipped}"
    scores = Op(name=p + ".scores", kind="scores", phase="forward", **where, shapes=label, dims=scores_dims,
                matmul_flops=mm, bytes_read=q_bytes + kv_stream, saved_bytes=q_bytes + kv_bytes,
                cache_bytes=call.cache_bytes)  # saved: Q and K
    return [
        scores,
        # scale, (+ mask or bias), the running max, exp and sum, on tiles that never leave the block loop
        Op(name=p + ".softmax", kind="softmax", phase="forward", **where, shapes=f"[{B}, {H}, {tq}] running max, sum",
           other_flops=elements * (1 + call.extra_flops + O.SOFTMAX_FLOPS_PER_ELEMENT), bytes_written=lse,
           saved_bytes=lse),  # L, fp32: all the backward needs to rebuild P
        Op(name=p + ".context", kind="context", phase="forward", **where,
           shapes=f"{O.matmul_label((B, H, tq, tk), (B, H, tk, dh))} in tiles", dims=context_dims, matmul_flops=mm,
           bytes_read=kv_stream, bytes_written=o_bytes, saved_bytes=kv_bytes + o_bytes,
           cache_bytes=call.cache_bytes),  # saved: V and O
        replace(scores, phase="recompute", saved_bytes=0, cache_bytes=0),  # the backward's Q K^T, block by block
    ]


def chunked(call: AttentionCall) -> list[Op]:
    """The reference path's products one chunk of queries at a time, each chunk checkpointed."""
    B, H, Hkv, dh, tq, tk, a = call.batch, call.heads, call.kv_heads, call.head_dim, call.tq, call.tk, call.act_bytes
    chunk = min(block_of(call), tq)
    chunks = math.ceil(tq / chunk)
    # The backward holds one chunk's weights at a time (and its dropout mask): the peak, chunk x Tk.
    held = B * H * chunk * tk * (a + (MASK_BYTES + a if call.dropout > 0 else 0))
    # Saved besides: Q, K (scores row) and V (context row), the checkpoint's inputs.
    rows = dense_rows(call, stored=call.score_bytes, softmax_saved=held, scores_saved=held)
    again = B * Hkv * tk * dh * a * (chunks - 1)  # every chunk reads all of K (scores) and V (context)
    rows[0].bytes_read += again
    rows[2].bytes_read += again
    for op in rows:
        op.shapes += f" in {chunks} chunks of {chunk} queries"
    # The checkpoint's recompute stops once the tensors the backward needs are back (PyTorch's early
    # stop): the scores and the softmax, not the product with V.
    return rows + [replace(op, phase="recompute", saved_bytes=0, scores_bytes=0, cache_bytes=0) for op in rows[:2]]


__all__ = ["chunked", "tiled", "tiled_blocks"]
