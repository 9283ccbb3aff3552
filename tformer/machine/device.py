"""Devices: peak compute and memory bandwidth, each number with its source.

Three ways to get a Device:

- the spec table below (vendor datasheets and whitepapers, every entry names its source);
- the course's formulas, from a description of the machine (cores, SIMD width, FMA units, clock;
  memory transfer rate, bus width, channels) given on the command line or in a JSON file;
- measurement on this machine (`tformer bench`, loaded with ``resolve_hardware("measured")``).

Conventions: FLOP/s count 2 per multiply-accumulate; int8 figures are operations per second
(OPS), stored under the "int8" key; bandwidth is bytes/s (1 GB/s = 1e9 B/s); memory sizes of
HBM/GDDR parts are the datasheet's "GB", which for these parts is GiB (2**30 bytes). Dense and
2:4-sparse throughput are kept in separate dicts. A number the source does not give stays None:
never another device's number.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field, fields

from tformer.core.errors import TformerError

DTYPES = ("fp64", "fp32", "tf32", "fp16", "bf16", "fp8", "int8")
DTYPE_BITS = {"fp64": 64, "fp32": 32, "tf32": 32, "fp16": 16, "bf16": 16, "fp8": 8, "int8": 8}

T = 1e12
GiB = 2**30


def _interp_log(curve, x: float) -> float | None:
    """y at x on a measured [[x, y], ...] curve: linear in log x between points, flat beyond the ends."""
    import math

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
        if rows < 1 or k < 1 or not points:
            return None
        if rows == 1:
            cls = 1
        else:
            covering = sorted({int(r) for r, _, _ in points if int(r) >= rows and int(r) >= 2})
            if not covering:
                return None
            cls = covering[0]
        return _interp_log([[kk, bw] for r, kk, bw in points if int(r) == cls], float(k))

    def ridge_point(self, dtype: str) -> float | None:
        """FLOPs per byte at which compute and bandwidth roofs meet."""
        peak = self.peak(dtype)
        if peak is None or not self.bandwidth:
            return None
        return peak / self.bandwidth

    def to_dict(self) -> dict:
        return {f.name: (list(getattr(self, f.name)) if f.name == "aliases" else getattr(self, f.name))
                for f in fields(self)}


# --------------------------------------------------------------------------------------------
# The course's formulas
# --------------------------------------------------------------------------------------------

def simd_lanes(simd_bits: int, dtype: str) -> int:
    """Elements of ``dtype`` in one SIMD register of ``simd_bits`` (AVX-512: 16 fp32, 8 fp64)."""
    if dtype not in DTYPE_BITS:
        raise TformerError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return simd_bits // DTYPE_BITS[dtype]


def cpu_peak_flops(cores: int, simd_bits: int | None, fma_units: int, clock_hz: float,
                   dtype: str = "fp32", *, lanes: int | None = None) -> float:
    """Peak = cores x lanes x 2 (an FMA is a multiply and an add) x FMA units x clock.

    ``lanes`` overrides the lanes derived from ``simd_bits`` and the dtype width, for units whose
    lane count is not register width / element width (e.g. AMX tiles).
    """
    if lanes is None:
        if not simd_bits:
            raise TformerError("cpu_peak_flops needs simd_bits or lanes")
        lanes = simd_lanes(simd_bits, dtype)
    for label, value in (("cores", cores), ("lanes", lanes), ("fma_units", fma_units), ("clock_hz", clock_hz)):
        if not value or value <= 0:
            raise TformerError(f"cpu_peak_flops: {label} must be positive, got {value!r}")
    return float(cores) * lanes * 2 * fma_units * float(clock_hz)


def memory_bandwidth(transfer_rate_mt_s: float, bus_width_bits: int = 64, channels: int = 1) -> float:
    """DRAM peak bytes/s = transfers/s x bus width in bytes x channels (DDR4-3200, 2 ch: 51.2e9)."""
    for label, value in (("transfer rate", transfer_rate_mt_s), ("bus width", bus_width_bits), ("channels", channels)):
        if not value or value <= 0:
            raise TformerError(f"memory_bandwidth: {label} must be positive, got {value!r}")
    return float(transfer_rate_mt_s) * 1e6 * bus_width_bits / 8 * channels


def gpu_bandwidth(gbps_per_pin: float, bus_bits: int) -> float:
    """GPU memory peak bytes/s = data rate per pin x bus width / 8 (RTX 3060 Ti: 14 x 256 / 8 = 448 GB/s)."""
    if not gbps_per_pin or gbps_per_pin <= 0 or not bus_bits or bus_bits <= 0:
        raise TformerError(f"gpu_bandwidth: data rate and bus width must be positive, got {gbps_per_pin!r}, {bus_bits!r}")
    return float(gbps_per_pin) * 1e9 * bus_bits / 8


# --------------------------------------------------------------------------------------------
# The spec table
# --------------------------------------------------------------------------------------------

def _dev(name, kind, dense, sparse=None, vector=None, bandwidth=None, memory_gib=None, source="", notes="",
         aliases=()):
    return Device(name=name, kind=kind,
                  peak_flops={k: v * T for k, v in dense.items()},
                  sparse_flops={k: v * T for k, v in (sparse or {}).items()},
                  vector_flops={k: v * T for k, v in (vector or {}).items()},
                  bandwidth=bandwidth, memory_bytes=int(memory_gib * GiB) if memory_gib else None,
                  source=source, notes=notes, aliases=tuple(aliases))


_A100_DENSE = {"fp64": 19.5, "fp32": 19.5, "tf32": 156, "fp16": 312, "bf16": 312, "int8": 624}
_A100_SPARSE = {"tf32": 312, "fp16": 624, "bf16": 624, "int8": 1248}
_A100_VECTOR = {"fp64": 9.7, "fp32": 19.5, "fp16": 78, "bf16": 39}
_A100_SRC = ("spec table: NVIDIA A100 Tensor Core GPU datasheet (2021); non-tensor fp16/bf16 from the "
             "NVIDIA A100 Tensor Core GPU Architecture whitepaper")
_A100_NOTE = "fp64 peak uses the FP64 tensor cores (19.5 TFLOP/s); plain fp64 is 9.7 TFLOP/s"

_H100_SXM_DENSE = {"fp64": 66.9, "fp32": 66.9, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9,
                   "int8": 1978.9}
_H100_SXM_SPARSE = {"tf32": 989.4, "fp16": 1978.9, "bf16": 1978.9, "fp8": 3957.8, "int8": 3957.8}

SPEC_TABLE: dict[str, Device] = {d.name: d for d in [
    _dev("a100-40gb-sxm", "gpu", _A100_DENSE, _A100_SPARSE, _A100_VECTOR, 1555e9, 40, _A100_SRC, _A100_NOTE,
         aliases=("a100", "a100-40gb", "a100-sxm4-40gb", "a100-sxm-40gb")),
    _dev("a100-40gb-pcie", "gpu", _A100_DENSE, _A100_SPARSE, _A100_VECTOR, 1555e9, 40, _A100_SRC, _A100_NOTE,
         aliases=("a100-pcie-40gb", "a100-pcie")),
    _dev("a100-80gb-sxm", "gpu", _A100_DENSE, _A100_SPARSE, _A100_VECTOR, 2039e9, 80, _A100_SRC, _A100_NOTE,
         aliases=("a100-80gb", "a100-sxm4-80gb", "a100-sxm-80gb")),
    _dev("a100-80gb-pcie", "gpu", _A100_DENSE, _A100_SPARSE, _A100_VECTOR, 1935e9, 80, _A100_SRC, _A100_NOTE,
         aliases=("a100-pcie-80gb",)),
    _dev("h100-sxm", "gpu", _H100_SXM_DENSE, _H100_SXM_SPARSE,
         {"fp64": 33.5, "fp32": 66.9, "fp16": 133.8, "bf16": 133.8}, 3.35e12, 80,
         "spec table: NVIDIA H100 Tensor Core GPU datasheet (3.35 TB/s, 80 GB HBM3); dense and sparse "
         "figures from the NVIDIA H100 Tensor Core GPU Architecture (Hopper) whitepaper, H100 SXM5",
         "fp64 peak uses the FP64 tensor cores; plain fp64 is 33.5 TFLOP/s",
         aliases=("h100", "h100-sxm5", "h100-80gb-hbm3", "h100-80gb")),
    _dev("h100-pcie", "gpu",
         {"fp64": 51.2, "fp32": 51.2, "tf32": 378, "fp16": 756, "bf16": 756, "fp8": 1513, "int8": 1513},
         {"tf32": 756, "fp16": 1513, "bf16": 1513, "fp8": 3026, "int8": 3026},
         {"fp64": 25.6, "fp32": 51.2}, 2.0e12, 80,
         "spec table: NVIDIA H100 Tensor Core GPU datasheet (2 TB/s, 80 GB HBM2e); dense and sparse figures "
         "from the NVIDIA H100 Tensor Core GPU Architecture (Hopper) whitepaper, H100 PCIe",
         "fp64 peak uses the FP64 tensor cores; plain fp64 is 25.6 TFLOP/s",
         aliases=("h100-pcie-80gb",)),
    _dev("h200", "gpu",
         {"fp64": 67, "fp32": 67, "tf32": 494.5, "fp16": 989.5, "bf16": 989.5, "fp8": 1979, "int8": 1979},
         {"tf32": 989, "fp16": 1979, "bf16": 1979, "fp8": 3958, "int8": 3958},
         {"fp64": 34, "fp32": 67}, 4.8e12, 141,
         "spec table: NVIDIA H200 Tensor Core GPU datasheet, H200 SXM (141 GB HBM3e, 4.8 TB/s); the datasheet "
         "gives tensor-core figures with sparsity, dense = half",
         "fp64 peak uses the FP64 tensor cores; plain fp64 is 34 TFLOP/s",
         aliases=("h200-sxm", "h200-141gb")),
    _dev("v100-sxm2-32gb", "gpu", {"fp64": 7.8, "fp32": 15.7, "fp16": 125}, {},
         {"fp64": 7.8, "fp32": 15.7, "fp16": 31.4}, 900e9, 32,
         "spec table: NVIDIA Tesla V100 GPU datasheet (SXM2); non-tensor fp16 from the NVIDIA Tesla V100 "
         "GPU Architecture (Volta) whitepaper",
         "no bf16, tf32 or int8 tensor cores; fp16 peak is the tensor cores (fp16 in, fp32 accumulate)",
         aliases=("v100", "v100-sxm2", "tesla-v100-sxm2-32gb")),
    _dev("v100-sxm2-16gb", "gpu", {"fp64": 7.8, "fp32": 15.7, "fp16": 125}, {},
         {"fp64": 7.8, "fp32": 15.7, "fp16": 31.4}, 900e9, 16,
         "spec table: NVIDIA Tesla V100 GPU datasheet (SXM2); non-tensor fp16 from the NVIDIA Tesla V100 "
         "GPU Architecture (Volta) whitepaper",
         "no bf16, tf32 or int8 tensor cores; fp16 peak is the tensor cores (fp16 in, fp32 accumulate)",
         aliases=("tesla-v100-sxm2-16gb",)),
    _dev("t4", "gpu", {"fp32": 8.1, "fp16": 65, "int8": 130}, {}, {"fp32": 8.1}, 320e9, 16,
         "spec table: NVIDIA T4 Tensor Core GPU datasheet (16 GB GDDR6, 320+ GB/s)",
         "fp16 is 'mixed precision (FP16/FP32)' tensor cores; no bf16/tf32; int4 260 TOPS",
         aliases=("tesla-t4",)),
    _dev("l4", "gpu", {"fp32": 30.3, "tf32": 60, "fp16": 121, "bf16": 121, "fp8": 242.5, "int8": 242.5},
         {"tf32": 120, "fp16": 242, "bf16": 242, "fp8": 485, "int8": 485}, {"fp32": 30.3}, 300e9, 24,
         "spec table: NVIDIA L4 Tensor Core GPU datasheet (24 GB GDDR6, 300 GB/s); the datasheet gives "
         "tensor-core figures with sparsity, dense = half",
         aliases=("nvidia-l4",)),
    _dev("rtx-3060-ti", "gpu", {"fp32": 16.2, "tf32": 16.2, "fp16": 32.4, "bf16": 32.4, "int8": 129.6},
         {"tf32": 32.4, "fp16": 64.8, "bf16": 64.8, "int8": 259.2}, {"fp32": 16.2}, gpu_bandwidth(14, 256), 8,
         "computed from the NVIDIA GeForce RTX 3060 Ti specifications (38 SMs, 4864 CUDA cores, boost "
         "1.665 GHz, 8 GB GDDR6 at 14 Gbps on a 256-bit bus) with the per-SM tensor-core rates of the NVIDIA "
         "Ampere GA102 GPU Architecture whitepaper; NVIDIA publishes no tensor TFLOP/s for this card",
         "fp16/bf16 with fp32 accumulate (what PyTorch uses); with fp16 accumulate GeForce Ampere doubles it",
         aliases=("3060ti", "rtx3060ti", "geforce-rtx-3060-ti")),
    _dev("rtx-3090", "gpu", {"fp32": 35.6, "tf32": 35.6, "fp16": 71, "bf16": 71, "int8": 284},
         {"tf32": 71, "fp16": 142, "bf16": 142, "int8": 568}, {"fp32": 35.6}, gpu_bandwidth(19.5, 384), 24,
         "spec table: NVIDIA Ampere GA102 GPU Architecture whitepaper, Appendix A (GeForce RTX 3090; 24 GB "
         "GDDR6X at 19.5 Gbps on a 384-bit bus)",
         "fp16/bf16 with fp32 accumulate (what PyTorch uses); with fp16 accumulate it is 142/284 TFLOP/s",
         aliases=("3090", "rtx3090", "geforce-rtx-3090")),
    _dev("rtx-4090", "gpu",
         {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2, "fp8": 330.3, "int8": 660.6},
         {"tf32": 165.2, "fp16": 330.4, "bf16": 330.4, "fp8": 660.6, "int8": 1321.2}, {"fp32": 82.6},
         gpu_bandwidth(21, 384), 24,
         "spec table: NVIDIA Ada GPU Architecture whitepaper, Appendix (GeForce RTX 4090; 24 GB GDDR6X at "
         "21 Gbps on a 384-bit bus)",
         "fp16/bf16/fp8 with fp32 accumulate; with fp16 accumulate fp16 is 330.3 and fp8 660.6 TFLOP/s",
         aliases=("4090", "rtx4090", "geforce-rtx-4090")),
    _dev("mi300x", "gpu",
         {"fp64": 163.4, "fp32": 163.4, "tf32": 653.7, "fp16": 1307.4, "bf16": 1307.4, "fp8": 2614.9,
          "int8": 2614.9},
         {"tf32": 1307.4, "fp16": 2614.9, "bf16": 2614.9, "fp8": 5229.8, "int8": 5229.8},
         {"fp64": 81.7, "fp32": 163.4}, 5.3e12, 192,
         "spec table: AMD Instinct MI300X accelerator datasheet (192 GB HBM3, 5.3 TB/s)",
         "fp64/fp32 peaks are the matrix cores; vector fp64 is 81.7 TFLOP/s",
         aliases=("instinct-mi300x", "amd-mi300x")),
    _dev("tpu-v4", "tpu", {"bf16": 275, "int8": 275}, {}, {}, 1200e9, 32,
         "spec table: Google Cloud TPU v4 documentation (system architecture, per chip) and Jouppi et al., "
         "'TPU v4', ISCA 2023",
         "per chip (2 TensorCores); fp32 matmul peak not published",
         aliases=("tpuv4", "v4")),
]}

_ALIASES = {alias: d.name for d in SPEC_TABLE.values() for alias in d.aliases}


def _slug(name: str) -> str:
    s = name.strip().lower().replace("_", "-").replace(" ", "-")
    while "--" in s:
        s = s.replace("--", "-")
    return s


def device_names() -> list[str]:
    return sorted(SPEC_TABLE)


def lookup(name: str) -> Device:
    """The table entry for ``name`` (a slug or alias, case and spaces ignored), as a fresh copy."""
    import copy

    key = _slug(name)
    key = _ALIASES.get(key, key)
    if key in SPEC_TABLE:
        return copy.deepcopy(SPEC_TABLE[key])
    known = sorted(set(SPEC_TABLE) | set(_ALIASES))
    close = difflib.get_close_matches(key, known, n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise TformerError(f"unknown hardware {name!r}{hint} Known: {', '.join(device_names())}; or give a JSON "
                       "file, key=value pairs (e.g. 'cores=8,simd_bits=256,fma_units=2,clock_ghz=3.0'), "
                       "or 'measured'")


def match_gpu_name(name: str, memory_bytes: int | None = None) -> str | None:
    """Map a driver's GPU name ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB") to a table entry.

    Returns None when the name does not identify one entry unambiguously: a near relative (H100 NVL,
    L40, RTX 4090 D) must not borrow its sibling's numbers.
    """
    s = _slug(name).replace("nvidia-", "").replace("geforce-", "").replace("tesla-", "")
    if "h100" in s:
        if "nvl" in s:
            return None
        return "h100-pcie" if "pcie" in s else "h100-sxm"
    if "h200" in s:
        return None if "nvl" in s else "h200"
    if "a100" in s:
        big = "80gb" in s or (memory_bytes is not None and memory_bytes > 50 * GiB)
        small = "40gb" in s or (memory_bytes is not None and memory_bytes <= 50 * GiB)
        if big == small:
            return None
        return f"a100-{'80gb' if big else '40gb'}-{'pcie' if 'pcie' in s else 'sxm'}"
    if "v100" in s:
        if "sxm2" not in s:
            return None
        big = "32gb" in s or (memory_bytes is not None and memory_bytes > 20 * GiB)
        return "v100-sxm2-32gb" if big else "v100-sxm2-16gb"
    if s in ("t4", "l4"):
        return s
    if s in ("rtx-3060-ti", "rtx-3090", "rtx-4090"):
        return s
    if "mi300x" in s:
        return "mi300x"
    return None


# --------------------------------------------------------------------------------------------
# Devices described by the user (JSON file, inline JSON, or key=value pairs)
# --------------------------------------------------------------------------------------------

_CPU_KEYS = {"cores", "simd_bits", "fma_units", "clock_hz", "clock_ghz", "bf16_native", "fp16_native",
             "int8_native"}
_MEM_KEYS = {"transfer_rate_mt_s", "bus_width_bits", "channels", "gbps_per_pin", "bus_bits"}
_DEVICE_KEYS = {f.name for f in fields(Device)}


def _positive(key: str, value) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TformerError(f"hardware field {key!r} must be a number, got {value!r}") from None
    if not number > 0 or number == float("inf"):
        raise TformerError(f"hardware field {key!r} must be positive and finite, got {value!r}")
    return number


def device_from_dict(spec: dict, origin: str = "user description") -> Device:
    """A Device from Device fields and/or CPU and memory fields, peaks computed by the course's formulas.

    Device fields: name, kind, peak_flops {dtype: FLOP/s}, sparse_flops, vector_flops, bandwidth (B/s),
    memory_bytes, notes; flat ``peak_<dtype>`` keys are accepted too (handy on the command line).
    CPU fields: cores, simd_bits, fma_units, clock_hz or clock_ghz, and bf16_native / fp16_native /
    int8_native (true when the CPU has those dot-product instructions). Memory fields:
    transfer_rate_mt_s, bus_width_bits (default 64), channels; or, for a GPU, gbps_per_pin and bus_bits.
    """
    if not isinstance(spec, dict):
        raise TformerError(f"{origin}: a hardware description must be a JSON object, got {type(spec).__name__}")
    spec = dict(spec)
    peak_keys = {k for k in spec if k.startswith("peak_") and k[5:] in DTYPES}
    unknown = set(spec) - _DEVICE_KEYS - _CPU_KEYS - _MEM_KEYS - peak_keys
    if unknown:
        known = sorted(_DEVICE_KEYS | _CPU_KEYS | _MEM_KEYS)
        first = sorted(unknown)[0]
        close = difflib.get_close_matches(first, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TformerError(f"{origin}: unknown hardware field {first!r}{hint}; known fields: {', '.join(known)}")

    sources: list[str] = []
    peaks: dict[str, float] = {}
    for group in ("peak_flops", "sparse_flops", "vector_flops"):
        value = spec.get(group) or {}
        if not isinstance(value, dict):
            raise TformerError(f"{origin}: {group} must be an object {{dtype: FLOP/s}}")
        bad = set(value) - set(DTYPES)
        if bad:
            raise TformerError(f"{origin}: unknown dtype {sorted(bad)[0]!r} in {group}; choose from {', '.join(DTYPES)}")
    for dtype, value in (spec.get("peak_flops") or {}).items():
        peaks[dtype] = _positive(f"peak_flops.{dtype}", value)
    for key in peak_keys:
        peaks[key[5:]] = _positive(key, spec[key])
    if peaks:
        sources.append("peaks given by the user")

    cpu_given = _CPU_KEYS & set(spec)
    if cpu_given:
        missing = [k for k in ("cores", "simd_bits", "fma_units") if k not in spec]
        if "clock_hz" not in spec and "clock_ghz" not in spec:
            missing.append("clock_ghz")
        if missing:
            raise TformerError(f"{origin}: a CPU needs cores, simd_bits, fma_units and clock_ghz; missing "
                               f"{', '.join(missing)}")
        cores = int(_positive("cores", spec["cores"]))
        simd = int(_positive("simd_bits", spec["simd_bits"]))
        units = int(_positive("fma_units", spec["fma_units"]))
        clock = _positive("clock_hz", spec["clock_hz"]) if "clock_hz" in spec else _positive("clock_ghz", spec["clock_ghz"]) * 1e9
        computed = ["fp64", "fp32"]
        for dtype in ("bf16", "fp16", "int8"):
            if spec.get(f"{dtype}_native"):
                computed.append(dtype)
        for dtype in computed:
            peaks.setdefault(dtype, cpu_peak_flops(cores, simd, units, clock, dtype))
        sources.append(f"computed from {cores} cores x {simd}-bit SIMD lanes x 2 x {units} FMA units x "
                       f"{clock / 1e9:g} GHz")

    bandwidth = spec.get("bandwidth")
    if bandwidth is not None:
        bandwidth = _positive("bandwidth", bandwidth)
        sources.append("bandwidth given by the user")
    elif "transfer_rate_mt_s" in spec:
        rate = _positive("transfer_rate_mt_s", spec["transfer_rate_mt_s"])
        width = int(_positive("bus_width_bits", spec.get("bus_width_bits", 64)))
        channels = int(_positive("channels", spec.get("channels", 1)))
        bandwidth = memory_bandwidth(rate, width, channels)
        sources.append(f"bandwidth computed from {rate:g} MT/s x {width} bit / 8 x {channels} channels")
    elif "gbps_per_pin" in spec or "bus_bits" in spec:
        if "gbps_per_pin" not in spec or "bus_bits" not in spec:
            raise TformerError(f"{origin}: GPU memory needs both gbps_per_pin and bus_bits")
        bandwidth = gpu_bandwidth(_positive("gbps_per_pin", spec["gbps_per_pin"]), int(_positive("bus_bits", spec["bus_bits"])))
        sources.append(f"bandwidth computed from {spec['gbps_per_pin']} Gbps/pin x {spec['bus_bits']} bit / 8")

    memory_bytes = spec.get("memory_bytes")
    if memory_bytes is not None:
        memory_bytes = int(_positive("memory_bytes", memory_bytes))
    kind = spec.get("kind") or ("cpu" if cpu_given else "custom")
    if kind not in ("gpu", "cpu", "tpu", "custom", "measured"):
        raise TformerError(f"{origin}: kind must be gpu, cpu, tpu, custom or measured, got {kind!r}")
    if not peaks and bandwidth is None:
        raise TformerError(f"{origin}: describes no peak and no bandwidth; give peak_flops / peak_fp32=..., "
                           "CPU fields (cores, simd_bits, fma_units, clock_ghz) or bandwidth")
    curve = spec.get("matmul_curve") or {}
    if not isinstance(curve, dict) or any(d not in DTYPES for d in curve):
        raise TformerError(f"{origin}: matmul_curve must be an object {{dtype: [[n, FLOP/s], ...]}}")
    curve = {d: [[_positive("matmul_curve n", n), _positive("matmul_curve FLOP/s", r)] for n, r in pts]
             for d, pts in curve.items()}
    stream_bw = {k: _positive(f"stream_bandwidth.{k}", v) for k, v in (spec.get("stream_bandwidth") or {}).items()}
    gemv_bw = spec.get("gemv_bandwidth") or {}
    gemv_msg = f"{origin}: gemv_bandwidth must be an object {{dtype: [[rows, k, bytes/s], ...]}}"
    if not isinstance(gemv_bw, dict) or any(d not in DTYPES for d in gemv_bw):
        raise TformerError(gemv_msg)
    try:
        gemv_bw = {d: [[_positive("gemv_bandwidth rows", r), _positive("gemv_bandwidth k", kk),
                        _positive("gemv_bandwidth bytes/s", bw)] for r, kk, bw in pts]
                   for d, pts in gemv_bw.items()}
    except (TypeError, ValueError):
        raise TformerError(gemv_msg) from None
    overhead = spec.get("call_overhead_s")
    return Device(
        name=str(spec.get("name") or "custom"), kind=kind, peak_flops=peaks,
        matmul_curve=curve, stream_bandwidth=stream_bw, gemv_bandwidth=gemv_bw,
        call_overhead_s=_positive("call_overhead_s", overhead) if overhead is not None else None,
        sparse_flops={k: _positive(k, v) for k, v in (spec.get("sparse_flops") or {}).items()},
        vector_flops={k: _positive(k, v) for k, v in (spec.get("vector_flops") or {}).items()},
        bandwidth=bandwidth, memory_bytes=memory_bytes,
        source=str(spec.get("source") or f"{origin}: " + "; ".join(sources)),
        notes=str(spec.get("notes") or ""),
    )


def _parse_pairs(text: str) -> dict:
    """'cores=8,simd_bits=256,fma_units=2,clock_ghz=3' -> dict (numbers stay strings; checked later)."""
    out: dict = {}
    for part in text.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise TformerError(f"hardware description {text!r}: expected key=value pairs separated by commas, "
                               f"got {part.strip()!r}")
        key, value = (s.strip() for s in part.split("=", 1))
        if value.lower() in ("true", "yes"):
            out[key] = True
        elif value.lower() in ("false", "no"):
            out[key] = False
        else:
            out[key] = value
    return out


def resolve_hardware(spec: str) -> Device:
    """A Device from a table name or alias, a JSON file, inline JSON, key=value pairs, or "measured".

    "measured" (or "measured:cpu", "measured:cuda:0") is this machine's saved `tformer bench` profile.
    """
    if isinstance(spec, Device):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise TformerError("empty hardware name; give a table name (e.g. h100-sxm), a JSON file, or 'measured'")
    text = spec.strip()
    if text == "measured" or text.startswith("measured:"):
        from tformer.machine.profile_store import load_measured_device

        which = text.split(":", 1)[1] if ":" in text else None
        device = load_measured_device(device=which)
        if device is None:
            raise TformerError("no measured profile saved for this machine; run `tformer bench --quick` first")
        return device
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TformerError(f"inline hardware JSON is malformed: {exc.msg} at position {exc.pos}") from None
        return device_from_dict(data, origin="inline JSON")
    if text.endswith(".json") or os.path.sep in text or os.path.isfile(text):
        if not os.path.isfile(text):
            raise TformerError(f"hardware file {text!r} not found")
        try:
            with open(text, encoding="utf-8") as fh:
                data = json.load(fh)
        except json.JSONDecodeError as exc:
            raise TformerError(f"hardware file {text!r} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
        except OSError as exc:
            raise TformerError(f"cannot read hardware file {text!r}: {exc.strerror}") from None
        return device_from_dict(data, origin=os.path.basename(text))
    if "=" in text:
        return device_from_dict(_parse_pairs(text), origin="command-line description")
    return lookup(text)
