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

from tformer.core.errors import TformerError

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


# --------------------------------------------------------------------------------------------
# The measured roofline: each op at its own size (used when the device carries a bench profile)
# --------------------------------------------------------------------------------------------
#   matmul time  = matmul FLOPs / (measured FLOP/s of a matmul this size)     (the bench's curve)
#   other time   = element-wise FLOPs / peak
#   memory time  = bytes / (measured STREAM bandwidth of the kernel with the same read share)
#   time         = max(matmul + other, memory) / efficiency + measured per-call overhead
# No constant is fitted to a model: every number is read off the device's measured profile.

# Fraction of an op's bytes that are reads -> the STREAM kernel that moves bytes in that proportion
# (copy and scale read one array and write one: 1/2; add and triad read two and write one: 2/3).
_STREAM_BY_READ_SHARE = ((0.5, ("copy", "scale")), (2 / 3, ("triad", "add")))


# A matmul with few rows reads its weights at the measured few-row rate (bench: y = x @ W.T + b with x
# of 1 and 8 rows through the model's own Linear call, W beyond the cache), not at STREAM's: a GEMV
# kernel or a GEMM kernel that packs W does not stream like triad (on a 2-core EPYC: 1 row 17-18
# GB/s, 8 rows 7-8 GB/s, copy 18-38 GB/s by the day). Such a product has intensity ~M/2 FLOP/B
# in fp32 (<= 4 at M <= 8), below the ridge point, so its time is the weight read. Up to 8 rows, the
# largest measured (and `tformer profile`'s default decode batch); beyond, STREAM as before (no
# measurement to extrapolate from). Only a product with a 2-D right operand (a weight, as in
# nn.Linear) qualifies: attention's batched products in decode are bmm calls over the KV cache.
GEMV_MAX_ROWS = 8


def gemv_dims(op) -> tuple[int, int] | None:
    """(rows, k) when ``op`` is a product of at most GEMV_MAX_ROWS rows with a weight matrix, else None."""
    dims = op.dims
    if dims is None or not dims.weight or not op.matmul_flops:
        return None
    rows = dims.batch * dims.m  # nn.Linear flattens every leading dim into the rows of one product
    return (rows, dims.k) if rows <= GEMV_MAX_ROWS else None


def gemv_bandwidth_for(op, device, dtype: str) -> float | None:
    """The measured weight-read bytes/s for a few-row weight product, or None (use STREAM). A product whose
    weights are kept in a block layout reads at the rate measured for that layout (the block kernel's, keyed
    by the layout's name: `tformer bench` measures each where the kernel is built), else at the float rate."""
    if not getattr(device, "gemv_bandwidth", None):
        return None
    dims = gemv_dims(op)
    if dims is None:
        return None
    layout = getattr(op, "weight_layout", "")
    if layout and device.gemv_bandwidth.get(layout):
        # a member of one stacked product (q, k, v) reads at that call's rate: the call's fixed cost charged once
        return device.call_rate(layout, dims[0], op.stack_bytes or op.weight_bytes) or device.gemv_rate(layout, *dims)
    return device.gemv_rate(dtype, *dims)


# The measured element-wise kernel each op kind runs (residual and position adds, the activation, the
# norms, attention's softmax), forward and backward alike: their rates, not STREAM's, are what the
# model meets (fp32 measurements; other dtypes stay on STREAM).
ELEMENTWISE_KERNEL = {"residual": "add", "position": "add", "activation": "gelu", "norm": "layer_norm",
                      "softmax": "softmax"}


