"""The ledger's prediction of one real decode step, in the terms that explain it.

A decode step of a small model is not only its weight reads. The prediction here is the ledger's step on this
machine's measured roofline, split in named terms:

    weight products   each Linear's bytes at the measured GEMV rate (a kept block layout at the block kernel's rate,
                      which ``tformer bench`` measures per layout), or its FLOPs on the measured matmul curve
    attention         each layer's scores, softmax and context: their bytes at the measured stream rate, or, where
                      the step runs row-exact attention (the block kernel's path: one C call per layer, each query
                      alone in key order), that routine timed now at this context and the model's heads
    other ops         norms, activations, RoPE, residuals, the embedding: their bytes and FLOPs at the measured
                      element-wise and stream rates
    fixed cost        a cost per ledger op that is neither arithmetic nor bytes: run eagerly, the framework's glue
                      (Python, module calls, the dispatcher, views, cache bookkeeping), measured now on the model's
                      skeleton (tformer.measure.step.framework_overhead); compiled, the profile's bare per-call cost
                      (the graph still launches one kernel per fused op)

Shared by the report's real-model section and bench/llamacpp.py, which set it beside the measured step.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, replace

import torch

from tformer.cost.ledger import Workload, ledger
from tformer.cost.roofline import roofline
from tformer.measure.step import framework_overhead

CONTEXT = 64  # the context the predicted step reads: a short chat's
ATTENTION_KINDS = ("scores", "softmax", "context")  # the ledger's rows of one layer's attention


@dataclass(frozen=True)
class StepPrediction:
    products_s: float  # weight products (Linears and the LM head), at the measured rates
    others_s: float  # every other op's arithmetic and bytes but attention's
    attention_s: float  # every layer's attention: the roofline's, or the row-exact routine measured
    per_op_s: float  # the fixed cost charged to each ledger op
    n_ops: int
    how: str  # where per_op_s comes from, one line
    bytes_read: int  # what one step reads (weights, cache, activations)

    @property
    def fixed_s(self) -> float:
        return self.per_op_s * self.n_ops

    @property
    def step_s(self) -> float:
        return self.products_s + self.attention_s + self.others_s + self.fixed_s

    def to_dict(self) -> dict:
        return {"predicted_products_s": self.products_s, "predicted_attention_s": self.attention_s,
                "predicted_others_s": self.others_s, "predicted_fixed_s": self.fixed_s, "per_op_s": self.per_op_s,
                "ops": self.n_ops, "per_op_how": self.how, "bytes_read": self.bytes_read,
                "predicted_step_s": self.step_s}


def _is_weight_product(op) -> bool:
    return op.matmul_flops > 0 and op.weight_bytes > 0


def row_exact_call_s(config, context: int, reps: int = 7, calls: int = 50) -> float:
    """Seconds of one decode query's row-exact attention (tformer.model.ggml_kernel.attend) over ``context`` + 1
    keys, at the model's heads, key/value heads and head width: the median of ``reps`` runs of ``calls``."""
    from tformer.model import ggml_kernel  # deferred: the extension loads only where this is asked

    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, config.n_heads, 1, config.head_dim, generator=gen)
    k, v = (torch.randn(1, config.n_kv_heads, context + 1, config.head_dim, generator=gen) for _ in range(2))
    scale = config.head_dim ** -0.5
    for _ in range(5):
        ggml_kernel.attend(q, k, v, None, context, scale)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        for _ in range(calls):
            ggml_kernel.attend(q, k, v, None, context, scale)
        times.append((time.perf_counter() - t) / calls)
    return statistics.median(times)


def predict_decode_step(config, device, *, compiled: bool, context: int = CONTEXT,
                        glue: tuple[float, str] | None = None, row_exact: bool = False) -> StepPrediction:
    """One decode step of ``config`` (batch 1, ``context`` tokens held) on ``device`` (a measured profile's
    Device), run eagerly or as a compiled graph. Its weight products read at the rate of the layout each holds
    (config.quantize*), where the profile has measured it. ``glue``: an eager (per-op seconds, how) already
    measured for this model's skeleton (the same whatever its weights' format), instead of timing it again.
    ``row_exact``: the step's attention is the block kernel's row-exact routine (use_path "blocks")."""
    work = Workload(phase="decode", batch=1, seq=context + 1, context=context)
    book = ledger(config, work)
    bare = roofline(book, replace(device, call_overhead_s=None))
    if not isinstance(bare.time_s, float):
        raise ValueError(f"{device.name} has no measured roofs to predict a step on; run `tformer bench`")
    products = sum(t.time_s for op, t in zip(book.ops, bare.ops) if _is_weight_product(op))
    roofline_attention = sum(t.time_s for op, t in zip(book.ops, bare.ops) if op.kind in ATTENTION_KINDS)
    others = bare.time_s - products - roofline_attention
    # row-exact: one C call per layer (its fixed cost dominates at decode), timed at the model's shapes
    attention = config.n_layers * row_exact_call_s(config, context) if row_exact else roofline_attention
    if compiled:
        per_op, how = device.call_overhead_s or 0.0, "the profile's bare per-call cost"
    elif glue is not None:
        per_op, how = glue
    else:
        plain = config.replace(quantize="none", quantize_layers=None, quantize_head="none")
        per_op, how = framework_overhead(plain, work, "cpu", device)
    return StepPrediction(products_s=products, others_s=others, attention_s=attention, per_op_s=per_op,
                          n_ops=len(book.ops), how=how, bytes_read=sum(op.bytes_read for op in book.ops))


__all__ = ["CONTEXT", "StepPrediction", "predict_decode_step"]
