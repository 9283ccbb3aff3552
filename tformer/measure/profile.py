"""Profile a real model for a workload and hold the ledger's prediction to the measurement.

    from tformer.measure.profile import profile_model
    result = profile_model(config, Workload(phase="train", batch=64, seq=128))
    result.step.measured_s, result.step.predicted_s, result.utilization.mfu_measured, result.ops[0]

Three kinds of step, none of which pays for another's instrumentation:
- clean steps (no hooks) after warm-up: the step time, median and spread;
- instrumented steps (hooks at ledger-named modules, see tformer.measure.optime): per-op times;
- one counting step (FlopCounterMode's formulas, reference attention): measured FLOPs, per op and in total.
"""

from __future__ import annotations

import os
import resource
import statistics
import time
import warnings
from dataclasses import asdict, dataclass, field, replace

import torch

from tformer.core.errors import TformerError
from tformer.cost.ledger import ledger
from tformer.cost.roofline import COMPUTE_DTYPE, roofline
from tformer.machine import Device, resolve_hardware
from tformer.machine.profile_store import load_measured_device, save_profile
from tformer.measure.bench import run_bench, torch_device
from tformer.measure.optime import FlopRecorder, Hooks, Timeline, attribute, merge
from tformer.measure.probe import detect_machine
from tformer.measure.step import StepRunner, framework_overhead

ATTENTION_NOTE = ("attention's scores, softmax and context run inside one module with no hooks between them: "
                  "they are measured together as one row (named by 'scores', listing what it covers), and "
                  "predicted as the sum of the three")
GAP_NOTE = ("steps with no module of their own (activation, residual adds, loss) are timed between the hooks "
            "of the modules around them; time between two modules with no ledger step between them "
            "(reshapes, Python) is charged to the op before")


@dataclass
class OpRow:
    name: str
    phase: str
    kind: str
    covers: list[str]  # ledger ops this row measures together (the row's own name first)
    measured_s: float  # median over the instrumented steps
    measured_min_s: float
    measured_max_s: float
    measured_flops: int  # matmul FLOPs counted by FlopCounterMode's formulas (FLOPs = 2 x MACs)
    ledger_matmul_flops: int
    ledger_flops: int  # matmul + element-wise (ledger conventions)
    ledger_bytes: int
    achieved_flops_per_s: float | None  # measured FLOPs / measured time
    achieved_bytes_per_s: float | None  # ledger bytes / measured time
    predicted_s: float | str
    ratio: float | None  # predicted / measured
    bound: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class StepTime:
    measured_s: float  # median of the clean steps
    min_s: float
    max_s: float
    q1_s: float
    q3_s: float
    samples_s: list[float]
    predicted_s: float | str
    ratio: float | None  # predicted / measured
    predicted_by_phase: dict
    measured_by_phase: dict  # from the instrumented steps (hooks included)
    instrumented_s: float  # median instrumented step (clean + hook overhead)
    per_op_sum_s: float  # sum of the per-op rows (= instrumented step minus untracked time)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Utilization:
    dtype: str
    model_flops: int  # ledger matmul FLOPs of the step, recomputation excluded
    hardware_flops: int  # with recomputation (activation checkpointing); = model_flops without it
    measured_peak: float | None
    measured_peak_source: str
    theoretical_peak: float | None
    theoretical_peak_source: str
    mfu_measured: float | None  # model FLOPs / step time / measured peak
    mfu_theoretical: float | None
    hfu_measured: float | None
    hfu_theoretical: float | None
    achieved_flops_per_s: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class PeakMemory:
    method: str  # what the numbers are, stated
    peak_bytes: int | None  # peak during a step (RSS high-water mark / CUDA max allocated)
    before_bytes: int | None  # before the step (RSS / CUDA allocated)
    increase_bytes: int | None
    ledger_total_bytes: int
    ledger_rule: str

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class PhaseRow:
    """One line of the training-vs-inference comparison."""

    phase: str
    intensity: float  # ledger FLOPs / ledger bytes (FLOP/byte)
    predicted_s: float | str
    predicted_mfu: float | None  # ledger matmul FLOPs / predicted time / measured peak
    measured_mfu: float | None  # filled for phases that were run
    bound: str  # where most predicted time goes

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class ProfileResult:
    model: str
    workload: dict
    torch_device: str
    hardware: str
    hardware_source: str
    prediction_model: str
    call_overhead_s: float | None
    threads: int | None
    load_before: float | None
    steps: int
    warmup: int
    step: StepTime
    tokens: int
    tokens_per_s: float
    measured_flops: int  # FlopCounterMode total for one step (reference attention)
    ledger_matmul_flops: int
    flops_match: bool
    utilization: Utilization
    memory: PeakMemory
    ops: list[OpRow]
    phases: list[PhaseRow]
    phase_reason: str
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["step_time_s"] = {"measured": self.step.measured_s, "predicted": self.step.predicted_s,
                            "ratio": self.step.ratio}
        d["mfu"] = self.utilization.mfu_measured
        return d


