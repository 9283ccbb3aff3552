"""Decode speed by batch size: what batching buys, predicted by the ledger's roofline (no torch).

A decode step over b sequences reads the weights once for all b new tokens, while its FLOPs, its
KV-cache reads and its activations grow with b. Each group of ops costs, as one roofline,

    t(b) = max(b x F / peak, (W + b x R) / bandwidth)

with W the bytes read once per step (the weights), R the bytes each row adds (its activations; for
attention, its KV cache) and F the FLOPs each row adds. For the weight matmuls batching is nearly
free while the weight read dominates and stops paying once compute catches up, at the crossover

    b* = (W / bandwidth) / (F / peak - R / bandwidth)        (about 2 x the ridge point in fp32)

The rest of the step (attention over the KV cache, norms, activations) reads bytes in proportion to b
and gains nothing. So tokens/s grow about linearly up to b*, then saturate.

``decode_speed`` predicts one step op by op (tformer.cost.roofline on the ledger's decode op list,
with the device's measured profile when it has one): the number `tformer count --phase decode` and
the report give at batch 1. ``decode_terms`` reads W, R and F of both groups off the ledger (it is
linear in b, so batch sizes 1 and 2 give them exactly); ``crossover_batch`` solves for b*.
"""

from __future__ import annotations

from dataclasses import dataclass

from tformer.core.errors import TformerError
from tformer.cost.ledger import ledger
from tformer.cost.roofline import COMPUTE_DTYPE, roofline
from tformer.cost.workload import Workload


@dataclass(frozen=True)
class DecodeSpeed:
    """One predicted decode step over ``batch`` rows at ``context`` cached tokens each."""

    batch: int
    context: int
    seconds: float | None  # None: the device's peak or bandwidth is unknown
    bound: str  # where most of the step's time goes: compute | memory | overhead | unknown

    @property
    def tokens_per_s(self) -> float | None:
        return self.batch / self.seconds if self.seconds else None


@dataclass(frozen=True)
class OpGroup:
    """Ops costed as one roofline: bytes paid once per step, bytes and FLOPs each row adds."""

    fixed_bytes: int
    row_bytes: int
    row_flops: int

    def seconds(self, batch: int, peak: float, bandwidth: float) -> float:
        return max(batch * self.row_flops / peak, (self.fixed_bytes + batch * self.row_bytes) / bandwidth)


@dataclass(frozen=True)
class DecodeTerms:
    """A decode step as two roofline groups: the weight matmuls (nn.Linear and the LM head: the
    weights read once) and the rest (attention over each row's KV cache, norms, activations, adds)."""

    weights: OpGroup
    rest: OpGroup
    kv_bytes_per_row: int  # the KV cache each row reads (part of rest.row_bytes)

    def step_seconds(self, batch: int, peak: float, bandwidth: float) -> float:
        return self.weights.seconds(batch, peak, bandwidth) + self.rest.seconds(batch, peak, bandwidth)

    def speedup(self, batch: int, peak: float, bandwidth: float) -> float:
        """tokens/s at ``batch`` over tokens/s at 1."""
        return batch * self.step_seconds(1, peak, bandwidth) / self.step_seconds(batch, peak, bandwidth)


def _check(batch, context) -> None:
    for name, value in (("batch", batch), ("context", context)):
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "batch" else 0):
            raise TformerError(f"{name} must be a whole number >= {1 if name == 'batch' else 0}, got {value!r}")


def decode_ledger(config, batch: int, context: int, dtype: str = "fp32"):
    """The ledger of one decode step: ``batch`` rows, each with ``context`` tokens already cached."""
    _check(batch, context)
    return ledger(config, Workload(phase="decode", batch=batch, seq=context + 1, context=context, dtype=dtype))


def decode_speed(config, device, batch: int, context: int, *, dtype: str = "fp32", efficiency: float = 1.0,
                 model: str = "auto") -> DecodeSpeed:
    """Predicted seconds of one decode step over ``batch`` rows and its tokens/s (= batch / seconds).

    ``model`` as in tformer.cost.roofline.roofline: "auto" uses the device's measured profile when it
    carries one."""
    roof = roofline(decode_ledger(config, batch, context, dtype), device, efficiency, model)
    if not isinstance(roof.time_s, float):
        return DecodeSpeed(batch, context, None, "unknown")
    share = roof.bound_share
    return DecodeSpeed(batch, context, roof.time_s, max(share, key=share.get))


def decode_speedups(config, device, batches, context: int, **options) -> list[dict]:
    """For each batch size: predicted seconds per step, tokens/s and speed-up over batch 1."""
    base = decode_speed(config, device, 1, context, **options)
    rows = []
    for b in batches:
        s = decode_speed(config, device, b, context, **options)
        speedup = s.tokens_per_s / base.tokens_per_s if s.tokens_per_s and base.tokens_per_s else None
        rows.append({"batch": b, "context": context, "seconds": s.seconds, "tokens_per_s": s.tokens_per_s,
                     "speedup": speedup, "bound": s.bound})
    return rows


def decode_terms(config, context: int, dtype: str = "fp32") -> DecodeTerms:
    """Both groups' W, R and F at ``context``: every op is linear in the batch, so the ledgers at batch
    1 and 2 give them exactly (fixed = 2 x X(1) - X(2); per row = X(2) - X(1))."""
    one, two = decode_ledger(config, 1, context, dtype), decode_ledger(config, 2, context, dtype)

    def group(weights: bool) -> OpGroup:
        def totals(lg) -> tuple[int, int]:
            ops = [op for op in lg.ops if _weight_matmul(op) == weights]
            return lg.total(ops, "bytes"), lg.total(ops, "flops")

        (bytes1, flops1), (bytes2, flops2) = totals(one), totals(two)
        if 2 * flops1 != flops2:  # a FLOP paid once per step would fall outside the form
            raise TformerError("this model's decode FLOPs are not proportional to the batch; the two-group "
                               "roofline does not apply (use decode_speed)")
        return OpGroup(fixed_bytes=2 * bytes1 - bytes2, row_bytes=bytes2 - bytes1, row_flops=flops1)

    kv = one.total(one.select(kind=("scores", "context")), "cache_bytes")
    return DecodeTerms(weights=group(True), rest=group(False), kv_bytes_per_row=kv)


def _weight_matmul(op) -> bool:
    return op.dims is not None and op.dims.weight


def crossover_batch(group: OpGroup, peak: float, bandwidth: float) -> float | None:
    """b* where b F / peak = (W + b R) / bandwidth; None when a row's own bytes outrun its FLOPs
    (R / bandwidth >= F / peak: memory-bound at every batch)."""
    per_row = group.row_flops / peak - group.row_bytes / bandwidth
    if per_row <= 0:
        return None
    return (group.fixed_bytes / bandwidth) / per_row


def device_roofs(device, dtype: str = "fp32") -> tuple[float | None, float | None]:
    """(peak FLOP/s for the dtype a workload in ``dtype`` computes in, bandwidth bytes/s)."""
    return device.peak(COMPUTE_DTYPE[dtype]), device.bandwidth


__all__ = ["DecodeSpeed", "DecodeTerms", "OpGroup", "crossover_batch", "decode_ledger", "decode_speed",
           "decode_speedups", "decode_terms", "device_roofs"]
