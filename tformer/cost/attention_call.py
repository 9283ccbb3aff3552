"""One attention call as the ledger sees it, and the three rows (scores, softmax, context) that the
exact kinds share. Each kind's cost function (cost.attention registry) builds on these."""

from __future__ import annotations

from dataclasses import dataclass

from tformer.core.attention_kinds import AttnOptions
from tformer.cost import ops as O
from tformer.cost.ops import MatMul, Op

LSE_BYTES = 4  # a fused kernel keeps one fp32 log-sum-exp per query row


@dataclass(frozen=True)
class AttentionCall:
    """One attention call's sizes as the ledger sees them. q (B, H, Tq, D), k and v (B, Hkv, Tk, D)."""

    path: str  # the attention module ("decoder.layers.0.attn"); rows are named path + ".scores", ...
    layer: int
    stack: str
    batch: int
    heads: int
    kv_heads: int
    head_dim: int
    tq: int
    tk: int
    pairs: int  # query-key pairs the FLOP count charges per (batch, head): tq * tk, or the causal ones
    act_bytes: int  # bytes per activation element
    extra_flops: int  # per score element: 1 for a mask or a position bias added to the scores, else 0
    cache_bytes: int  # the K (and the V) this layer holds in the KV cache after the step
    dropout: float  # attention dropout in force (0 outside training)
    causal: bool = False  # a causal self-attention (the kind's pattern is one-sided)
    options: AttnOptions | None = None  # the layer's attention settings (window, block, features, ...)

    @property
    def score_elements(self) -> int:
        return self.batch * self.heads * self.tq * self.tk

    @property
    def score_bytes(self) -> int:
        """The (B, H, Tq, Tk) scores, written once."""
        return O.attention_scores_cost(self.batch, self.heads, self.tq, self.tk, self.head_dim, self.act_bytes,
                                       self.kv_heads)[2]


def dense_rows(call: AttentionCall, stored: int, softmax_saved: int, scores_saved: int) -> list[Op]:
    """The three rows every exact kind shares. ``stored``: bytes of the scores written to memory (0: fused);
    ``softmax_saved``: what the softmax keeps for the backward, ``scores_saved`` the s x s part of it."""
    B, H, Hkv, dh, tq, tk, a = call.batch, call.heads, call.kv_heads, call.head_dim, call.tq, call.tk, call.act_bytes
    p, where = call.path, dict(layer=call.layer, phase="forward", stack=call.stack)
    mm = O.matmul_flops(1, dh, 1, batch=B * H * call.pairs)
    q_k_read = O.attention_scores_cost(B, H, tq, tk, dh, a, Hkv)[1]
    kv_bytes = B * Hkv * tk * dh * a
    causal = " (causal pairs)" if call.pairs != tq * tk else ""
    return [
        Op(name=p + ".scores", kind="scores", **where,
           shapes=O.matmul_label((B, H, tq, dh), (B, H, dh, tk)) + causal, dims=MatMul(B * H, tq, dh, tk),
           matmul_flops=mm, bytes_read=q_k_read, bytes_written=stored,
           saved_bytes=B * H * tq * dh * a + kv_bytes, cache_bytes=call.cache_bytes),  # saved: Q and K
        # scale, (+ mask or position bias), softmax: the element-wise work between the two matmuls
        Op(name=p + ".softmax", kind="softmax", **where, shapes=f"[{B}, {H}, {tq}, {tk}]",
           other_flops=call.score_elements * (1 + call.extra_flops + O.SOFTMAX_FLOPS_PER_ELEMENT),
           bytes_read=stored, bytes_written=stored, saved_bytes=softmax_saved, scores_bytes=scores_saved),
        Op(name=p + ".context", kind="context", **where,
           shapes=O.matmul_label((B, H, tq, tk), (B, H, tk, dh)), dims=MatMul(B * H, tq, tk, dh),
           matmul_flops=mm, bytes_read=stored + kv_bytes, bytes_written=B * H * tq * dh * a,
           saved_bytes=kv_bytes, cache_bytes=call.cache_bytes),  # V (the weights are saved at softmax)
    ]
