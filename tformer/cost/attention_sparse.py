"""The ledger's rows for the sparse kinds (strided, longformer, bigbird): the pairs their gathered blocks form.

The model (tformer.model.attention.block_sparse) and these rows read one geometry,
tformer.core.sparse_layout.sparse_geometry, so the matmul FLOPs here are the products the model runs:
for each padded query row, its gathered m·b keys (padding slots included: they are computed, then
masked), the strided columns (n/w), the shared global keys (g), and g dense global rows against all Tk
keys. Per (batch, head) that is P = nqb·b·(m·b + columns + g) + g_rows·Tk pairs, one multiply-add per
head dimension in Q K^T and again in weights · V. At fixed window and block P grows with n (longformer,
bigbird: n·(w + b + g)), except strided's columns: n²/w at fixed w, n·√n with w = √n.

Bytes: the scores, the gathered K and V copies (B, H, nqb, m·b, D) and the weights are written to memory;
what autograd keeps is Q, the gathered K and V and the weights (P per head: the peak attention memory,
``scores_bytes``, grows with n·m·b, never n²).
"""

from __future__ import annotations

from tformer.core.sparse_layout import SparseGeometry, sparse_geometry
from tformer.cost import ops as O
from tformer.cost.attention_call import AttentionCall
from tformer.cost.ops import MatMul, Op
from tformer.cost.workload import MASK_BYTES


def geometry(call: AttentionCall) -> SparseGeometry:
    """The blocks this call gathers: queries are the last tq of tk positions (a KV-cache step sits at tk - tq)."""
    return sparse_geometry(call.options, call.tq, call.tk, call.tk - call.tq, call.causal)


def sparse(call: AttentionCall) -> list[Op]:
    """Scores, softmax and context of one sparse call, charged for the pairs its blocks form."""
    geo = geometry(call)
    B, H, Hkv, dh, a = call.batch, call.heads, call.kv_heads, call.head_dim, call.act_bytes
    p, where = call.path, {"layer": call.layer, "phase": "forward", "stack": call.stack}
    heads, pairs = B * H, geo.pairs
    rows = geo.q_blocks * geo.block  # padded query rows
    gathered = heads * geo.q_blocks * geo.slots * geo.block * dh * a  # one of K, V gathered per query block
    # Keys read besides the gather: the strided columns (the whole padded K), the shared global keys, the
    # dense rows' whole K; the source K (per key/value head) is read once by the gather.
    side_keys = (geo.k_blocks * geo.block if geo.columns else 0) + geo.shared + (geo.tk if geo.dense_rows else 0)
    source = B * Hkv * call.tk * dh * a
    side = heads * side_keys * dh * a
    q_read = heads * (rows + geo.dense_rows) * dh * a
    scores = heads * pairs * a
    mm = O.matmul_flops(1, dh, 1, batch=heads * pairs)
    weights_saved = scores + (heads * pairs * (MASK_BYTES + a) if call.dropout > 0 else 0)
    label = f"[{B}, {H}, {geo.q_blocks}, {geo.block}, {dh}] @ {geo.q_blocks} x {geo.gathered_keys} keys"
    return [
        Op(name=p + ".scores", kind="scores", **where, shapes=label + f" ({call.options.kind})",
           dims=MatMul(heads * geo.q_blocks, geo.block, dh, geo.gathered_keys), matmul_flops=mm,
           bytes_read=q_read + source + gathered + side, bytes_written=gathered + scores,
           saved_bytes=q_read + gathered + side, cache_bytes=call.cache_bytes),
        # scale, mask (the pattern, padding and causality), softmax over each row's keys
        Op(name=p + ".softmax", kind="softmax", **where, shapes=f"[{B}, {H}] x {pairs} pairs",
           other_flops=heads * pairs * (2 + O.SOFTMAX_FLOPS_PER_ELEMENT), bytes_read=scores, bytes_written=scores,
           saved_bytes=weights_saved, scores_bytes=weights_saved),
        Op(name=p + ".context", kind="context", **where, shapes=f"weights @ V gathered ({call.options.kind})",
           dims=MatMul(heads * geo.q_blocks, geo.block, geo.gathered_keys, dh), matmul_flops=mm,
           bytes_read=scores + source + 2 * gathered + side, bytes_written=gathered + heads * call.tq * dh * a,
           saved_bytes=gathered + side, cache_bytes=call.cache_bytes),
    ]


SPARSE_COSTS = {"strided": sparse, "longformer": sparse, "bigbird": sparse}
