"""The spec table: each device's datasheet roofs with their source, looked up by name or alias, and
the driver's GPU names mapped onto entries.

Conventions: FLOP/s count 2 per multiply-accumulate; int8 figures are operations per second
(OPS), stored under the "int8" key; bandwidth is bytes/s (1 GB/s = 1e9 B/s); memory sizes of
HBM/GDDR parts are the datasheet's "GB", which for these parts is GiB (2**30 bytes). Dense and
2:4-sparse throughput are kept in separate dicts. A number the source does not give stays None:
never another device's number.
"""

from __future__ import annotations

import copy
import difflib

from tformer.core.errors import TformerError
from tformer.machine.device import Device, GiB, T
from tformer.machine.peaks import gpu_bandwidth


def _dev(name, kind, dense, sparse=None, vector=None, bandwidth=None, memory_gib=None, source="", notes="",
         aliases=()):
    return Device.from_roofs(name, kind, {k: v * T for k, v in dense.items()},
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

ALIASES = {alias: d.name for d in SPEC_TABLE.values() for alias in d.aliases}


def slug(name: str) -> str:
    s = name.strip().lower().replace("_", "-").replace(" ", "-")
    while "--" in s:
        s = s.replace("--", "-")
    return s


def device_names() -> list[str]:
    return sorted(SPEC_TABLE)


def lookup(name: str) -> Device:
    """The table entry for ``name`` (a slug or alias, case and spaces ignored), as a fresh copy."""
    key = slug(name)
    key = ALIASES.get(key, key)
    if key in SPEC_TABLE:
        return copy.deepcopy(SPEC_TABLE[key])
    known = sorted(set(SPEC_TABLE) | set(ALIASES))
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
    s = slug(name).replace("nvidia-", "").replace("geforce-", "").replace("tesla-", "")
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


__all__ = ["ALIASES", "SPEC_TABLE", "device_names", "lookup", "match_gpu_name", "slug"]