# --------------------------------------------------------------------------------------------
# Pieces
# --------------------------------------------------------------------------------------------

def _summary(times: list[float]) -> dict:
    s = sorted(times)
    q1, q3 = (statistics.quantiles(s, n=4)[0], statistics.quantiles(s, n=4)[2]) if len(s) >= 4 else (s[0], s[-1])
    return {"measured_s": statistics.median(s), "min_s": s[0], "max_s": s[-1], "q1_s": q1, "q3_s": q3}


def _sync_for(device: str):
    if device.startswith("cuda"):
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _proc_status(field_name: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(field_name + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _reset_hwm() -> bool:
    """Linux: writing 5 to /proc/self/clear_refs resets the resident-set high-water mark (VmHWM)."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def measure_peak_memory(runner, lg, device: str) -> PeakMemory:
    """Peak memory of one step, by the best measure this platform has, stated in ``method``."""
    mem = lg.memory
    sync = _sync_for(device)
    if device.startswith("cuda"):
        sync()
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        runner.step()
        sync()
        peak = torch.cuda.max_memory_allocated(device)
        method = ("CUDA caching allocator: max_memory_allocated during one step (tensors only; the allocator's "
                  "cached blocks and the CUDA context are extra)")
    else:
        before = _proc_status("VmRSS")
        if before is not None and _reset_hwm():
            runner.step()
            peak = _proc_status("VmHWM")
            method = ("CPU: process resident-set high-water mark (VmHWM, reset before the step via "
                      "/proc/self/clear_refs) — includes the Python interpreter, PyTorch and the allocator's "
                      "free-but-kept pages; 'increase' is over the resident set just before the step")
        else:
            runner.step()
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            method = ("CPU: lifetime peak resident set of the process (getrusage ru_maxrss; the high-water mark "
                      "could not be reset, so it may predate this step)")
    return PeakMemory(method=method, peak_bytes=peak, before_bytes=before,
                      increase_bytes=(peak - before) if peak is not None and before is not None else None,
                      ledger_total_bytes=int(mem["total"]), ledger_rule=str(mem.get("total_rule", "")))


def _theoretical_peak(device: str, dtype: str) -> tuple[float | None, str]:
    try:
        specs = detect_machine()
    except Exception as exc:  # detection is best effort; a crash here must not lose the profile
        return None, f"unknown: detection failed ({type(exc).__name__})"
    if device.startswith("cuda"):
        idx = int(device.split(":")[1]) if ":" in device else 0
        dev = specs.gpu_device(idx)
        value = dev.peak(dtype)
        return value, (dev.source if value else f"unknown: no {dtype} peak for {dev.name}")
    peak = specs.cpu_peaks.get(dtype)
    if peak is None:
        return None, f"unknown: no {dtype} formula for this CPU"
    return peak.value, peak.source if peak.value else f"unknown: {peak.source}"


def resolve_profile_hardware(hardware, torch_device: str, progress=None) -> tuple[object, list[str]]:
    """The Device predictions use: ``hardware`` if given, else this machine's measured profile, running
    (and saving) a quick bench first when none is saved. Returns (device, notes)."""

    notes: list[str] = []
    which = "cpu" if torch_device == "cpu" else (torch_device if ":" in torch_device else "cuda:0")
    if hardware is not None and hardware != "measured":
        return (hardware if isinstance(hardware, Device) else resolve_hardware(hardware)), notes
    device = load_measured_device(device=which)
    if device is None:
        if progress:
            progress("no measured profile saved for this machine: running `tformer bench --quick` first")
        started = time.perf_counter()
        result = run_bench(quick=True, devices=which)
        path = save_profile(result)
        device = result.to_device(which)
        notes.append(f"no measured profile was saved for this machine: ran a quick bench "
                     f"({time.perf_counter() - started:.1f} s) and saved it to {path}")
    return device, notes


def _rows(runner, lg, roof, timelines, flop_timeline, hooked) -> list[OpRow]:
    pred = {}
    for i, (op, t) in enumerate(zip(lg.ops, roof.ops)):
        pred[id(op)] = t
    per_phase = {phase: lg.select(phase=phase) for phase in ("forward", "backward", "optimizer")}
    samples: dict[tuple, list[float]] = {}
    for tl in timelines:
        step: dict[tuple, float] = {}
        for seg in tl.segments:
            order = per_phase[seg.phase]
            names = hooked if seg.phase != "optimizer" else {op.name for op in order}
            for key, (seconds, _) in merge(attribute(seg, order, names)).items():
                step[(seg.phase, key)] = step.get((seg.phase, key), 0.0) + seconds
        for key, seconds in step.items():
            samples.setdefault(key, []).append(seconds)
    flops: dict[tuple, int] = {}
    for seg in flop_timeline.segments:
        order = per_phase[seg.phase]
        names = hooked if seg.phase != "optimizer" else {op.name for op in order}
        for key, (_, f) in merge(attribute(seg, order, names)).items():
            flops[(seg.phase, key)] = flops.get((seg.phase, key), 0) + f
    rows = []
    for (phase, key), times in samples.items():
        ops = [per_phase[phase][j] for j in sorted(key)]
        if phase == "backward":
            ops = list(reversed(ops))  # name the row by its first op in forward order
        measured = statistics.median(times)
        preds = [pred[id(op)] for op in ops]
        known = all(isinstance(p.time_s, float) for p in preds)
        predicted = sum(p.time_s for p in preds) if known else "unknown"
        mm = sum(op.matmul_flops for op in ops)
        counted = flops.get((phase, key), 0)
        nbytes = sum(op.bytes for op in ops)
        bounds = {}
        for p in preds:
            if known:
                bounds[p.bound] = bounds.get(p.bound, 0.0) + p.time_s
        rows.append(OpRow(
            name=ops[0].name, phase=phase, kind=ops[0].kind, covers=[op.name for op in ops],
            measured_s=measured, measured_min_s=min(times), measured_max_s=max(times), measured_flops=counted,
            ledger_matmul_flops=mm, ledger_flops=sum(op.flops for op in ops), ledger_bytes=nbytes,
            achieved_flops_per_s=counted / measured if measured > 0 and counted else None,
            achieved_bytes_per_s=nbytes / measured if measured > 0 else None,
            predicted_s=predicted, ratio=(predicted / measured) if known and measured > 0 else None,
            bound=max(bounds, key=bounds.get) if bounds else "unknown"))
    order_index = {id(op): i for i, op in enumerate(lg.ops)}
    by_name = {(op.phase, op.name): order_index[id(op)] for op in lg.ops}
    rows.sort(key=lambda r: by_name.get((r.phase, r.name), 0))
    return rows


def phase_comparison(config, workload, device, efficiency: float, measured: dict[str, float]) -> tuple[list[PhaseRow], str]:
    """Train vs prefill vs decode (encoders: train vs forward) from the ledger, with measured MFU
    where the phase was run, and one sentence on why they differ."""

    phases = config.traits.compared_phases
    dtype = COMPUTE_DTYPE[workload.dtype]
    peak = device.peak(dtype)
    rows = []
    for phase in phases:
        w = replace(workload, phase=phase, context=workload.context if phase == "decode" else None,
                    mixed_precision=False, fp32_grads=False, checkpointing=False)
        if phase == "decode" and w.context is None:
            w = replace(w, context=max(0, workload.seq - 1))
        lg = ledger(config, w)
        total_flops, total_bytes = lg.flops["total"], sum(op.bytes for op in lg.ops)
        roof = roofline(lg, device, efficiency)
        t = roof.time_s
        mm = lg.flops["matmul"]
        pm = mm / t / peak if isinstance(t, float) and t > 0 and peak else None
        share = roof.bound_share or {}
        rows.append(PhaseRow(phase=phase, intensity=total_flops / total_bytes if total_bytes else 0.0, predicted_s=t,
                             predicted_mfu=pm, measured_mfu=measured.get(phase),
                             bound=max(share, key=share.get) if share else "unknown"))
    ridge = device.ridge_point(dtype)
    hi = max(rows, key=lambda r: r.intensity)
    lo = min(rows, key=lambda r: r.intensity)
    ridge_text = f" against a ridge point of {ridge:.0f} FLOP/B" if ridge else ""
    reason = (f"{hi.phase} uses the hardware best: it reuses each weight across batch x sequence tokens "
              f"({hi.intensity:.0f} FLOP/B{ridge_text}), while {lo.phase} does ~2 FLOPs per weight per "
              f"sequence it reads ({lo.intensity:.1f} FLOP/B), so it waits on memory, not on the multipliers.")
    return rows, reason


# --------------------------------------------------------------------------------------------
# The profile
# --------------------------------------------------------------------------------------------

DENORMAL_NOTE = ("denormal floats flushed to zero (torch.set_flush_denormal(True)): Adam's second moment of tiny "
                 "gradients falls below 1e-38, where x86 arithmetic takes a ~100x slower microcode path that no "
                 "FLOP or byte count predicts (measured: 30 ms vs 0.3 ms for one 65k-parameter AdamW step)")


def profile_model(config, workload, device: str | None = None, hardware=None, steps: int = 5, warmup: int = 2,
                  efficiency: float = 1.0, op_steps: int | None = None, progress=None,
                  flush_denormals: bool = True) -> ProfileResult:
    """See ``_profile``. ``flush_denormals`` (default True): flush denormal floats to zero (left on
    afterwards: turning it off would not reach the worker threads either)."""
    # The flush-to-zero bit lives in each thread's floating-point control register; OpenMP workers copy
    # it from the thread that creates them. Set it before the first parallel op (as the CLI and
    # bench/ledger_accuracy.py do) and every worker has it; workers started earlier keep denormals on.
    flushed = flush_denormals and torch.set_flush_denormal(True)
    result = _profile(config, workload, device, hardware, steps, warmup, efficiency, op_steps, progress)
    if flushed:
        result.notes.append(DENORMAL_NOTE)
    return result


def _profile(config, workload, device: str | None = None, hardware=None, steps: int = 5, warmup: int = 2,
             efficiency: float = 1.0, op_steps: int | None = None, progress=None) -> ProfileResult:
    """Run ``config`` for ``workload`` on this machine and compare every op with the ledger's prediction.

    device: torch device ("cpu", "cuda", "cuda:0"); default the first GPU, else the CPU.
    hardware: the Device (or a name/file for resolve_hardware) predictions use; default this
    machine's measured profile (a quick bench is run and saved when none is).
    steps, warmup: clean steps timed after ``warmup`` untimed ones. op_steps: instrumented steps
    for the per-op rows (default: ``steps``, at most 5).
    """

    say = progress or (lambda _m: None)
    for label, value, low in (("steps", steps, 1), ("warmup", warmup, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise TformerError(f"{label} must be a whole number of at least {low}, got {value!r}")
    device = torch_device(device)
    lg = ledger(config, workload)
    StepRunner.check(config, workload)  # bad input fails here, before a bench or a model build
    hw, notes = resolve_profile_hardware(hardware, device, progress=say)
    if hw.kind == "measured" and device == "cpu":
        # On a CPU the framework's glue runs in line with the arithmetic, so it adds to the step: a
        # few ms per decode step of GPT-2, several times the cost of one bare op call per op.

        say("measuring the framework's per-op cost on the model's skeleton")
        per_op, how = framework_overhead(config, workload, device, hw)
        hw = replace(hw, call_overhead_s=per_op)
        notes.append(f"per-op fixed cost (Python, module calls, dispatcher, views, cache and autograd "
                     f"bookkeeping), measured now and added to every predicted op: {how}")
    roof = roofline(lg, hw, efficiency)
    sync = _sync_for(device)
    load_before = os.getloadavg()[0] if hasattr(os, "getloadavg") else None

    say(f"building {getattr(config, 'name', 'model')} on {device}")
    runner = StepRunner(config, workload, device=device)
    training = workload.phase == "train"

    # Clean steps: the step time.
    for _ in range(warmup):
        runner.step()
    sync()
    samples = []
    for i in range(steps):
        say(f"step {i + 1}/{steps}")
        sync()
        t0 = time.perf_counter()
        runner.step()
        sync()
        samples.append(time.perf_counter() - t0)

    # Instrumented steps: per-op times.
    names = {op.name for op in lg.ops}
    timelines = []
    with warnings.catch_warnings():
        # Modules fed only token ids (embeddings) have no input gradient; torch warns that their
        # backward hook fires at the output gradient instead. The attribution expects exactly that.
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        n_op = op_steps or min(steps, 5)
        inst = []
        for i in range(n_op + 1):  # the first one warms up the hooks
            tl = Timeline(sync)
            hooks = Hooks(runner.model, names, tl, backward=training)
            try:
                sync()
                t0 = time.perf_counter()
                runner.step(tl)
                sync()
                if i:
                    inst.append(time.perf_counter() - t0)
                    timelines.append(tl)
            finally:
                hooks.remove()
        # Counting step: measured FLOPs per row and in total.
        say("counting FLOPs")
        ftl = Timeline()
        hooks = Hooks(runner.model, names, ftl, backward=training)
        try:
            with FlopRecorder(ftl):
                runner.step(ftl)
        finally:
            hooks.remove()
    measured_flops = sum(f for seg in ftl.segments for f in seg.flops.values())
    mem = measure_peak_memory(runner, lg, device)

    rows = _rows(runner, lg, roof, timelines, ftl, hooks.hooked)
    summary = _summary(samples)
    measured = summary["measured_s"]
    predicted = roof.time_s
    measured_by_phase = {}
    for tl in timelines:
        for seg in tl.segments:
            measured_by_phase.setdefault(seg.phase, []).append(seg.events[-1].t - seg.events[0].t)
    step = StepTime(samples_s=samples, predicted_s=predicted,
                    ratio=predicted / measured if isinstance(predicted, float) and measured > 0 else None,
                    predicted_by_phase=roof.time_by_phase,
                    measured_by_phase={k: statistics.median(v) for k, v in measured_by_phase.items()},
                    instrumented_s=statistics.median(inst) if inst else float("nan"),
                    per_op_sum_s=sum(r.measured_s for r in rows), **summary)

    dtype = COMPUTE_DTYPE[workload.dtype]
    model_flops = sum(op.matmul_flops for op in lg.ops if op.phase != "recompute")
    hardware_flops = lg.flops["matmul"]
    mpeak = hw.peak(dtype)
    tpeak, tsource = _theoretical_peak(device, dtype)

    def frac(flops, peak):
        return flops / measured / peak if peak and measured > 0 else None

    util = Utilization(dtype=dtype, model_flops=model_flops, hardware_flops=hardware_flops, measured_peak=mpeak,
                       measured_peak_source=hw.source if mpeak else f"unknown: {hw.name} has no {dtype} peak",
                       theoretical_peak=tpeak, theoretical_peak_source=tsource,
                       mfu_measured=frac(model_flops, mpeak), mfu_theoretical=frac(model_flops, tpeak),
                       hfu_measured=frac(hardware_flops, mpeak), hfu_theoretical=frac(hardware_flops, tpeak),
                       achieved_flops_per_s=model_flops / measured if measured > 0 else 0.0)
    phases, reason = phase_comparison(config, workload, hw, efficiency, {workload.phase: util.mfu_measured})
    notes += [ATTENTION_NOTE, GAP_NOTE,
              "reference attention (explicit matmul, softmax, matmul) is run so the measured FLOPs match the "
              "ledger's; the fused SDPA kernel would be faster"]
    if training:
        notes.append("optimizer: one instance per ledger op that owns parameters, so each is timed on its own")
    if load_before is not None and load_before >= 0.5:
        notes.append(f"shared machine: 1-minute load average {load_before:.2f} on {os.cpu_count()} CPUs when the "
                     "profile started; other processes take cycles from the timed steps")
    return ProfileResult(
        model=getattr(config, "name", "custom"), workload={k: getattr(workload, k) for k in workload.__dataclass_fields__},
        torch_device=device, hardware=hw.name, hardware_source=hw.source, prediction_model=roof.model,
        call_overhead_s=hw.call_overhead_s, threads=torch.get_num_threads() if device == "cpu" else None,
        load_before=load_before, steps=steps, warmup=warmup, step=step, tokens=lg.tokens,
        tokens_per_s=lg.tokens / measured if measured > 0 else 0.0, measured_flops=measured_flops,
        ledger_matmul_flops=hardware_flops, flops_match=measured_flops == hardware_flops, utilization=util,
        memory=mem, ops=rows, phases=phases, phase_reason=reason, notes=notes)


__all__ = ["OpRow", "PeakMemory", "PhaseRow", "ProfileResult", "StepTime", "Utilization", "phase_comparison",
           "profile_model", "resolve_profile_hardware"]
