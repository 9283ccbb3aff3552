"""Measured against theoretical, and why: each dtype's best matmul and the STREAM bandwidth that `tformer bench`
measured (tformer.measure.bench) beside the machine's spec-sheet peaks, with the likely reasons for the gap (a
virtual machine, too few threads to fill the memory channels, a dtype without native support, a GPU's clocks).
Kept apart from the measuring so each reads on its own."""

from __future__ import annotations

import os

from tformer.core import fmt
from tformer.machine.bench_records import Comparison, DeviceBench
from tformer.machine.peaks import cpu_peak_flops
from tformer.machine.specs import NO_NATIVE, cpu_flops_per_cycle


def compare(db: DeviceBench, specs, load_before: float | None = None) -> list[Comparison]:
    """Measured vs theoretical for every dtype measured, plus bandwidth, with the likely reasons for the gap."""
    out = []
    is_gpu = db.device.startswith("cuda")
    if is_gpu:
        idx = int(db.device.split(":")[1])
        peaks = specs.gpu_peaks.get(idx, {}) if specs else {}
    else:
        peaks = specs.cpu_peaks if specs else {}
    dtypes = list(dict.fromkeys(p.dtype for p in db.matmul))
    fp32_best = db.best_matmul("fp32")
    shared = None
    cpus = os.cpu_count() or 1
    if not is_gpu and load_before is not None and load_before >= 0.5:
        # The 1-minute load average before we started counts runnable processes that were not ours.
        shared = (f"shared machine: other processes kept ~{load_before:.1f} of {cpus} CPUs busy when the run "
                  "started; they take cycles and stall the BLAS threads (rerun on an idle machine)")
    for dtype in dtypes:
        best = db.best_matmul(dtype)
        if is_gpu:
            key = dtype
            if dtype in ("tf32", "bf16", "fp16", "int8", "fp8") or (dtype == "fp64" and "fp64_tensor" in peaks):
                key = f"{dtype}_tensor" if f"{dtype}_tensor" in peaks else dtype
            peak = peaks.get(key)
        else:
            peak = peaks.get(dtype)
        theo = peak.value if peak else None
        unit = "OPS" if dtype == "int8" else "FLOP/s"
        ratio = best.flops_per_s / theo if theo else None
        reasons = (_gpu_reasons if is_gpu else _cpu_reasons)(db, dtype, best, theo, ratio, peak, specs, fp32_best)
        if shared:
            reasons.insert(0, shared)
        per_cycle = cpu_flops_per_cycle(specs.cpu, dtype) if specs and not is_gpu and theo else None
        out.append(Comparison(quantity=f"{dtype} matmul", unit=unit, measured=best.flops_per_s, theoretical=theo,
                              ratio=ratio, theoretical_source=peak.source if peak else "unknown", reasons=reasons,
                              flops_per_cycle=per_cycle))
    bw_peak = (peaks.get("bandwidth") if is_gpu else (specs.cpu_bandwidth if specs else None))
    for kernel in ("copy", "triad"):
        point = db.best_stream(kernel)
        if not point:
            continue
        theo = bw_peak.value if bw_peak else None
        ratio = point.bytes_per_s / theo if theo else None
        reasons = []
        if theo is None:
            reasons.append("theoretical bandwidth unknown here: "
                           + (bw_peak.source if bw_peak else "no memory description"))
        if not is_gpu:
            reasons.append("STREAM counts only the named arrays; an x86 store first reads its cache line "
                           "(write-allocate), so real traffic is about 1.5x the count for copy, 1.33x for triad")
            if specs and specs.cpu.hypervisor:
                reasons.append("a virtual machine shares the memory controllers with other tenants")
            reasons.append(f"{db.threads} thread(s): one or two cores cannot keep enough misses in flight to "
                           "saturate all memory channels" if (db.threads or 0) <= 4 else
                           "threads compete for the memory channels; the best thread count may be below the core count")
        else:
            reasons.append("HBM/GDDR seldom exceeds ~90% of the datasheet figure (refresh, bank and page switches)")
        if shared:
            reasons.insert(0, shared)
        if ratio is not None and ratio > 1.0:
            reasons.insert(0, "measured above the theoretical figure: the memory description is wrong, or the "
                              "array fits in a cache")
        out.append(Comparison(quantity=f"{kernel} bandwidth", unit="B/s", measured=point.bytes_per_s,
                              theoretical=theo, ratio=ratio,
                              theoretical_source=bw_peak.source if bw_peak else "unknown", reasons=reasons))
    return out


