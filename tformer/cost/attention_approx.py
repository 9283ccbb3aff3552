"""The ledger's rows for the approximate attention kinds (tformer.model.attention: kernelized, performer,
linformer, lsh), each charging the matmuls its model code runs, so matmul FLOPs equal FlopCounterMode.

Shapes as in AttentionCall: q (B, H, Tq, D), k and v (B, Hkv, Tk, D). A causal kernelised call reads
the Tq new positions (a decode step's state summarises the Tk - Tq before them); a bidirectional call
reads all Tk keys. Element-wise work (feature maps, exp, masks, normalisation) is other_flops, by
conventions stated beside each count. No kind here writes an n x n tensor: scores_bytes is Linformer's
n x k weights, LSH's chunk weights, and nothing for the kernelised kinds.
"""

from __future__ import annotations

import math
from dataclasses import replace

from tformer.cost import ops as O
from tformer.cost.attention_call import AttentionCall, dense_rows
from tformer.cost.ops import MatMul, Op
from tformer.cost.workload import MASK_BYTES

FEATURE_FLOPS_PER_ELEMENT = 4  # performer: subtract |x|²/2, subtract the max, exp, divide by sqrt(m)
ELU_FLOPS_PER_ELEMENT = 3  # linear: elu (compare, exp - 1 on the negative side) + 1
NORMALISE_FLOPS_PER_ELEMENT = 1  # numerator / denominator
STABILISER_BYTES = 4  # performer keeps one fp32-sized max per (batch, head) beside S and z


def _where(call: AttentionCall) -> dict:
    return dict(layer=call.layer, phase="forward", stack=call.stack)


