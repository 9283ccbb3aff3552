"""Section 1: the machine — what it is, what it should do (formulas), what it does (bench), and why
the two differ."""

from __future__ import annotations

from tformer.core import fmt
from tformer.machine import vs_theoretical
from tformer.report import gpu_records, plots
from tformer.report.doc import Section

CPU_FORMULA = "peak FLOP/s = cores x SIMD lanes (register bits / dtype bits) x 2 (an FMA is a multiply and an add) x FMA units x clock"
BW_FORMULA = "bandwidth = transfer rate (MT/s) x bus width (bits) / 8 x channels"


def _specs_rows(ctx) -> list[list[str]]:
    s = ctx.specs
    cpu, mem = s.cpu, s.memory
    rows = [
        ["CPU", f"{cpu.model} ({cpu.vendor}, {cpu.arch})"],
        ["cores / logical CPUs / usable by this process", f"{cpu.physical_cores} / {cpu.logical_cpus} / {cpu.usable_cpus}"],
        ["SIMD width, FMA units", f"{cpu.simd_bits} bits, {cpu.fma_units} ({cpu.vector_source})"],
        ["clock", f"{fmt.si(cpu.max_clock_hz or cpu.base_clock_hz or cpu.current_clock_hz, 'Hz')} ({cpu.clock_source})"],
        ["instruction sets", ", ".join(k for k, v in cpu.flags.items() if v) or "unknown"],
        ["caches", ", ".join(f"L{c.level} {c.type} {fmt.gib(c.size_bytes)}" for c in cpu.caches) or "unknown"],
        ["memory", f"{fmt.nbytes(mem.total_bytes)}; type {mem.type}, "
                   f"{fmt.num(mem.speed_mt_s)} MT/s, {mem.channels or 'unknown'} channels ({mem.source})"],
        ["virtual machine", "yes (hypervisor flag)" if cpu.hypervisor else "no"],
    ]
    for g in s.gpus:
        rows.append([f"GPU {g.index}", f"{g.name}, {fmt.nbytes(g.memory_bytes)}, {g.sm_count} SMs, compute capability "
                                       f"{g.compute_capability}, SM clock {fmt.si(g.sm_clock_max_hz, 'Hz')}"])
    if not s.gpus:
        rows.append(["GPU", "none found (torch.cuda not available)"])
    rows.append(["PyTorch", ", ".join(f"{k} {v}" for k, v in s.torch.items() if not isinstance(v, (dict, list)))])
    rows.append(["OS", s.os])
    return rows


def _peaks(ctx) -> dict:
    """Theoretical peaks of the analysed device: {dtype: Peak}, plus 'bandwidth'."""
    s = ctx.specs
    if ctx.is_gpu:
        return dict(s.gpu_peaks.get(int(ctx.torch_device.split(":")[1]), {}))
    return {**s.cpu_peaks, "bandwidth": s.cpu_bandwidth}


