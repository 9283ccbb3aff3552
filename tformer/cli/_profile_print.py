"""Human output of `tformer profile` (not a command itself)."""

from __future__ import annotations

from tformer.cli._cost_common import console
from tformer.core import fmt


def _ratio(x) -> str:
    return f"{x:.2f}" if isinstance(x, (int, float)) else "-"


def print_result(r, ops: bool = False, comparison: bool = True) -> None:
    # deferred: rich loads only when something is printed with it
    from rich.table import Table

    con = console()
    w = r.workload
    what = f"{w['phase']}, batch {w['batch']}, seq {w['seq']}" + (
        f", context {w['context'] if w['context'] is not None else w['seq'] - 1}" if w["phase"] == "decode" else "")
    con.print(f"[bold]{r.model}[/bold] — {what}, {w['dtype']} on {r.torch_device}"
              + (f" ({r.threads} threads)" if r.threads else ""))
    con.print(f"prediction: {r.hardware} — {r.prediction_model}")
    con.print(f"  source: {r.hardware_source}")
    if ops:
        t = Table(title="per op (measured: median of instrumented steps; predicted: the ledger on this machine's roofs; "
                        "ratio = predicted / measured; FLOPs = 2 x MACs, counted by FlopCounterMode's formulas)")
        for col in ("phase", "op", "measured", "predicted", "ratio", "bound", "FLOPs (measured)", "achieved FLOP/s",
                    "bytes/s (ledger bytes)"):
            t.add_column(col, justify="left" if col in ("phase", "op", "bound") else "right")
        for row in r.ops:
            name = row.name + (f" (+{', '.join(c.rsplit('.', 1)[-1] for c in row.covers[1:])})" if len(row.covers) > 1 else "")
            t.add_row(row.phase, name, fmt.duration(row.measured_s), fmt.duration(row.predicted_s), _ratio(row.ratio), row.bound,
                      f"{row.measured_flops:,}" if row.measured_flops else "0",
                      fmt.rate(row.achieved_flops_per_s, "FLOP/s") if row.achieved_flops_per_s else "-",
                      fmt.rate(row.achieved_bytes_per_s, "B/s") if row.achieved_bytes_per_s else "-")
        con.print(t)
        kinds: dict[tuple, list] = {}
        for row in r.ops:
            acc = kinds.setdefault((row.phase, row.kind), [0.0, 0.0])
            acc[0] += row.measured_s
            acc[1] += row.predicted_s if isinstance(row.predicted_s, float) else 0.0
        k = Table(title="by kind")
        for col in ("phase", "kind", "measured", "predicted", "ratio"):
            k.add_column(col, justify="left" if col in ("phase", "kind") else "right")
        for (phase, kind), (m, p) in kinds.items():
            k.add_row(phase, kind, fmt.duration(m), fmt.duration(p), _ratio(p / m if m else None))
        con.print(k)
    s = r.step
    con.print(f"step time: measured {fmt.duration(s.measured_s)} (median of {r.steps} after {r.warmup} warm-up; "
              f"min {fmt.duration(s.min_s)}, max {fmt.duration(s.max_s)}), predicted {fmt.duration(s.predicted_s)}, "
              f"[bold]ratio predicted/measured {_ratio(s.ratio)}[/bold]")
    by = ", ".join(f"{ph} {fmt.duration(s.measured_by_phase.get(ph))} vs {fmt.duration(t)}"
                   for ph, t in s.predicted_by_phase.items() if ph in s.measured_by_phase)
    con.print(f"  by phase (instrumented vs predicted): {by}")
    con.print(f"  per-op rows sum to {fmt.duration(s.per_op_sum_s)} of an instrumented step of {fmt.duration(s.instrumented_s)} "
              f"(hooks add {fmt.duration(max(0.0, s.instrumented_s - s.measured_s))})")
    con.print(f"tokens/s: {r.tokens_per_s:,.1f} ({r.tokens:,} tokens per step)")
    con.print(f"FLOPs per step: measured {r.measured_flops:,} (FlopCounterMode formulas, reference attention), ledger "
              f"matmul {r.ledger_matmul_flops:,} — {'equal' if r.flops_match else 'DIFFERENT'}")
    u = r.utilization
    con.print(f"MFU ({u.dtype}; model FLOPs = ledger matmul FLOPs {u.model_flops:,}; achieved "
              f"{fmt.rate(u.achieved_flops_per_s, 'FLOP/s')}): [bold]{fmt.pct(u.mfu_measured)}[/bold] of the measured peak "
              f"({fmt.rate(u.measured_peak, 'FLOP/s') if u.measured_peak else 'unknown'}), {fmt.pct(u.mfu_theoretical)} of the "
              f"theoretical peak ({fmt.rate(u.theoretical_peak, 'FLOP/s') if u.theoretical_peak else u.theoretical_peak_source})")
    same = u.hardware_flops == u.model_flops
    con.print(f"HFU (with recomputation): {fmt.pct(u.hfu_measured)} measured peak, {fmt.pct(u.hfu_theoretical)} theoretical"
              + (" — equal to MFU: no activation checkpointing, nothing recomputed" if same else ""))
    m = r.memory
    con.print(f"peak memory: {fmt.nbytes_gb(m.peak_bytes) if m.peak_bytes is not None else 'unknown'}"
              + (f" (increase during the step {fmt.nbytes_gb(m.increase_bytes)})" if m.increase_bytes is not None else "")
              + f"; ledger total {fmt.nbytes_gb(m.ledger_total_bytes)} ({m.ledger_rule})")
    con.print(f"  measured as: {m.method}")
    if comparison:
        t = Table(title="training vs inference (same batch and sequence; MFU against the measured peak)")
        for col in ("phase", "intensity", "predicted time", "predicted MFU", "measured MFU", "bound"):
            t.add_column(col, justify="left" if col in ("phase", "bound") else "right")
        for p in r.phases:
            t.add_row(p.phase, f"{p.intensity:.1f} FLOP/B", fmt.duration(p.predicted_s), fmt.pct(p.predicted_mfu),
                      fmt.pct(p.measured_mfu) if p.measured_mfu is not None else "not run", p.bound)
        con.print(t)
        con.print(r.phase_reason)
    for note in r.notes:
        con.print(f"note: {note}")
    con.print("")