def chunk_sizes(n: int, block: int) -> list[int]:
    """The chunk lengths a causal prefix sum (or LSH's sorted sequence) walks: block, ..., block, rest."""
    return [block] * (n // block) + ([n % block] if n % block else [])


def lsh_buckets(n: int, block: int, max_positions: int) -> int:
    """Reformer's bucket count: ceil(n / block) rounded up to even (each rotation splits into +-), at
    least 2, at most the count drawn for max_positions (longer inputs share those buckets)."""
    def even(x: int) -> int:
        return max(2, x + x % 2)
    return min(even(math.ceil(n / block)), even(math.ceil(max_positions / block)))


# Kernelised: linear attention and Performer ------------------------------------------------------------
def _kernelised(call: AttentionCall, m: int, projected: bool) -> list[Op]:
    """Rows of phi(Q) (phi(K)^T [V | 1]) with m features; ``projected``: phi starts with x @ W^T (D -> m)."""
    B, H, D, a, p = call.batch, call.heads, call.head_dim, call.act_bytes, call.path
    D1, BH = D + 1, call.batch * call.heads
    tq = call.tq
    n = tq if call.causal else call.tk  # keys this call reads (a decode step: only the new ones)
    past = call.causal and call.tk > tq  # a state from earlier positions
    keep_state = call.causal and call.cache_bytes > 0  # prefill / decode keep the sums for the next step
    feature_mm = O.matmul_flops(tq + n, D, m, batch=BH) if projected else 0
    per = FEATURE_FLOPS_PER_ELEMENT if projected else ELU_FLOPS_PER_ELEMENT
    state = BH * m * D1 * a
    if call.causal:
        sizes = chunk_sizes(tq, call.options.block)
        within_scores = sum(O.matmul_flops(c, m, c, batch=BH) for c in sizes)  # phi(Qc) phi(Kc)^T
        within_context = sum(O.matmul_flops(c, c, D1, batch=BH) for c in sizes)  # tril(...) [Vc | 1]
        summaries = sum(O.matmul_flops(m, c, D1, batch=BH) for i, c in enumerate(sizes)
                        if i < len(sizes) - 1 or keep_state)  # S += phi(Kc)^T [Vc | 1]
        from_past = sum(O.matmul_flops(c, m, D1, batch=BH) for i, c in enumerate(sizes) if i > 0 or past)
        chunk_scores = BH * sum(c * c for c in sizes) * a
        scores_mm, context_mm = within_scores + summaries, within_context + from_past
        # Backward keeps each chunk's features, its C x C product and the running sums it read.
        saved_context = chunk_scores + len(sizes) * state
    else:
        chunk_scores = 0
        scores_mm = O.matmul_flops(m, n, D1, batch=BH)  # S = phi(K)^T [V | 1]
        context_mm = O.matmul_flops(tq, m, D1, batch=BH)  # phi(Q) S
        saved_context = state
    cache = BH * m * D1 * a + (BH * STABILISER_BYTES if projected else 0) if keep_state else 0
    qk_in = BH * (tq + n) * D * a
    features = BH * (tq + n) * m * a
    return [
        Op(name=p + ".features", kind="scores", **_where(call),
           shapes=f"phi: [{B}, {H}, {tq}+{n}, {D}] -> {m} features",
           dims=MatMul(1, BH * (tq + n), D, m) if projected else None, matmul_flops=feature_mm,
           backward_matmul_flops=feature_mm,  # W is a fixed draw: only x gets a gradient
           other_flops=BH * (tq + n) * m * per, bytes_read=qk_in + (m * D * 4 if projected else 0),
           bytes_written=features, saved_bytes=qk_in + features),
        Op(name=p + ".scores", kind="scores", **_where(call),
           shapes=f"phi(K)^T [V | 1]: [{B}, {H}, {m}, {n}] @ [{B}, {H}, {n}, {D1}]"
           + (" in chunks" if call.causal else ""),
           dims=MatMul(BH, m, n, D1), matmul_flops=scores_mm, bytes_read=BH * n * (m + D1) * a + features,
           bytes_written=state + chunk_scores, saved_bytes=BH * n * D1 * a, cache_bytes=cache),
        Op(name=p + ".context", kind="context", **_where(call),
           shapes=f"phi(Q) S: [{B}, {H}, {tq}, {m}] @ [{B}, {H}, {m}, {D1}]", dims=MatMul(BH, tq, m, D1),
           matmul_flops=context_mm, bytes_read=BH * tq * m * a + state + chunk_scores,
           bytes_written=BH * tq * D1 * a, saved_bytes=saved_context),
        Op(name=p + ".softmax", kind="softmax", **_where(call), shapes=f"[{B}, {H}, {tq}, {D}] / denominator",
           other_flops=BH * tq * D * NORMALISE_FLOPS_PER_ELEMENT, bytes_read=BH * tq * D1 * a,
           bytes_written=BH * tq * D * a, saved_bytes=BH * tq * D1 * a),
    ]


def linear(call: AttentionCall) -> list[Op]:
    """Katharopoulos et al. 2020: phi = elu + 1, D features per head."""
    return _kernelised(call, call.head_dim, projected=False)


def performer(call: AttentionCall) -> list[Op]:
    """FAVOR+: q and k projected onto ``features`` random directions, then the kernelised products."""
    return _kernelised(call, call.options.features, projected=True)


# Linformer ---------------------------------------------------------------------------------------------
def linformer(call: AttentionCall) -> list[Op]:
    """E K and F V (k x n times n x D per key/value head), then exact attention over the k projected
    rows: the scores are n x k. The projection row is named after the module owning E and F."""
    B, Hkv, D, a, n = call.batch, call.kv_heads, call.head_dim, call.act_bytes, call.tk
    k, n_max = call.options.proj, call.options.max_positions
    kv_in = 2 * B * Hkv * n * D * a
    project = Op(name=call.path + ".attend", kind="qkv_proj", **_where(call),
                 shapes=f"2 x [{k}, {n}] @ [{B}, {Hkv}, {n}, {D}]", dims=MatMul(2 * B * Hkv, k, n, D),
                 matmul_flops=2 * O.matmul_flops(k, n, D, batch=B * Hkv), bytes_read=kv_in + 2 * k * n * a,
                 bytes_written=2 * B * Hkv * k * D * a, params=2 * k * n_max, weight_bytes=2 * k * n * a,
                 saved_bytes=kv_in)  # K and V, for E's and F's gradients
    # Padding is zeroed before the projection: nothing is added to the n x k scores.
    short = replace(call, tk=k, pairs=call.tq * k, extra_flops=0, cache_bytes=0)
    saved = short.score_elements * a
    if call.dropout > 0:
        saved += short.score_elements * (MASK_BYTES + a)  # the mask and the dropped-out weights
    return [project, *dense_rows(short, stored=short.score_bytes, softmax_saved=saved, scores_saved=saved)]


# Reformer's LSH -----------------------------------------------------------------------------------------
def lsh(call: AttentionCall) -> list[Op]:
    """Hash q and k (unit vectors @ R, D -> hashes x b/2; no gradient), then per round C x 2C chunk
    scores and products over the sorted sequence, padded to whole chunks, plus each query's own key;
    a decode step (Tq < Tk) scores every cached key and keeps those in its buckets."""
    B, H, D, a, tq, tk, p = call.batch, call.heads, call.head_dim, call.act_bytes, call.tq, call.tk, call.path
    BH, o = B * H, call.options
    rounds, C = o.hashes, o.block
    half = lsh_buckets(tk, C, o.max_positions) // 2
    hash_mm = O.matmul_flops(tq + tk, D, rounds * half, batch=BH)
    kv_bytes = 2 * B * call.kv_heads * tk * D * a
    if tq == tk:
        nc = math.ceil(tk / C)
        rows, keys, batch = C, 2 * C, BH * rounds * nc  # per chunk: C queries against 2C keys (+ its own)
        weights = batch * rows * (keys + 1)
        shapes = f"{rounds} rounds x {nc} chunks: [{C}, {D}] @ [{D}, {2 * C}] (+ own key)"
    else:
        rows, keys, batch = tq, tk, BH
        weights = BH * tq * tk
        shapes = O.matmul_label((B, H, tq, D), (B, H, D, tk)) + " (bucket-matched keys)"
    stored = weights * a
    return [
        Op(name=p + ".hash", kind="scores", **_where(call),
           shapes=f"[{B}, {H}, {tq}+{tk}, {D}] @ [{D}, {rounds * half}]",
           dims=MatMul(1, BH * (tq + tk), D, rounds * half), matmul_flops=hash_mm, backward_matmul_flops=0,
           other_flops=BH * (tq + tk) * (3 * D + 2 * rounds * half), bytes_read=BH * (tq + tk) * D * a,
           bytes_written=BH * (tq + tk) * rounds * 8),  # normalise, negate, argmax; int64 buckets
        Op(name=p + ".scores", kind="scores", **_where(call), shapes=shapes, dims=MatMul(batch, rows, D, keys),
           matmul_flops=O.matmul_flops(rows, D, keys, batch=batch), other_flops=BH * tq * 2 * D,  # own q·k
           bytes_read=batch * (rows + keys) * D * a, bytes_written=stored,
           saved_bytes=BH * tq * D * a * rounds + kv_bytes * rounds, cache_bytes=call.cache_bytes),
        Op(name=p + ".softmax", kind="softmax", **_where(call), shapes=shapes,
           other_flops=weights * (1 + O.SOFTMAX_FLOPS_PER_ELEMENT) + BH * tq * rounds * 4,  # mask; rounds' lse
           bytes_read=stored, bytes_written=stored, saved_bytes=stored, scores_bytes=stored),
        Op(name=p + ".context", kind="context", **_where(call), shapes=shapes, dims=MatMul(batch, rows, keys, D),
           matmul_flops=O.matmul_flops(rows, keys, D, batch=batch), other_flops=BH * tq * D * 2 * rounds,
           bytes_read=stored + batch * keys * D * a, bytes_written=BH * tq * D * a, saved_bytes=batch * keys * D * a,
           cache_bytes=call.cache_bytes),
    ]


__all__ = ["chunk_sizes", "linear", "linformer", "lsh", "lsh_buckets", "performer"]
