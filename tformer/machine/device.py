"""The Device record: a device's roofs (peak compute per dtype, memory bandwidth), each with its source.

Every Device is built by ``Device.from_roofs``, called from one of four places in tformer.machine:

- the spec table (tformer.machine.spec_table: vendor datasheets and whitepapers, each entry names its source);
- a description of the machine given by the user (tformer.machine.describe: the course's formulas from
  cores, SIMD width, FMA units, clock; memory transfer rate, bus width, channels);
- this machine's detected specs (tformer.machine.specs.MachineSpecs.cpu_device / gpu_device);
- measurement on this machine (tformer.machine.bench_records.BenchResult.to_device, a `tformer bench` profile).

Conventions: FLOP/s count 2 per multiply-accumulate; int8 figures are operations per second
(OPS), stored under the "int8" key; bandwidth is bytes/s (1 GB/s = 1e9 B/s); memory sizes of
HBM/GDDR parts are the datasheet's "GB", which for these parts is GiB (2**30 bytes). Dense and
2:4-sparse throughput are kept in separate dicts. A number the source does not give stays None:
never another device's number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields

from tformer.core.quant_formats import GGML_BLOCKS

DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")
DTYPE_BITS = {"fp64": 64, "fp32": 32, "tf32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8}

T = 1e12
GiB = 2**30


def _row_class(points, rows: int) -> int | None:
    """Which measured row count a ``rows``-row product reads at: one row the one-row points (a GEMV kernel); 2 or more
    the smallest measured count >= 2 that covers them (a GEMM kernel). None when none does."""
    if rows < 1 or not points:
        return None
    if rows == 1:
        return 1
    covering = sorted({int(r) for r, _, _ in points if int(r) >= rows and int(r) >= 2})
    return covering[0] if covering else None


def _interp_log(curve, x: float) -> float | None:
    """y at x on a measured [[x, y], ...] curve: linear in log x between points, flat beyond the ends."""
    curve = sorted(curve or [])
    if not curve:
        return None
    if x <= curve[0][0]:
        return float(curve[0][1])
    if x >= curve[-1][0]:
        return float(curve[-1][1])
    for (x0, y0), (x1, y1) in zip(curve, curve[1:]):
        if x0 <= x <= x1:
            f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            return float(y0 + f * (y1 - y0))
    return float(curve[-1][1])  # unreachable: the loop covers every x between the ends


@dataclass
class Device:
    """A device's roofs. A peak that is not known is absent/None: never another device's number."""

    name: str
    kind: str  # "gpu" | "cpu" | "tpu" | "custom" | "measured"
    peak_flops: dict[str, float] = field(default_factory=dict)  # dtype -> dense FLOP/s (FLOPs = 2 x MACs)
    sparse_flops: dict[str, float] = field(default_factory=dict)  # dtype -> FLOP/s with 2:4 sparsity
    bandwidth: float | None = None  # bytes/s to main memory (HBM / DRAM)
    memory_bytes: int | None = None
    source: str = "unknown"  # where the numbers come from: "spec table: ...", "computed from ...", "measured ..."
    notes: str = ""
    # Dense FLOP/s without tensor cores / matrix engines (CUDA cores, SIMD units), where the source
    # gives it. peak_flops is the best a matmul can reach; the gap between the two is what the
    # tensor cores add, which is why they are kept apart.
    vector_flops: dict[str, float] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()
    # Measured detail (a `tformer bench` profile; absent for table and formula devices). The single
    # peak and bandwidth above make the textbook roofline; these let the roofline predict each op at
    # its own size: small matmuls run below the peak, and read-heavy streams beat copy bandwidth.
    matmul_curve: dict[str, list[list[float]]] = field(default_factory=dict)  # dtype -> [[n, FLOP/s], ...] (n x n x n)
    stream_bandwidth: dict[str, float] = field(default_factory=dict)  # STREAM kernel -> bytes/s
    call_overhead_s: float | None = None  # measured fixed seconds per op call (dispatch, Python), if known
    # dtype -> [[rows, k, bytes/s], ...]: the rate at which a matmul with few rows (nn.Linear on 1 or
    # 8 tokens, W with k inputs per row) reads its weights, measured on a W beyond the last-level cache.
    # It is not the STREAM rate: on a 2-core EPYC one row reads at ~13 GB/s (k = 768) to ~25 GB/s
    # (k = 8192), and 2-16 rows run the GEMM kernel at ~7-12 GB/s. Decode is a chain of these. Empty
    # for table/formula devices and for profiles saved before it was measured: STREAM is used then.
    gemv_bandwidth: dict[str, list[list[float]]] = field(default_factory=dict)
    # kernel ("add", "gelu", "layer_norm", "softmax") -> [[output elements, bytes/s], ...]: the rate
    # the model's element-wise ops really run at (fp32, every input and output counted once). Empty
    # where not measured: STREAM is used then.
    elementwise_bandwidth: dict[str, list[list[float]]] = field(default_factory=dict)

    @classmethod
    def from_roofs(cls, name: str, kind: str, peak_flops: dict, *, source: str, bandwidth: float | None = None,
                   memory_bytes: int | None = None, notes: str = "", **detail) -> "Device":
        """The one construction path: a peak given as None (unknown, or not native) is left out, so it
        reads as unknown and is never filled from elsewhere. ``detail``: the other Device fields."""
        return cls(name=name, kind=kind, peak_flops={d: v for d, v in peak_flops.items() if v is not None},
                   bandwidth=bandwidth, memory_bytes=memory_bytes, source=source, notes=notes, **detail)

    def peak(self, dtype: str) -> float | None:
        return self.peak_flops.get(dtype)

    def matmul_rate(self, dtype: str, m: int, n: int, k: int) -> float | None:
        """Measured FLOP/s of an (m x k) @ (k x n) matmul, read off the n x n x n curve.

        The curve is indexed by the cube root of m*n*k (the square matmul with the same FLOPs),
        interpolated linearly in log n between measured sizes and held flat beyond both ends.
        None when no curve was measured for ``dtype``.
        """
        if min(m, n, k) <= 0:
            return None
        return _interp_log(self.matmul_curve.get(dtype), (float(m) * n * k) ** (1.0 / 3.0))

    def gemv_rate(self, dtype: str, rows: int, k: int) -> float | None:
        """Measured bytes/s at which a ``rows``-row matmul reads a weight matrix of ``k`` inputs per row.

        One row uses the one-row points (a GEMV kernel); 2 or more rows use the smallest measured
        row count >= 2 that covers ``rows`` (a GEMM kernel; conservative for 2-7 rows, which read
        somewhat faster than 8). Interpolated in log k, flat beyond the measured k. None when not measured
        for ``dtype`` or ``rows`` is above every measured row count.
        """
        points = self.gemv_bandwidth.get(dtype) or []
        cls = _row_class(points, rows) if k >= 1 else None
        if cls is None:
            return None
        return _interp_log([[kk, bw] for r, kk, bw in points if int(r) == cls], float(k))

    def call_rate(self, layout: str, rows: int, weight_bytes: int) -> float | None:
        """Measured bytes/s of one block-kernel call reading ``weight_bytes`` of a ``layout`` matrix (a kept GGUF
        block format) at ``rows`` rows: a call costs a fixed time (the dispatch, rounding the activations, waking
        the kernel's threads) plus its bytes at a stream rate, both fitted by least squares on the measured points
        of that layout and row class (square W of k x k, its bytes known from the format). A small matrix (a 576 x 192
        K projection) then reads far below a large one's rate, as it does. None when fewer than two points of that
        class were measured, or the layout is not a block format (gemv_rate then)."""
        block = GGML_BLOCKS.get(layout.upper())
        points = self.gemv_bandwidth.get(layout) or []
        cls = _row_class(points, rows)
        if block is None or weight_bytes <= 0 or cls is None:
            return None
        per_weight = block[1] / block[0]  # bytes a weight takes in this block format
        calls = [(k * k * per_weight, k * k * per_weight / bw) for r, k, bw in points if int(r) == cls and bw > 0]
        if len(calls) < 2:
            return None
        n = len(calls)
        mean_b, mean_t = sum(b for b, _ in calls) / n, sum(t for _, t in calls) / n
        spread = sum((b - mean_b) ** 2 for b, _ in calls)
        per_byte = sum((b - mean_b) * (t - mean_t) for b, t in calls) / spread if spread else 0.0
        fixed = mean_t - per_byte * mean_b
        if per_byte <= 0:
            return None
        if fixed < 0:  # no measurable fixed cost: the rate through the origin
            fixed, per_byte = 0.0, sum(t for _, t in calls) / sum(b for b, _ in calls)
        return weight_bytes / (fixed + weight_bytes * per_byte)

    def elementwise_rate(self, kernel: str, elements: int) -> float | None:
        """Measured bytes/s of an element-wise ``kernel`` with ``elements`` outputs (log-interpolated in
        the size, flat beyond the measured ones); None when that kernel was not measured."""
        if elements < 1:
            return None
        return _interp_log(self.elementwise_bandwidth.get(kernel), float(elements))

    def ridge_point(self, dtype: str) -> float | None:
        """FLOPs per byte at which compute and bandwidth roofs meet."""
        peak = self.peak(dtype)
        if peak is None or not self.bandwidth:
            return None
        return peak / self.bandwidth

    def to_dict(self) -> dict:
        return {f.name: (list(getattr(self, f.name)) if f.name == "aliases" else getattr(self, f.name))
                for f in fields(self)}


__all__ = ["DTYPES", "DTYPE_BITS", "Device", "GiB", "T"]
