"""The measured profile of this machine, saved in the user's cache and reused as ``--hardware measured``.

One JSON file per machine: $XDG_CACHE_HOME/tformer/profiles/<key>.json (default ~/.cache/tformer).
The key comes from the CPU model, its core count and the GPU names, never the hostname, so the same
machine (or an identical one) finds its profile and a different one does not borrow it. Files are
written to a temporary name in the same directory and renamed: a reader sees the old profile or the
new one, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re

from tformer.core.atomic import atomic_write_text
from tformer.core.errors import TformerError
from tformer.core.files import read_json
from tformer.machine.bench_records import BenchResult
from tformer.machine.gpu_specs import driver_gpu_names
from tformer.machine.specs import cpu_info

PROFILE_VERSION = 1


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tformer")


def machine_key(specs=None) -> str:
    """'amd-epyc-2c-3f9a1c2b': readable prefix plus a hash of everything that identifies the hardware.

    ``specs``: a MachineSpecs (GPUs as PyTorch names them); by default the CPU is detected here and the
    GPUs are named by the driver, without torch (gpu_specs.driver_gpu_names: the same names).
    """
    if specs is None:
        cpu, gpu_names = cpu_info(), driver_gpu_names()
    else:
        cpu, gpu_names = specs.cpu, [g.name for g in specs.gpus]
    cores = cpu.physical_cores or cpu.logical_cpus or 0
    gpus = sorted(gpu_names)
    ident = "|".join([cpu.model, cpu.vendor, str(cores), str(cpu.logical_cpus), *gpus])
    digest = hashlib.sha256(ident.encode()).hexdigest()[:10]
    slug = re.sub(r"[^a-z0-9]+", "-", cpu.model.lower()).strip("-")[:40] or "cpu"
    parts = [slug, f"{cores}c"] + ([re.sub(r"[^a-z0-9]+", "-", gpus[0].lower()).strip("-")[:30]] if gpus else [])
    return "-".join(parts + [digest])


def bench_results_name(cpu_model: str, cores: int | None) -> str:
    """The file bench/ scripts file this CPU's figures under ('intel-r-xeon-r-processor-2c.json'): one per
    CPU model and core count, read back by the report."""
    slug = re.sub(r"[^a-z0-9]+", "-", cpu_model.lower()).strip("-")[:60] or "cpu"
    return f"{slug}-{cores}c.json"


def profile_path(key: str | None = None) -> str:
    return os.path.join(cache_dir(), "profiles", f"{key or machine_key()}.json")


def save_profile(result, key: str | None = None) -> str:
    """Write a BenchResult (or its dict) atomically; returns the path."""
    data = result.to_dict() if hasattr(result, "to_dict") else dict(result)
    key = key or data.get("machine_key") or machine_key()
    path = profile_path(key)
    atomic_write_text(path, json.dumps({"version": PROFILE_VERSION, "result": data}, indent=1))
    return path


def load_profile(key: str | None = None):
    """The saved BenchResult for this machine (or ``key``), or None when there is none."""
    path = profile_path(key)
    if not os.path.isfile(path):
        return None
    fix = "rerun `tformer bench --quick` to replace it"
    data = read_json(path, "the saved profile", max_bytes=16 << 20, fix=fix)
    try:
        if data.get("version") != PROFILE_VERSION:
            raise ValueError(f"version {data.get('version')!r}")
        return BenchResult.from_dict(data["result"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise TformerError(f"the saved profile {path} is unreadable ({type(exc).__name__}: {exc}); "
                           f"{fix}") from None


def load_measured_device(key: str | None = None, device: str | None = None):
    """This machine's measured roofs as a Device (kind "measured"), or None when nothing is saved.

    ``device``: "cpu", "cuda:0"...; by default the first GPU, else the CPU.
    """
    result = load_profile(key)
    if result is None:
        return None
    return result.to_device(device)


__all__ = ["bench_results_name", "cache_dir", "load_measured_device", "load_profile", "machine_key", "profile_path", "save_profile"]
