"""Detection never crashes, and the CPU peaks follow from what was detected."""

import builtins
import json
import subprocess
import sys

import torch

from tformer.machine import specs as specs_mod
from tformer.machine.specs import NO_NATIVE, CPUInfo, cpu_peaks, detect, vector_units
from tformer.measure.probe import detect_machine


def test_detect_runs_and_is_serialisable():
    s = detect()
    json.dumps(s.to_dict())
    assert s.cpu.logical_cpus and s.cpu.logical_cpus >= 1
    for dtype in ("fp32", "bf16", "fp16", "int8"):
        peak = s.cpu_peaks[dtype]
        assert (peak.value is None) == (peak.source.startswith(("unknown", NO_NATIVE)))
        assert peak.source


def test_detect_without_gpu_and_without_nvml(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    real_import = builtins.__import__

    def no_nvml(name, *args, **kwargs):
        if name == "pynvml":
            raise ImportError("no pynvml")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_nvml)
    s = detect_machine()
    assert s.gpus == [] and s.gpu_peaks == {}


def test_detect_survives_missing_files_and_tools(monkeypatch):
    # A container or macOS: no /proc, no /sys, no lscpu, no dmidecode.
    monkeypatch.setattr(specs_mod, "_read", lambda path: None)
    monkeypatch.setattr(specs_mod, "_run", lambda cmd, timeout=3.0: None)
    s = detect()
    assert s.memory.type == "unknown"
    assert s.cpu_bandwidth.value is None and "unknown" in s.cpu_bandwidth.source


def test_detect_with_broken_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)

    def boom(i):
        raise RuntimeError("driver gone")

    monkeypatch.setattr(torch.cuda, "get_device_properties", boom)
    assert detect_machine().gpus == []


def _cpu(**kw):
    base = dict(model="Intel(R) Xeon(R) Platinum 8380 CPU @ 2.30GHz", vendor="GenuineIntel", arch="x86_64",
                physical_cores=40, logical_cpus=80, usable_cpus=80,
                flags={"avx": True, "avx2": True, "fma": True, "avx512f": True, "avx512_vnni": True})
    base.update(kw)
    cpu = CPUInfo(**base)
    cpu.simd_bits, cpu.fma_units, cpu.vector_source = vector_units(cpu)
    return cpu


def test_xeon_peak_from_detected_values():
    cpu = _cpu(base_clock_hz=2.3e9)
    peaks = cpu_peaks(cpu)
    assert (cpu.simd_bits, cpu.fma_units) == (512, 2)
    assert peaks["fp32"].value == 40 * 16 * 2 * 2 * 2.3e9
    assert peaks["fp64"].value == 40 * 8 * 2 * 2 * 2.3e9
    assert "computed from 40 cores x 16 fp32 lanes" in peaks["fp32"].source
    # Ice Lake has no avx512_bf16: bf16 is emulated, and says so instead of giving a number.
    assert peaks["bf16"].value is None and peaks["bf16"].source.startswith(NO_NATIVE)
    assert peaks["int8"].value == 40 * 64 * 2 * 2 * 2.3e9


def test_native_bf16_and_amx():
    zen5 = _cpu(model="AMD EPYC 9555", vendor="AuthenticAMD", family=26, physical_cores=64, usable_cpus=128,
                flags={"avx2": True, "fma": True, "avx512f": True, "avx512_bf16": True})
    assert (zen5.simd_bits, zen5.fma_units) == (512, 2)
    assert cpu_peaks(zen5, 3.2e9)["bf16"].value == 64 * 32 * 2 * 2 * 3.2e9
    spr = _cpu(model="Intel(R) Xeon(R) Platinum 8480+", physical_cores=56, usable_cpus=112,
               flags={"avx512f": True, "fma": True, "amx_bf16": True, "amx_tile": True})
    assert cpu_peaks(spr, 2.0e9)["bf16"].value == 56 * 1024 * 2 * 2.0e9
    zen2 = _cpu(model="AMD EPYC 7742", vendor="AuthenticAMD", family=23, model_id=0x31,
                flags={"avx2": True, "fma": True, "avx": True})
    assert (zen2.simd_bits, zen2.fma_units) == (256, 2)


def test_unknown_clock_gives_unknown_peaks():
    cpu = _cpu()
    assert all(p.value is None for p in cpu_peaks(cpu).values())


def test_memory_override_gives_bandwidth():
    s = detect(memory_mt_s=3200, memory_channels=2)
    assert s.cpu_bandwidth.value == 51.2e9


def test_cli_specs(capsys):
    from tformer.cli import main

    assert main(["specs", "--json"]) == 0
    assert "cpu_peaks" in json.loads(capsys.readouterr().out)
    assert main(["specs"]) == 0
    assert "theoretical peaks" in capsys.readouterr().out


def test_cli_specs_bad_flag_is_one_line():
    # A real process: the exit status and the absence of a traceback are what the user sees.
    bad = subprocess.run([sys.executable, "-m", "tformer", "specs", "--clock-ghz", "0"], capture_output=True,
                         text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "Traceback" not in bad.stderr
    assert "--clock-ghz" in bad.stderr
