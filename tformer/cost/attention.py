"""The ledger's attention rows, one cost function per attention kind, keyed by the same names as the
model's attention kinds (tformer.core.attention_kinds.ATTN_KINDS).

Exact kinds compute softmax(Q K^T * scale + bias) V with the same matmul FLOPs and differ in what they
write to memory and keep for the backward pass; sparse kinds charge only the pairs they form; approximate
kinds charge their own algorithm. Adding a kind is one function (here or in its own module) and one
entry in ATTENTION_COSTS.
"""

from __future__ import annotations

from tformer.core.attention_kinds import ATTN_KINDS
from tformer.core.errors import TformerError
from tformer.cost import attention_approx, attention_exact
from tformer.cost.attention_call import LSE_BYTES, AttentionCall, dense_rows
from tformer.cost.attention_sliding import sliding
from tformer.cost.attention_sparse import SPARSE_COSTS
from tformer.cost.ops import Op
from tformer.cost.workload import MASK_BYTES


def reference(call: AttentionCall) -> list[Op]:
    """Step by step: the scores are written, read and rewritten by softmax, and read again by the
    product with V; softmax keeps its output (and dropout its mask and result) for the backward."""
    stored = call.score_bytes
    saved = call.score_elements * call.act_bytes
    if call.dropout > 0:
        saved += call.score_elements * (MASK_BYTES + call.act_bytes)  # the mask and the dropped-out weights (used by AV)
    return dense_rows(call, stored=stored, softmax_saved=saved, scores_saved=saved)


def sdpa(call: AttentionCall) -> list[Op]:
    """A fused (flash) kernel: the scores live in on-chip tiles and never reach memory; the backward
    recomputes them from the fp32 log-sum-exp it keeps per query row."""
    return dense_rows(call, stored=0, softmax_saved=call.batch * call.heads * call.tq * LSE_BYTES, scores_saved=0)


ATTENTION_COSTS = {"reference": reference, "sdpa": sdpa, "tiled": attention_exact.tiled,
                   "chunked": attention_exact.chunked, "sliding": sliding, **SPARSE_COSTS,
                   "linformer": attention_approx.linformer, "linear": attention_approx.linear,
                   "performer": attention_approx.performer, "lsh": attention_approx.lsh}


def costed_kind(config, workload, cross: bool = False, layer: int | None = None) -> str:
    """The kind the ledger costs (layer ``layer``'s, where layer_types gives each layer its own; else the config's),
    except that the default exact pair (sdpa / reference) follows the workload's --fused-attention choice, and
    cross-attention always runs exact."""
    kind = config.attention_options(layer).kind if layer is not None else config.attn_impl
    if kind in ("sdpa", "reference") or (cross and ATTN_KINDS[kind].family != "exact"):
        return workload.attention_kind
    return kind


def attention_rows(kind: str, call: AttentionCall) -> list[Op]:
    """The scores, softmax and context rows of one attention call under attention kind ``kind``."""
    if kind not in ATTENTION_COSTS:
        raise TformerError(f"attention kind '{kind}' has no cost function; choose one of: {', '.join(ATTENTION_COSTS)}")
    return ATTENTION_COSTS[kind](call)


__all__ = ["ATTENTION_COSTS", "AttentionCall", "attention_rows", "costed_kind"]
