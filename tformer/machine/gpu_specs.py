"""The GPUs of this machine (through torch.cuda and, when installed, NVML) and their theoretical peaks.

Guarded like the rest of tformer.machine.specs: a missing driver, library or query leaves a field
None and never raises. Peaks come from the ledger's spec table when the GPU is in it, else from
the course's formulas (SMs x lanes x 2 x clock; Gbps per pin x bus width / 8), else "unknown".
"""

from __future__ import annotations

from dataclasses import dataclass

from tformer.machine.device import DTYPES, gpu_bandwidth, lookup, match_gpu_name
from tformer.machine.specs import Peak


@dataclass
class GPUInfo:
    index: int
    name: str
    memory_bytes: int | None = None
    sm_count: int | None = None
    compute_capability: str | None = None
    sm_clock_max_hz: float | None = None
    mem_clock_max_hz: float | None = None
    mem_bus_bits: int | None = None
    driver: str | None = None
    table_entry: str | None = None
    source: str = "torch.cuda"




# FP32 lanes per SM by compute capability (CUDA programming guide, arithmetic instruction throughput).
_FP32_PER_SM = {(6, 0): 64, (6, 1): 128, (7, 0): 64, (7, 5): 64, (8, 0): 64, (8, 6): 128, (8, 7): 128,
                (8, 9): 128, (9, 0): 128, (10, 0): 128, (12, 0): 128}


def detect_gpus() -> list[GPUInfo]:
    """Every CUDA GPU torch sees, with NVML's clocks and bus width when available; [] on any failure."""
    out: list[GPUInfo] = []
    try:
        import torch

        if not torch.cuda.is_available():
            return out
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            clock_khz = getattr(p, "clock_rate", None)
            out.append(GPUInfo(index=i, name=p.name, memory_bytes=int(p.total_memory),
                               sm_count=getattr(p, "multi_processor_count", None),
                               compute_capability=f"{p.major}.{p.minor}",
                               sm_clock_max_hz=clock_khz * 1e3 if clock_khz else None,
                               driver=getattr(torch.version, "cuda", None) and f"CUDA {torch.version.cuda}"))
    except Exception:  # noqa: BLE001 - a broken driver must not break `tformer specs`
        return out
    _add_nvml(out)
    for g in out:
        g.table_entry = match_gpu_name(g.name, g.memory_bytes)
    return out


def _add_nvml(gpus: list[GPUInfo]) -> None:
    """Clocks and memory bus width from NVML, when pynvml is installed and the driver answers."""
    if not gpus:
        return
    try:
        import pynvml
    except ImportError:
        return
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001
        return
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        driver = driver.decode() if isinstance(driver, bytes) else driver
        for g in gpus:
            try:
                h = pynvml.nvmlDeviceGetHandleByIndex(g.index)
                g.sm_clock_max_hz = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM) * 1e6
                g.mem_clock_max_hz = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM) * 1e6
                g.mem_bus_bits = pynvml.nvmlDeviceGetMemoryBusWidth(h)
                g.driver = f"driver {driver}"
                g.source = "torch.cuda + NVML"
            except Exception:  # noqa: BLE001 - old drivers lack some queries
                continue
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def gpu_peaks(g: GPUInfo) -> dict[str, Peak]:
    out: dict[str, Peak] = {}
    entry = lookup(g.table_entry) if g.table_entry else None
    cc = tuple(int(x) for x in g.compute_capability.split(".")) if g.compute_capability else None
    lanes = _FP32_PER_SM.get(cc) if cc else None
    if entry:
        src = entry.source
        for dtype in DTYPES:
            unit = "OPS" if dtype == "int8" else "FLOP/s"
            if dtype in entry.vector_flops:
                out[dtype] = Peak(entry.vector_flops[dtype], unit, src)
            if dtype in entry.peak_flops and entry.peak_flops[dtype] != entry.vector_flops.get(dtype):
                out[f"{dtype}_tensor"] = Peak(entry.peak_flops[dtype], unit, src)
            if dtype in entry.sparse_flops:
                out[f"{dtype}_tensor_sparse"] = Peak(entry.sparse_flops[dtype], unit, src)
        out["bandwidth"] = Peak(entry.bandwidth, "B/s", src)
    else:
        for dtype in ("fp16_tensor", "bf16_tensor", "int8_tensor"):
            out[dtype] = Peak(None, "FLOP/s", f"unknown: {g.name!r} is not in the spec table")
    if "fp32" not in out:
        if lanes and g.sm_count and g.sm_clock_max_hz:
            out["fp32"] = Peak(g.sm_count * lanes * 2 * g.sm_clock_max_hz, "FLOP/s",
                               f"computed from {g.sm_count} SMs x {lanes} FP32 lanes x 2 x "
                               f"{g.sm_clock_max_hz / 1e9:.3f} GHz max SM clock")
        else:
            out["fp32"] = Peak(None, "FLOP/s", "unknown: SM count, lanes per SM or clock not known")
    if "bandwidth" not in out or out["bandwidth"].value is None:
        if g.mem_clock_max_hz and g.mem_bus_bits:
            gbps = 2 * g.mem_clock_max_hz / 1e9  # NVML reports the memory clock; data moves on both edges
            out["bandwidth"] = Peak(gpu_bandwidth(gbps, g.mem_bus_bits), "B/s",
                                    f"computed from {gbps:.2f} Gbps/pin x {g.mem_bus_bits} bit / 8 (NVML)")
        else:
            out["bandwidth"] = Peak(None, "B/s", "unknown: not in the spec table and NVML unavailable")
    return out


__all__ = ["GPUInfo", "detect_gpus", "gpu_peaks"]
