"""A GPU's record and its theoretical peaks, and what the driver says about the GPUs without torch.

The GPUs PyTorch sees are probed by tformer.measure.probe (torch.cuda), which fills in NVML's
clocks and bus width through ``add_nvml`` here. Guarded like tformer.machine.specs: a missing
driver, library or query leaves a field None and never raises. Peaks come from the spec table when
the GPU is in it, else from the course's formulas (SMs x lanes x 2 x clock; Gbps per pin x bus
width / 8), else "unknown".
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass

from tformer.core import fmt
from tformer.machine.device import DTYPES
from tformer.machine.peaks import Peak, gpu_bandwidth
from tformer.machine.spec_table import lookup


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


def driver_gpu_names(timeout: float = 3.0) -> list[str]:
    """The names of the GPUs this process may use, from the driver without torch: NVML (pynvml) when
    installed, else nvidia-smi; [] when neither answers. Only the measured-profile key needs them
    (tformer.machine.profile_store), so `tformer count --hardware measured` stays torch-free; the
    driver gives the same name torch.cuda reports. CUDA_VISIBLE_DEVICES as a list of indices is honoured.
    """
    names = _nvml_names()
    if names is None:
        names = _smi_names(timeout)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return names
    picks = [v.strip() for v in visible.split(",") if v.strip()]
    if not all(v.lstrip("-").isdigit() for v in picks):
        return names  # UUIDs or MIG names: cannot be mapped to indices here, keep every GPU
    out = []
    for v in picks:
        if int(v) < 0 or int(v) >= len(names):
            break  # CUDA stops at the first invalid index
        out.append(names[int(v)])
    return out


def _nvml_names() -> list[str] | None:
    try:
        import pynvml  # optional, deferred: most machines have no NVIDIA driver
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001
        return None
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
            out.append(name.decode() if isinstance(name, bytes) else name)
        return out
    except Exception:  # noqa: BLE001
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass


def _smi_names(timeout: float) -> list[str]:
    if not shutil.which("nvidia-smi"):
        return []
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []


def add_nvml(gpus: list[GPUInfo]) -> None:
    """Clocks and memory bus width from NVML, when pynvml is installed and the driver answers."""
    if not gpus:
        return
    try:
        import pynvml  # optional, deferred: most machines have no NVIDIA driver
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
                               f"{fmt.hz(g.sm_clock_max_hz)} max SM clock")
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


__all__ = ["GPUInfo", "add_nvml", "driver_gpu_names", "gpu_peaks"]
