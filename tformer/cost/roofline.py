"""The roofline: how long each op takes on a device, and whether compute or memory bounds it.

    attainable FLOP/s = min(peak, bandwidth x intensity)       (Williams, Waterman & Patterson 2009)
    ridge point       = peak / bandwidth   (FLOP/byte where the two roofs meet)
    time              = max(flops / peak, bytes / bandwidth) / efficiency

``efficiency`` (default 1: the ideal roofline) scales both roofs, so predicted times stay a
labelled idealisation unless the user says otherwise. A device whose peak or bandwidth is unknown
gives "unknown": never another device's number.
"""

from __future__ import annotations

from dataclasses import dataclass

# The peak a workload's matmuls run at. int8 weights are dequantised and multiplied in fp16
# (weights-only quantisation); fp32 uses the plain fp32 peak, not TF32.
COMPUTE_DTYPE = {"fp32": "fp32", "fp16": "fp16", "bf16": "bf16", "int8": "fp16"}
UNKNOWN = "unknown"


def ridge_point(peak_flops: float, bandwidth: float) -> float:
    """FLOP/byte at which a kernel stops being memory-bound."""
    return peak_flops / bandwidth


def attainable_flops(peak_flops: float, bandwidth: float, intensity: float) -> float:
    return min(peak_flops, bandwidth * intensity)


def compute_time(flops: float, peak_flops: float, utilization: float = 1.0) -> float:
    """Seconds to do ``flops`` at ``utilization`` of ``peak_flops`` (no memory term)."""
    return flops / (peak_flops * utilization)


def memory_time(nbytes: float, bandwidth: float, efficiency: float = 1.0) -> float:
    """Seconds to move ``nbytes`` at ``efficiency`` of ``bandwidth`` bytes/s."""
    return nbytes / (bandwidth * efficiency)


def op_time(flops: float, nbytes: float, peak_flops: float, bandwidth: float, efficiency: float = 1.0) -> tuple[float, str]:
    """Roofline time of one op, and its bound ('compute' | 'memory')."""
    t_compute = flops / (peak_flops * efficiency)
    t_memory = nbytes / (bandwidth * efficiency)
    return max(t_compute, t_memory), ("compute" if t_compute >= t_memory else "memory")


@dataclass
class OpTime:
    name: str
    phase: str
    kind: str
    intensity: float | None
    attainable_flops: float | str
    time_s: float | str
    bound: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Roofline:
    device: str
    source: str
    dtype: str
    peak_flops: float | str
    bandwidth: float | str
    ridge_point: float | str
    efficiency: float
    ops: list[OpTime]
    time_s: float | str
    time_by_phase: dict
    bound_share: dict  # seconds spent compute-bound vs memory-bound

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["ops"] = [o.to_dict() for o in self.ops]
        return d


def roofline(ledger, device, efficiency: float = 1.0) -> Roofline:
    """Per-op and total predicted time of ``ledger`` on ``device`` (a tformer.cost.hardware.Device)."""
    from tformer.errors import TformerError

    if not 0 < efficiency <= 1:
        raise TformerError(f"efficiency must be in (0, 1], got {efficiency}; 1 is the ideal roofline")
    dtype = COMPUTE_DTYPE[ledger.workload.dtype]
    peak = device.peak(dtype)
    bw = device.bandwidth
    known = bool(peak) and bool(bw)
    rows: list[OpTime] = []
    total = 0.0
    by_phase: dict[str, float] = {}
    share = {"compute": 0.0, "memory": 0.0}
    for op in ledger.ops:
        if known:
            t, bound = op_time(op.flops, op.bytes, peak, bw, efficiency)
            att = attainable_flops(peak, bw, op.intensity) if op.intensity is not None else peak
            total += t
            by_phase[op.phase] = by_phase.get(op.phase, 0.0) + t
            share[bound] += t
            rows.append(OpTime(op.name, op.phase, op.kind, op.intensity, att, t, bound))
        else:
            rows.append(OpTime(op.name, op.phase, op.kind, op.intensity, UNKNOWN, UNKNOWN, UNKNOWN))
    return Roofline(
        device=device.name, source=device.source, dtype=dtype,
        peak_flops=peak if peak else UNKNOWN, bandwidth=bw if bw else UNKNOWN,
        ridge_point=ridge_point(peak, bw) if known else UNKNOWN, efficiency=efficiency,
        ops=rows, time_s=total if known else UNKNOWN, time_by_phase=by_phase if known else {},
        bound_share=share if known else {},
    )
