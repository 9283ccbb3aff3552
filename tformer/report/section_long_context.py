"""Section 9: attention at long context — each attention kind's time and peak memory against the
sequence length on this machine (log-log, measured points beside the ledger's predicted lines), the
measured selection guide beside the textbook's, and what the sparse and approximate kinds cost in
quality (the latest bench/attention_quality.py record filed for this CPU).

The sweep here is a reduced one, measured while the report runs: forward only, n up to 4096 (2048
with --quick), one repetition, under a total time budget; bench/attention_scaling.py is the full one
(forward+backward, n up to 16384). Kinds and settings: tformer.measure.attention_sweep."""

from __future__ import annotations

from pathlib import Path

import tformer
from tformer.core import fmt
from tformer.core.errors import TformerError
from tformer.core.files import read_json
from tformer.machine.profile_store import bench_results_name
from tformer.measure.attention_sweep import (
    CROSSOVER_HEADERS,
    GUIDE_HEADERS,
    POINT_HEADERS,
    QUALITY_HEADERS,
    SweepSpec,
    crossover_rows,
    guide_rows,
    point_rows,
    predict,
    quality_rows,
    selection_guide,
    settings_label,
    sweep,
)
from tformer.report import plots
from tformer.report.doc import Section

NS = (256, 512, 1024, 2048, 4096)
QUICK_NS = NS[:-1]
TOTAL_BUDGET_S = 20.0  # the whole sweep, inside the report
QUICK_BUDGET_S = 8.0
CALL_BUDGET_S = 1.0
RESULTS_DIR = Path(tformer.__file__).resolve().parents[1] / "bench" / "results"
QUALITY_COMMAND = "python bench/attention_quality.py"


def report_spec(ctx) -> SweepSpec:
    quick = ctx.options.quick
    return SweepSpec(ns=QUICK_NS if quick else NS, modes=("forward",), time_budget_s=CALL_BUDGET_S,
                     total_budget_s=QUICK_BUDGET_S if quick else TOTAL_BUDGET_S, reps=1, min_rep_s=0.01,
                     device=ctx.torch_device)


def measure(ctx, spec: SweepSpec | None = None) -> dict:
    """The reduced sweep (ctx.results["long_context"]); {"skip": why} under --no-long-context."""
    if not ctx.options.long_context:
        return {"skip": "skipped (--no-long-context)"}
    spec = spec or report_spec(ctx)
    ctx.say(f"timing the attention kinds at n = {', '.join(str(n) for n in spec.ns)} "
            f"(at most {fmt.seconds(spec.total_budget_s)})")
    results, notes = sweep(spec, ctx.measured)
    return {"spec": spec, "results": results, "notes": notes}


def bench_record(cpu, section: str, what: str, command: str, needs: str,
                 results_dir: Path | None = None) -> tuple[dict | None, str]:
    """(the latest ``section`` record a bench filed for this CPU under bench/results/, where it came from),
    or (None, one line saying why and naming ``command``). ``needs``: a key the record must hold, non-empty."""
    path = (results_dir or RESULTS_DIR) / bench_results_name(cpu.model, cpu.physical_cores or cpu.logical_cpus)
    if not path.is_file():
        return None, f"no {what} for this CPU: `{command}` produces it (filed in {path})"
    try:
        doc = read_json(path, "bench results", fix="delete it and rerun the bench")
    except TformerError as exc:
        return None, str(exc)
    record = doc.get(section) if isinstance(doc, dict) else None
    if not isinstance(record, dict) or not record.get(needs):
        return None, f"{path.name} holds no {what} yet: `{command}` produces it"
    return record, f"{path.name}, {record.get('date', 'undated')}"


# What a malformed record raises when a section reads it (a key missing, a wrong type, a zero to divide by).
MALFORMED = (KeyError, TypeError, ValueError, IndexError, AttributeError, ZeroDivisionError)


def parsed_record(sec, data: dict, record: dict | None, source: str, name: str, command: str, parse):
    """``parse(record)`` for a section's measured part; without a record, or with one ``parse`` finds
    malformed, one line in the section instead (naming ``command``) and data["measured"] = {"missing": why},
    and None is returned."""
    if record is not None:
        try:
            return parse(record)
        except MALFORMED as exc:
            source = f"the {name} record ({source}) is malformed ({type(exc).__name__}: {exc}); rerun `{command}`"
    sec.text(f"Measured: {source}.")
    data["measured"] = {"missing": source}
    return None


