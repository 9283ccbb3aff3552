"""What PyTorch sees of this machine: its build and threads, and the CUDA GPUs (with NVML's clocks).

tformer.machine detects everything else without torch; ``detect_machine`` hands it these probes and
returns the whole MachineSpecs that `tformer specs`, `tformer bench`, the report and the
measured-profile key use. Every probe is guarded: a broken driver or build leaves fields out, never raises.
"""

from __future__ import annotations

import torch

from tformer.machine import specs as machine_specs
from tformer.machine.gpu_specs import GPUInfo, add_nvml


def torch_info() -> dict:
    """PyTorch's version, thread counts, CPU capability, oneDNN and CUDA versions ({} on any failure)."""
    info: dict = {}
    try:
        info["version"] = torch.__version__
        info["threads"] = torch.get_num_threads()
        info["interop_threads"] = torch.get_num_interop_threads()
        try:
            info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        except Exception:  # noqa: BLE001
            info["cpu_capability"] = None
        info["mkldnn"] = bool(torch.backends.mkldnn.is_available())
        info["cuda"] = getattr(torch.version, "cuda", None)
    except Exception:  # noqa: BLE001
        pass
    return info


def detect_gpus() -> list[GPUInfo]:
    """Every CUDA GPU torch sees, with NVML's clocks and bus width when available; [] on any failure."""
    out: list[GPUInfo] = []
    try:
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
    add_nvml(out)
    return out


def detect_machine(**overrides) -> machine_specs.MachineSpecs:
    """tformer.machine.specs.detect with the GPUs and the PyTorch build probed here; ``overrides`` are
    detect's formula inputs (clock_ghz, fma_units, simd_bits, memory_mt_s, memory_channels, memory_bus_bits)."""
    return machine_specs.detect(gpus=detect_gpus(), torch_info=torch_info(), **overrides)


__all__ = ["detect_gpus", "detect_machine", "torch_info"]