def build(ctx) -> Section:
    sec = Section(1, "The machine", "machine")
    dev = ctx.bench.device(ctx.torch_device)
    sec.text(f"The report analyses **{dev.name}** (`{ctx.torch_device}`), the device PyTorch computes on here"
             + ("; a GPU was found, so the GPU is analysed." if ctx.is_gpu else "; no CUDA GPU was found."))
    sec.table(["what", "detected"], _specs_rows(ctx), caption="Specifications (each probe guarded: 'unknown' when "
              "the system does not say)")

    peaks = _peaks(ctx)
    rows = [[k, fmt.si(p.value, p.unit) if p.value else "unknown", p.source] for k, p in peaks.items()]
    sec.text(f"Theoretical peaks follow the course's formulas: `{CPU_FORMULA}`; `{BW_FORMULA}`"
             + (" (GPUs: the spec table, or SMs x cores per SM x 2 x clock)." if ctx.is_gpu else "."))
    sec.table(["quantity", "theoretical peak", "source / formula with the numbers used"], rows,
              caption="Theoretical peaks per dtype (FLOPs = 2 x multiply-accumulates; int8 in operations/s)")
    if ctx.specs.notes:
        sec.bullets(ctx.specs.notes)

    # Measured: the curve, not one point.
    curves: dict[str, list] = {}
    for p in dev.matmul:
        curves.setdefault(p.dtype, []).append((p.n, p.flops_per_s))
    theo = {k: p.value for k, p in peaks.items() if k != "bandwidth" and getattr(p, "value", None)}
    if curves:
        sec.figure("matmul_curve", plots.matmul_curve(curves, theo, dev.name),
                   f"Measured matmul FLOP/s against size on {dev.name} (median of repetitions per point; dashed: "
                   "theoretical peak). Small matmuls cannot amortise call overhead or fill every core.")
    best_rows = []
    for dtype in sorted(curves):
        b = dev.best_matmul(dtype)
        best_rows.append([dtype, str(b.n), fmt.rate(b.flops_per_s), f"{fmt.rate(b.flops_per_s_best)}",
                          f"{fmt.seconds(b.min_s)} .. {fmt.seconds(b.max_s)}"])
    if best_rows:
        sec.table(["dtype", "best size n", "FLOP/s (median)", "fastest repetition", "per-call time spread"], best_rows,
                  caption="Measured matmul peak per dtype: the best median over the size sweep")
    stream_rows = [[p.kernel, fmt.nbytes(p.bytes), fmt.bandwidth(p.bytes_per_s), fmt.bandwidth(p.bytes_per_s_best)]
                   for p in dev.stream]
    if stream_rows:
        sec.table(["STREAM kernel", "bytes per call", "bandwidth (median)", "fastest repetition"], stream_rows,
                  caption="Measured memory bandwidth (STREAM convention: copy/scale count 2 arrays, add/triad 3)")
    comp_rows, by_reason = [], {}
    for c in dev.comparisons:
        comp_rows.append([c.quantity, fmt.si(c.measured, c.unit) if c.measured else "unknown",
                          fmt.si(c.theoretical, c.unit) if c.theoretical else "unknown",
                          vs_theoretical(c.measured, c.theoretical, c.flops_per_cycle)])
        for r in c.reasons:  # one line per reason, naming every quantity it explains
            by_reason.setdefault(r, []).append(c.quantity)
    reasons = [f"{r} ({', '.join(q)})" for r, q in by_reason.items()]
    if comp_rows:
        sec.table(["quantity", "measured", "theoretical", "measured / theoretical"], comp_rows,
                  caption="Measured vs theoretical")
        sec.text("Why the measured figures fall short of the formulas (from the bench's own analysis):")
        sec.bullets(reasons)
    if dev.skipped:
        sec.bullets([f"not measured: {s}" for s in dev.skipped])
    load = f"{ctx.bench.load_before:.2f}" if ctx.bench.load_before is not None else "unknown"
    sec.text(f"{ctx.bench_note}. Bench took {ctx.bench.wall_s:.1f} s with a 1-minute load average of {load} "
             f"on {ctx.bench.logical_cpus} logical CPUs. Rerun `tformer bench` (full sweep) on an idle machine for "
             "tighter figures; the report reads whatever profile is saved.")
    sec.bullets(ctx.bench.conventions)

    ctx.data["machine"] = {
        "device": ctx.torch_device, "name": dev.name, "theoretical": {k: getattr(p, "value", None) for k, p in peaks.items()},
        "theoretical_sources": {k: getattr(p, "source", "") for k, p in peaks.items()},
        "measured_peak_flops": dict(ctx.measured.peak_flops), "measured_bandwidth": ctx.measured.bandwidth,
        "stream_bandwidth": dict(ctx.measured.stream_bandwidth), "bench_created": ctx.bench.created,
        "bench_quick": ctx.bench.quick, "call_overhead_s": ctx.measured.call_overhead_s,
        "memory_bytes": ctx.measured.memory_bytes or ctx.specs.memory.total_bytes,
    }
    gpu_records.add_to(sec, ctx.data["machine"])
    return sec
