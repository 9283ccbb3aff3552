"""Build the report: measure (training run, profiles, decode curve, generation, attention maps),
then let each section read the context, then write the three files atomically.

    from tformer.report.build import ReportOptions, make_report
    result = make_report(ReportOptions(preset="char-small", out="tformer-report", quick=True))
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from tformer.core import atomic, fmt
from tformer.core.errors import TformerError
from tformer.machine import cpu_flops_per_cycle, vs_theoretical
from tformer.model import build
from tformer.report import (
    runs,
    section_adapt,
    section_appendix,
    section_attention,
    section_long_context,
    section_machine,
    section_measured,
    section_model,
    section_parallel,
    section_phases,
    section_real_model,
    section_roofline,
    section_scaling,
    section_serving,
    section_vision,
    section_why_attention,
)
from tformer.report.context import Context, ReportOptions, build_context, load_average, oversubscription_note
from tformer.report.doc import Document
from tformer.report.html import render_html
from tformer.report.markdown import render_markdown

MARKER = "report.json"  # an existing --out directory must hold one to be replaced


@dataclass
class ReportResult:
    out: Path
    files: list[Path]
    summary: list[str]
    data: dict
    wall_s: float


# ------------------------------------------------------------------------------------------------
# The output directory: checked before any work, replaced in one rename at the end
# ------------------------------------------------------------------------------------------------

def check_output_dir(out: str | Path) -> Path:
    """Fail fast, before minutes of measurement: the target must be a previous report or absent, and
    writable (core.atomic's checks: no file in the way, a folder that takes new entries, free space)."""
    final = Path(out).expanduser()
    if final.is_dir() and any(final.iterdir()) and not (final / MARKER).is_file():
        raise TformerError(f"--out {final} exists and is not a tformer report (no {MARKER}); the report replaces "
                           "its directory whole, so choose a new or empty --out")
    # Creates nothing: a report refused later (a bad --config, say) must not leave new folders behind.
    return atomic.check_output_dir(final)


def _clean(value):
    """JSON-safe: NaN/inf become null (strict JSON has no NaN), tuples lists, unknown objects text."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return str(value)


def write_report(final: Path, doc: Document, data: dict) -> list[Path]:
    """report.md, report.html, report.json and plots/*.png, built in a temporary directory beside
    ``final`` and renamed over it: a crash, a full disk or Ctrl-C leaves the old report (or none)."""

    md, page = render_markdown(doc), render_html(doc)
    payload = json.dumps(_clean(data), indent=1, allow_nan=False)
    names = ["report.md", "report.html", MARKER]
    with atomic.atomic_dir(final) as tmp:  # an OS error surfaces as a WriteError naming the file
        (tmp / "plots").mkdir()
        for f in doc.figures():
            (tmp / "plots" / f"{f.name}.png").write_bytes(f.png)
        (tmp / "report.md").write_text(md, encoding="utf-8")
        (tmp / "report.html").write_text(page, encoding="utf-8")
        (tmp / MARKER).write_text(payload, encoding="utf-8")
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; a report is meant to be shared
    return [final / n for n in names]


# ------------------------------------------------------------------------------------------------
# Measurements, then sections
# ------------------------------------------------------------------------------------------------

def measure(ctx: Context) -> None:

    ok, why = runs.can_train(ctx)
    model = tokenizer = None
    if ok:
        tr = runs.training_run(ctx)
        ctx.results["train_run"] = tr
        model, tokenizer = tr["model"], tr["tokenizer"]
    else:
        ctx.results["train_skip_reason"] = why
    ctx.results["profiles"] = runs.profiles(ctx)
    ctx.results["distributed"] = runs.parallel_run(ctx)
    if model is None:
        torch.manual_seed(ctx.options.seed)
        model = build(ctx.config).to(ctx.torch_device)
        tokenizer = runs.CharTokenizer(ctx.options.sentence, ctx.config.vocab_size)
    model.eval()
    if "decode" in ctx.workloads:
        ctx.results["decode_curve"] = runs.decode_curve(ctx)
        ctx.results["generation"] = runs.generation(ctx, model, tokenizer, trained=ok)
    ctx.say("drawing attention maps")
    ctx.results["maps"] = runs.head_maps(ctx, model, tokenizer)
    ctx.results["long_context"] = section_long_context.measure(ctx)
    ctx.results["vision"] = section_vision.measure(ctx)
    ctx.results["real_model"] = section_real_model.measure(ctx)


def machine_line(ctx: Context) -> str:
    """Measured vs theoretical peak; above 100% it says so and gives the clock the measurement implies."""
    peak, theo = ctx.measured.peak(ctx.dtype), ctx.theoretical.peak(ctx.dtype)
    per_cycle = None if ctx.is_gpu else cpu_flops_per_cycle(ctx.specs.cpu, ctx.dtype)
    return (f"machine: {ctx.dtype} matmul measured {fmt.rate(peak)} vs theoretical {fmt.rate(theo)}: "
            f"{vs_theoretical(peak, theo, per_cycle)}; bandwidth measured {fmt.bandwidth(ctx.measured.bandwidth)}")


def summary_lines(ctx: Context, data: dict, wall_s: float, load_after: float | None) -> list[str]:
    m, mach = data["model"], data["machine"]
    lt = ctx.ledgers["train"]
    w = ctx.workloads["train"]
    lines = [f"{m['name']} ({m['arch']}, {fmt.count(m['params']['total'])} parameters) on {mach['name']} "
             f"(`{ctx.torch_device}`)"]
    lines.append(f"forward {fmt.si(m['flops_forward']['total'], 'FLOP')}, training step "
                 f"{fmt.si(m['flops_train']['total'], 'FLOP')} at {w.batch} x {w.seq} tokens; training memory "
                 f"{fmt.gib(lt.memory['total'])}"
                 + (f"; KV cache {fmt.count(m['kv_cache'])} B at context {ctx.workloads['decode'].decode_context}"
                    if "decode" in ctx.workloads else ""))
    lines.append(machine_line(ctx))
    tr = ctx.results.get("train_run")
    if tr:
        lines.append(f"training: {tr['steps']} steps in {tr['wall_s']:.0f} s on {ctx.options.data}, loss "
                     f"{fmt.num(tr['first_loss'], 3)} → {fmt.num(tr['last_loss'], 3)}, "
                     f"{fmt.num(tr['tokens_per_s'], 3)} tokens/s, MFU {fmt.pct(tr['mfu_median'])}")
    else:
        lines.append(f"training: skipped ({ctx.results.get('train_skip_reason')})")
    p = ctx.results["profiles"]["train"]
    lines.append(f"train step predicted {fmt.seconds(p.step.predicted_s)} vs measured {fmt.seconds(p.step.measured_s)} "
                 f"(ratio {fmt.num(p.step.ratio, 3)}), MFU {fmt.pct(p.utilization.mfu_measured)} of the measured peak")
    verdicts = data["roofline"]["verdicts"]
    lines.append("roofline: " + ", ".join(f"{k} {v['bound']}-bound" for k, v in verdicts.items()))
    gen = ctx.results.get("generation")
    if gen:
        without = gen.get("nocache")
        lines.append(f"decoding: {fmt.num(gen['cache']['decode_tokens_per_s'], 3)} tokens/s with the KV cache"
                     + (f", {fmt.num(without['decode_tokens_per_s'], 3)} without" if without else ""))
    if ctx.results.get("busy"):
        lines.append(ctx.results["busy"])
    lines.append(f"report took {wall_s:.0f} s (load average {fmt.num(ctx.load_before, 3)} before, "
                 f"{fmt.num(load_after, 3)} after, {os.cpu_count()} logical CPUs)")
    return lines


def make_report(opts: ReportOptions, progress=None) -> ReportResult:


    final = check_output_dir(opts.out)
    # Checked before the first measurement: torch raises a RuntimeError for threads < 1, and a NaN
    # training budget never runs out.
    if opts.threads is not None and opts.threads < 1:
        raise TformerError(f"--threads must be at least 1, got {opts.threads}")
    if opts.train_seconds is not None and not (math.isfinite(opts.train_seconds) and opts.train_seconds > 0):
        raise TformerError(f"--train-seconds must be a finite positive number of seconds, got {opts.train_seconds}")
    prev_threads = torch.get_num_threads()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    try:
        return _make(opts, final, progress)
    finally:
        torch.set_num_threads(prev_threads)


def _make(opts: ReportOptions, final: Path, progress) -> ReportResult:

    ctx = build_context(opts, progress)
    busy = oversubscription_note(ctx.load_before)
    if busy:
        ctx.notes.append(busy[0])
        ctx.results["busy"] = busy[1]
    measure(ctx)
    ctx.say("writing the report")
    sections = []
    for module in (section_machine, section_model, section_roofline, section_measured, section_phases,
                   section_scaling, section_parallel, section_attention, section_long_context,
                   section_why_attention, section_serving, section_vision, section_adapt, section_real_model):
        sections.append(module.build(ctx))
        ctx.say(f"section {sections[-1].heading}")
    wall = ctx.elapsed()
    load_after = load_average()
    sections.append(section_appendix.build(ctx, wall, load_after))
    lt, lf = ctx.ledgers["train"], ctx.ledgers["forward"]
    ctx.data["totals"] = {
        "params": lf.params["total"], "params_non_embedding": lf.params["non_embedding"],
        "flops_forward": lf.flops["total"], "flops_forward_matmul": lf.flops["matmul"],
        "flops_train": lt.flops["total"], "flops_train_matmul": lt.flops["matmul"],
        "memory_train": lt.memory["total"],
        "kv_cache": ctx.ledgers["decode"].memory["kv_cache"] if "decode" in ctx.ledgers else 0,
    }
    ctx.data["run"] = {"wall_s": wall, "load_before": ctx.load_before, "load_after": load_after,
                       "logical_cpus": os.cpu_count(), "quick": opts.quick, "trained": "train_run" in ctx.results,
                       "bench_note": ctx.bench_note}
    summary = summary_lines(ctx, ctx.data, wall, load_after)
    ctx.data["summary"] = summary
    title = f"tformer report: {getattr(ctx.config, 'name', 'custom')} on {ctx.data['machine']['name']}"
    doc = Document(title=title, summary=summary, sections=sections)
    files = write_report(final, doc, ctx.data)
    return ReportResult(out=final, files=files, summary=summary, data=ctx.data, wall_s=wall)


__all__ = ["ReportOptions", "ReportResult", "check_output_dir", "make_report", "write_report"]