def _curve_reasons(db, dtype, best) -> list[str]:
    reasons = []
    points = sorted((p for p in db.matmul if p.dtype == dtype), key=lambda p: p.n)
    if len(points) >= 2:
        smallest = points[0]
        frac = smallest.flops_per_s / best.flops_per_s
        if frac < 0.6:
            reasons.append(f"small sizes: n={smallest.n} reaches {frac:.0%} of the best; too little work per call "
                           "to amortise call overhead and fill every core (small matmuls are memory/latency-bound)")
        if best.n == points[-1].n and points[-1].flops_per_s > 1.05 * points[-2].flops_per_s:
            reasons.append(f"the curve still rises at the largest size tried (n={best.n}); a bigger matmul may go faster")
    spread = best.max_s / best.min_s if best.min_s > 0 else 1.0
    if spread > 1.3:
        reasons.append(f"noisy timings (slowest repetition {spread:.2f}x the fastest): a shared machine or "
                       "background load is taking cycles")
    return reasons


def _cpu_reasons(db, dtype, best, theo, ratio, peak, specs, fp32_best) -> list[str]:
    reasons = []
    cpu = specs.cpu if specs else None
    if theo is None:
        if peak is not None and NO_NATIVE in peak.source:
            msg = f"no native {dtype} arithmetic: values are converted to fp32 (or computed by a scalar fallback)"
            if fp32_best and dtype != "fp32":
                msg += f"; measured {best.flops_per_s / fp32_best.flops_per_s:.2f}x the fp32 rate"
            reasons.append(msg)
        else:
            reasons.append("theoretical peak unknown: " + (peak.source if peak else "not computed"))
        return reasons + _curve_reasons(db, dtype, best)
    if ratio > 1.02:
        reasons.append("measured above the formula: the clock used is below the real (turbo) clock, or the FMA-unit "
                       "assumption is low; the formula's inputs are in its source")
    if cpu and ratio < 0.85:
        if cpu.hypervisor:
            reasons.append("virtual machine: the 'cores' may be SMT siblings sharing one core's FMA units, and the "
                           "clock read from /proc is nominal, not the sustained clock")
        if dtype in ("fp32", "fp64") and "amd" in cpu.vendor.lower() and cpu.simd_bits == 512:
            cores = cpu.physical_cores or cpu.logical_cpus or 1
            clock = (theo / (cores * (cpu.simd_bits // 32 if dtype == "fp32" else cpu.simd_bits // 64) * 2
                             * (cpu.fma_units or 1)))
            avx2 = cpu_peak_flops(cores, 256, cpu.fma_units or 1, clock, dtype)
            reasons.append(f"PyTorch's CPU BLAS (MKL) may run 256-bit AVX2 kernels on AMD CPUs: with 256-bit lanes "
                           f"the same formula gives {fmt.in_unit(avx2, 'GFLOP/s', grouped=True)}, ratio {best.flops_per_s / avx2:.2f}")
        if dtype in ("bf16", "fp16", "int8") and ratio < 0.3:
            reasons.append(f"the CPU has native {dtype} instructions, but this PyTorch kernel does not reach them "
                           "for these shapes (conversion to fp32, or a BLAS without a kernel for this CPU)")
        reasons.append("sustained all-core clock under load (power/thermal limits) is below the clock the "
                       "formula uses")
    return reasons + _curve_reasons(db, dtype, best)


def _gpu_reasons(db, dtype, best, theo, ratio, peak, specs, fp32_best) -> list[str]:
    reasons = []
    if theo is None:
        reasons.append("theoretical peak unknown: " + (peak.source if peak else "GPU not in the spec table"))
        return reasons + _curve_reasons(db, dtype, best)
    if dtype == "fp32":
        reasons.append("fp32 here is true fp32 on the CUDA cores (TF32 disabled); see the tf32 row for tensor cores")
    if ratio is not None and ratio < 0.85:
        reasons.append("the datasheet peak is at the maximum boost clock; under load the power and thermal limits "
                       "hold the clock lower")
        if dtype in ("bf16", "fp16", "tf32", "int8"):
            reasons.append("tensor-core peaks assume every SM issues MMA instructions every cycle; real GEMM kernels "
                           "also spend time loading tiles and in the epilogue")
    return reasons + _curve_reasons(db, dtype, best)


__all__ = ["compare"]