def elementwise_bandwidth_for(op, device, dtype: str) -> float | None:
    """The measured bytes/s of the element-wise kernel ``op`` runs, at its output size, or None."""
    kernel = ELEMENTWISE_KERNEL.get(op.kind)
    if kernel is None or op.matmul_flops or dtype != "fp32" or not getattr(device, "elementwise_bandwidth", None):
        return None
    return device.elementwise_rate(kernel, max(1, op.bytes_written // 4))


def stream_bandwidth_for(op, device) -> tuple[float | None, str]:
    """The measured bandwidth (and kernel name) whose read/write mix is closest to the op's."""
    measured = getattr(device, "stream_bandwidth", None) or {}
    if not measured or not op.bytes:
        return device.bandwidth, "bandwidth"
    share = op.bytes_read / op.bytes
    _, kernels = min(_STREAM_BY_READ_SHARE, key=lambda item: abs(item[0] - share))
    known = [(measured[k], k) for k in kernels if k in measured]
    if not known:
        return device.bandwidth, "bandwidth"
    return max(known)


def measured_op_time(op, device, dtype: str, peak: float, efficiency: float = 1.0) -> tuple[float, str, float | None]:
    """(seconds, bound, matmul FLOP/s used) of one op on a device with a measured profile.

    bound: 'compute' | 'memory' | 'overhead' (the fixed per-call cost is larger than either roof).
    """
    rate = None
    t_mm = 0.0
    if op.matmul_flops:
        dims = op.dims
        if dims is not None:
            rate = device.matmul_rate(dtype, dims.m, dims.n, dims.k)
        rate = rate or peak
        t_mm = op.matmul_flops / rate
    t_compute = (t_mm + op.other_flops / peak) / efficiency
    bw = gemv_bandwidth_for(op, device, dtype) or elementwise_bandwidth_for(op, device, dtype) \
        or stream_bandwidth_for(op, device)[0]
    t_memory = op.bytes / (bw * efficiency) if bw else 0.0
    overhead = device.call_overhead_s or 0.0
    roof = max(t_compute, t_memory)
    bound = "compute" if t_compute >= t_memory else "memory"
    if overhead > roof:
        bound = "overhead"
    return roof + overhead, bound, rate


@dataclass
class OpTime:
    name: str
    phase: str
    kind: str
    intensity: float | None
    attainable_flops: float | str
    time_s: float | str
    bound: str
    matmul_rate: float | None = None  # measured model: the FLOP/s read off the curve for this op's size

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
    model: str = "roofline: max(FLOPs / peak, bytes / bandwidth) per op"

    def to_dict(self) -> dict:
        d = dict(self.__dict__)
        d["ops"] = [o.to_dict() for o in self.ops]
        return d


def uses_measured_model(device) -> bool:
    return bool(getattr(device, "matmul_curve", None))


def roofline(ledger, device, efficiency: float = 1.0, model: str = "auto") -> Roofline:
    """Per-op and total predicted time of ``ledger`` on ``device`` (a tformer.machine.device.Device).

    model: "auto" (the measured model when the device carries a bench profile's matmul curve, else
    the textbook roofline), "peak" (always the single-peak roofline) or "measured".
    """
    if not 0 < efficiency <= 1:
        raise TformerError(f"efficiency must be in (0, 1], got {efficiency}; 1 is the ideal roofline")
    if model not in ("auto", "peak", "measured"):
        raise TformerError(f"roofline model {model!r} is unknown; choose auto, peak or measured")
    dtype = COMPUTE_DTYPE[ledger.workload.dtype]
    peak = device.peak(dtype)
    bw = device.bandwidth
    known = bool(peak) and bool(bw)
    detailed = known and (model == "measured" or (model == "auto" and uses_measured_model(device)))
    if model == "measured" and not uses_measured_model(device):
        raise TformerError(f"{device.name} has no measured matmul curve; run `tformer bench` and use --hardware measured")
    rows: list[OpTime] = []
    total = 0.0
    by_phase: dict[str, float] = {}
    share = {"compute": 0.0, "memory": 0.0}
    if detailed:
        share["overhead"] = 0.0
    for op in ledger.ops:
        if known:
            rate = None
            if detailed:
                t, bound, rate = measured_op_time(op, device, dtype, peak, efficiency)
            else:
                t, bound = op_time(op.flops, op.bytes, peak, bw, efficiency)
            att = attainable_flops(peak, bw, op.intensity) if op.intensity is not None else peak
            total += t
            by_phase[op.phase] = by_phase.get(op.phase, 0.0) + t
            share[bound] += t
            rows.append(OpTime(op.name, op.phase, op.kind, op.intensity, att, t, bound, rate))
        else:
            rows.append(OpTime(op.name, op.phase, op.kind, op.intensity, UNKNOWN, UNKNOWN, UNKNOWN))
    return Roofline(
        device=device.name, source=device.source, dtype=dtype,
        peak_flops=peak if peak else UNKNOWN, bandwidth=bw if bw else UNKNOWN,
        ridge_point=ridge_point(peak, bw) if known else UNKNOWN, efficiency=efficiency,
        ops=rows, time_s=total if known else UNKNOWN, time_by_phase=by_phase if known else {},
        bound_share=share if known else {},
        model=(MEASURED_MODEL + _gemv_note(device, dtype) + _kernel_note(device, ledger)
               + (f"; + {device.call_overhead_s * 1e6:.1f} µs measured per-op overhead"
                  if device.call_overhead_s else "")) if detailed else Roofline.model,
    )


MEASURED_MODEL = ("measured roofline: max(matmul FLOPs / FLOP/s of the measured curve at the op's size "
                  "+ other FLOPs / peak, bytes / measured bandwidth: of the element-wise kernel the op runs "
                  "(add, gelu, layer_norm, softmax) at its size where measured, else STREAM's of the matching "
                  "read/write mix)")


def _kernel_note(device, ledger) -> str:
    """Which block layouts' weight products read at the block kernel's measured rate."""
    measured = getattr(device, "gemv_bandwidth", None) or {}
    layouts = sorted({op.weight_layout for op in ledger.ops if getattr(op, "weight_layout", "")})
    used = [name for name in layouts if measured.get(name)]
    missing = [name for name in layouts if not measured.get(name)]
    text = f"; {', '.join(used)} blocks at the block kernel's measured rate" if used else ""
    if missing:
        text += f"; {', '.join(missing)} blocks at the float rate (the kernel's not measured: rerun `tformer bench`)"
    return text


def _gemv_note(device, dtype: str) -> str:
    points = sorted((getattr(device, "gemv_bandwidth", None) or {}).get(dtype) or [])
    if not points:
        return "; few-row matmuls on STREAM too (no GEMV bandwidth measured: rerun `tformer bench`)"
    text = ", ".join(f"{bw / 1e9:.1f} GB/s at {int(r)} row{'s' if r > 1 else ''} k={int(k)}" for r, k, bw in points)
    return (f"; weight matmuls with <= {GEMV_MAX_ROWS} rows (decode): bytes / measured GEMV weight-read "
            f"bandwidth ({text}; 1 row: 1-row points, 2-{GEMV_MAX_ROWS} rows: {GEMV_MAX_ROWS}-row points, "
            "log-interpolated in k)")
