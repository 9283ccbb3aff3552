"""The spec table, the course's peak formulas, and resolve_hardware."""

import json

import pytest

from tformer.machine import (SPEC_TABLE, Device, cpu_peak_flops, device_from_dict, gpu_bandwidth, lookup,
                                   match_gpu_name, memory_bandwidth, resolve_hardware)
from tformer.core.errors import TformerError

REQUIRED = ["a100-40gb-sxm", "a100-40gb-pcie", "a100-80gb-sxm", "a100-80gb-pcie", "h100-sxm", "h100-pcie", "h200",
            "v100-sxm2-32gb", "t4", "l4", "rtx-3060-ti", "rtx-3090", "rtx-4090", "mi300x", "tpu-v4"]


def test_cpu_peak_formula_known_chips():
    # Xeon Platinum 8380 (Ice Lake-SP): 40 cores, AVX-512 = 16 fp32 lanes, 2 FMA units, 2.3 GHz base.
    assert cpu_peak_flops(40, 512, 2, 2.3e9, "fp32") == 40 * 16 * 2 * 2 * 2.3e9 == 5.888e12
    assert cpu_peak_flops(40, 512, 2, 2.3e9, "fp64") == 40 * 8 * 2 * 2 * 2.3e9
    # EPYC 7763 (Zen 3): 64 cores, AVX2 = 8 fp32 lanes, 2 FMA pipes, 2.45 GHz base.
    assert cpu_peak_flops(64, 256, 2, 2.45e9, "fp32") == pytest.approx(5.0176e12)
    # Explicit lanes (AMX: 1024 bf16 MACs per cycle per core).
    assert cpu_peak_flops(56, None, 1, 2.0e9, lanes=1024) == 56 * 1024 * 2 * 2.0e9


def test_memory_formulas():
    assert memory_bandwidth(3200, 64, 2) == 51.2e9  # DDR4-3200 dual channel
    assert memory_bandwidth(4800, 64, 8) == 307.2e9  # DDR5-4800, 8 channels
    assert gpu_bandwidth(14, 256) == 448e9  # RTX 3060 Ti
    assert gpu_bandwidth(19.5, 384) == 936e9  # RTX 3090
    with pytest.raises(TformerError):
        memory_bandwidth(0, 64, 2)


def test_table_has_required_devices_with_sources():
    for name in REQUIRED:
        d = SPEC_TABLE[name]
        assert d.source.startswith(("spec table:", "computed from")), name
        assert d.bandwidth and d.memory_bytes and d.peak_flops, name
        for dtype, sparse in d.sparse_flops.items():  # 2:4 sparsity doubles the dense figure
            assert sparse == pytest.approx(2 * d.peak_flops[dtype], rel=0.005), (name, dtype)  # datasheets round


def test_datasheet_figures():
    h = lookup("H100 SXM")
    assert h.peak("bf16") == pytest.approx(989.4e12) and h.bandwidth == 3.35e12
    assert h.sparse_flops["bf16"] == pytest.approx(1978.9e12)
    a = lookup("a100-80gb-sxm")
    assert a.peak("bf16") == 312e12 and a.sparse_flops["bf16"] == 624e12 and a.bandwidth == 2039e9
    assert lookup("a100-40gb-sxm").bandwidth == 1555e9
    assert lookup("a100").name == "a100-40gb-sxm"
    assert lookup("rtx-3060-ti").bandwidth == 448e9
    # Unknown stays unknown: no bf16 on V100/T4, no fp32 figure for TPU v4.
    assert lookup("v100").peak("bf16") is None and lookup("t4").peak("bf16") is None
    assert lookup("tpu-v4").peak("fp32") is None
    assert lookup("h100").ridge_point("bf16") == pytest.approx(989.4e12 / 3.35e12)


def test_lookup_is_a_copy():
    d = lookup("h100-sxm")
    d.peak_flops["bf16"] = 1.0
    assert lookup("h100-sxm").peak("bf16") == pytest.approx(989.4e12)


def test_unknown_device_suggests():
    with pytest.raises(TformerError, match="h100"):
        lookup("h100-sxn")
    with pytest.raises(TformerError, match="unknown hardware"):
        resolve_hardware("quantum-9000")


@pytest.mark.parametrize("name, memory, expected", [
    ("NVIDIA H100 80GB HBM3", None, "h100-sxm"),
    ("NVIDIA H100 PCIe", None, "h100-pcie"),
    ("NVIDIA H100 NVL", None, None),
    ("NVIDIA H200", None, "h200"),
    ("NVIDIA A100-SXM4-80GB", None, "a100-80gb-sxm"),
    ("NVIDIA A100-PCIE-40GB", None, "a100-40gb-pcie"),
    ("Tesla T4", None, "t4"),
    ("NVIDIA L4", None, "l4"),
    ("NVIDIA L40S", None, None),
    ("NVIDIA GeForce RTX 3060 Ti", None, "rtx-3060-ti"),
    ("NVIDIA GeForce RTX 4090 D", None, None),
    ("Tesla V100-SXM2-16GB", None, "v100-sxm2-16gb"),
])
def test_match_gpu_name(name, memory, expected):
    assert match_gpu_name(name, memory) == expected


def test_resolve_cpu_description_inline_and_file(tmp_path):
    d = resolve_hardware("cores=8,simd_bits=256,fma_units=2,clock_ghz=3.0,transfer_rate_mt_s=3200,channels=2")
    assert d.kind == "cpu" and d.peak("fp32") == 8 * 8 * 2 * 2 * 3.0e9 and d.bandwidth == 51.2e9
    assert d.peak("bf16") is None  # not declared native: no number
    assert "computed from" in d.source
    f = tmp_path / "gpu.json"
    f.write_text(json.dumps({"name": "my-gpu", "kind": "gpu", "peak_flops": {"fp16": 1e14},
                             "gbps_per_pin": 14, "bus_bits": 256, "memory_bytes": 8 * 2**30}))
    g = resolve_hardware(str(f))
    assert g.name == "my-gpu" and g.peak("fp16") == 1e14 and g.bandwidth == 448e9
    assert resolve_hardware('{"peak_fp32": 1e12, "bandwidth": 1e11}').ridge_point("fp32") == 10.0


@pytest.mark.parametrize("spec, match", [
    ("cores=8,simd_bits=256", "missing"),
    ("cores=8,simd_bits=256,fma_units=2,clock_ghz=-3", "clock_ghz' must be a finite number in"),
    ("corez=8", "corez"),
    ("{not json", "not valid JSON"),
    pytest.param('{"a":' * 3000 + "1" + "}" * 3000, "nests 3000 levels deep", id="nested-3000"),  # not a RecursionError
    ("missing-file.json", "not found"),
    ('{"name": "x"}', "no peak"),
])
def test_resolve_bad_descriptions(spec, match):
    with pytest.raises(TformerError, match=match):
        resolve_hardware(spec)


def test_a_hardware_file_nested_too_deep_is_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    with pytest.raises(TformerError, match="hardware file .* nests 100000 levels deep"):
        resolve_hardware(str(deep))


def test_device_from_dict_rejects_unknown_dtype():
    with pytest.raises(TformerError, match="fp12"):
        device_from_dict({"peak_flops": {"fp12": 1.0}})


def test_measured_without_profile(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(TformerError, match="tformer bench --quick"):
        resolve_hardware("measured")


def test_device_is_a_device():
    assert isinstance(resolve_hardware("l4"), Device)