def quality_record(cpu, results_dir: Path | None = None) -> tuple[dict | None, str]:
    """(the latest attention_quality record filed for this CPU, where it came from), or (None, why)."""
    return bench_record(cpu, "attention_quality", "quality record", QUALITY_COMMAND, "kinds", results_dir)


def _series(results, spec: SweepSpec, device, value: str) -> dict:
    series = {}
    for r in results:
        points = r.at("forward")
        if not points:
            continue
        measured = [(n, p.measured_s if value == "time" else p.measured_peak) for n, p in points.items()]
        predicted = []
        for n in spec.ns:
            pred = predict(r.kind, n, "forward", spec, device)
            y = pred["time_s"] if value == "time" else pred["peak"]
            if y:
                predicted.append((n, y))
        series[r.kind] = {"measured": measured, "predicted": predicted}
    return series


def build(ctx) -> Section:
    sec = Section(9, "Attention at long context", "long-context")
    run = ctx.results.get("long_context") or {"skip": "not measured"}
    data: dict = {}
    if "skip" in run:
        sec.text(f"No attention sweep: {run['skip']}. `python bench/attention_scaling.py` runs the full one.")
    else:
        _sweep(sec, ctx, run, data)
    _quality(sec, ctx, data)
    ctx.data["long_context"] = data
    return sec


def _sweep(sec: Section, ctx, run: dict, data: dict) -> None:
    spec, results, notes = run["spec"], run["results"], run["notes"]
    sec.text(f"One attention call per kind and sequence length n: batch {spec.batch}, {spec.heads} heads x "
             f"{spec.head_dim}, fp32 on `{spec.device}`, causal where the kind can be, forward only, one timed "
             f"repetition (a reduced sweep, at most {fmt.seconds(spec.total_budget_s)}; `python "
             "bench/attention_scaling.py` times forward+backward up to n = 16384). Predicted: the ledger's rows for "
             "the same call on this machine's measured profile; peak memory: tensors the call allocates above what "
             "existed before it.")
    if notes:
        sec.bullets(notes)
    sec.figure("long_context_time", plots.loglog_by_kind(_series(results, spec, ctx.measured, "time"),
                                                         "seconds per call", "Attention time vs n (forward)"),
               "Seconds per attention call against n, log-log: measured (points) and predicted (dashed).")
    sec.figure("long_context_memory", plots.loglog_by_kind(_series(results, spec, ctx.measured, "memory"),
                                                           "peak attention memory (bytes)",
                                                           "Peak attention memory vs n (forward)"),
               "Peak attention memory against n, log-log: measured (points) and predicted (dashed).")
    sec.table(POINT_HEADERS, point_rows(results, "forward"), caption="Each call, measured beside the ledger",
              collapsed=True)
    sec.table(CROSSOVER_HEADERS, crossover_rows(results),
              caption="Crossover against sdpa: the smallest n from which the kind is faster at every larger n here")
    sec.table(GUIDE_HEADERS, guide_rows(results, "forward"),
              caption="The measured selection guide for this machine beside the textbook's (chapters 16 and 19)")
    data.update({"spec": {"ns": list(spec.ns), "modes": list(spec.modes), "total_budget_s": spec.total_budget_s},
                 "kinds": [r.to_dict() for r in results], "skipped": notes,
                 "guide": selection_guide(results, "forward"),
                 "settings": {r.kind: settings_label(r.settings) for r in results}})


def _quality(sec: Section, ctx, data: dict) -> None:
    record, source = quality_record(ctx.specs.cpu)
    if record is None:
        sec.text(f"Quality: {source}.")
        data["quality"] = {"missing": source}
        return
    sec.table(QUALITY_HEADERS, quality_rows(record),
              caption=f"Quality: validation loss (nats per character) of a char model trained {record['steps']} "
                      f"steps (seed {record['seed']}) with each kind, beside exact attention's ({source})")
    sec.bullets(record.get("skipped") or [])
    data["quality"] = {"source": source, "record": record}
