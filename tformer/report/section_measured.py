"""Section 4: prediction vs measurement — a real training run (loss curve, tokens/s, MFU), the
profiled training step op by op against the ledger's prediction, and real decoding."""

from __future__ import annotations

from tformer.core import fmt
from tformer.cost.roofline import roofline
from tformer.report import plots
from tformer.report.doc import Section


def _kind_rows(prof) -> list[tuple[str, float, float]]:
    agg: dict[str, list[float]] = {}
    for r in prof.ops:
        if not isinstance(r.predicted_s, float):
            continue
        key = r.kind if r.kind == r.phase else f"{r.phase} {r.kind}"
        a = agg.setdefault(key, [0.0, 0.0])
        a[0] += r.predicted_s
        a[1] += r.measured_s
    return [(k, v[0], v[1]) for k, v in agg.items()]


def _training(ctx, sec: Section) -> None:
    tr = ctx.results.get("train_run")
    if tr is None:
        sec.text(f"**No training run**: {ctx.results.get('train_skip_reason', '')}. The sections below measure "
                 "single steps of an untrained model (timing does not depend on the weights' values).")
        return
    w = ctx.workloads["train"]
    lg = ctx.ledgers["train"]
    predicted_step = roofline(lg, ctx.measured).time_s
    tokens_per_step = lg.tokens
    measured_step = tr["wall_s"] / tr["steps"] if tr["steps"] else None
    sec.figure("loss_curve", plots.loss_curve(tr["records"], f"Training {getattr(tr['config'], 'name', 'model')} on "
                                              f"{ctx.options.data} ({tr['steps']} steps, {tr['wall_s']:.0f} s)"),
               f"Loss of the real training run: {tr['steps']} AdamW steps of {w.batch} x {w.seq} characters, "
               f"lr {tr['lr']:g} ({tr['schedule']}, {tr['warmup']} warm-up steps), stopped by a {tr['budget_s']:g} s budget.")
    rows = [
        ["steps / wall time", f"{tr['steps']} steps in {fmt.seconds(tr['wall_s'])} (evaluation included)"],
        ["loss", f"{fmt.num(tr['first_loss'], 4)} → {fmt.num(tr['last_loss'], 4)} nats/token (train); "
                 f"validation {fmt.num(tr['val_loss'], 4)}"],
        ["tokens/s measured (whole run / median logging window)",
         f"{fmt.num(tr['tokens_per_s'], 4)} / {fmt.num(tr['tokens_per_s_median'], 4)}"],
        ["tokens/s predicted (ledger roofline on the measured roofs)",
         fmt.num(tokens_per_step / predicted_step, 4) if isinstance(predicted_step, float) else "unknown"],
        ["step time measured (wall / steps) vs predicted", f"{fmt.seconds(measured_step)} vs {fmt.seconds(predicted_step)}"],
        ["MFU (median over logging windows, vs measured peak)", fmt.pct(tr["mfu_median"])],
    ]
    trained_vocab = tr["config"].vocab_size
    if trained_vocab != ctx.config.vocab_size:
        rows.append(["vocabulary", f"the trained model uses the tokenizer's {trained_vocab} symbols, not the config's "
                                   f"{ctx.config.vocab_size}; its MFU uses its own ledger ({fmt.flops(tr['flops_per_step'])}"
                                   " per step)"])
    sec.table(["training run", "value"], rows, caption="The real training run (PyTorch's fused attention path; the "
              "profile below runs the reference path so its FLOPs match the ledger's)")


def _profile(ctx, sec: Section) -> None:
    prof = ctx.results["profiles"]["train"]
    u, st, mem = prof.utilization, prof.step, prof.memory
    sec.text(f"**Profiled training step** ({prof.workload['batch']} x {prof.workload['seq']}, {prof.steps} timed steps "
             f"after {prof.warmup} warm-up): measured {fmt.seconds(st.measured_s)} (spread {fmt.seconds(st.min_s)} .. "
             f"{fmt.seconds(st.max_s)}), predicted {fmt.seconds(st.predicted_s)}, predicted / measured "
             f"**{fmt.ratio(st.ratio)}**. Tokens/s {fmt.num(prof.tokens_per_s, 4)}. Measured FLOPs (FlopCounterMode) "
             f"{fmt.count(prof.measured_flops)} vs ledger {fmt.count(prof.ledger_matmul_flops)}: "
             f"{'equal' if prof.flops_match else 'different'}.")
    sec.table(["utilisation", "against the measured peak", "against the theoretical peak"], [
        ["MFU (model FLOPs / step time / peak)", fmt.pct(u.mfu_measured), fmt.pct(u.mfu_theoretical)],
        ["HFU (with recomputation)", fmt.pct(u.hfu_measured), fmt.pct(u.hfu_theoretical)],
        ["peak used", fmt.rate(u.measured_peak), fmt.rate(u.theoretical_peak)],
    ], caption=f"Achieved {fmt.rate(u.achieved_flops_per_s)} ({u.dtype}); theoretical peak source: {u.theoretical_peak_source}")
    sec.text(f"Peak memory: {fmt.nbytes(mem.peak_bytes)} (increase over the step's start {fmt.nbytes(mem.increase_bytes)}) "
             f"vs the ledger's {fmt.nbytes(mem.ledger_total_bytes)} ({mem.ledger_rule}). Method: {mem.method}.")
    kinds = _kind_rows(prof)
    if kinds:
        sec.figure("op_times", plots.kind_bars(kinds, "Training step: predicted vs measured time per op kind"),
                   "Per op kind, summed over layers: the ledger's prediction (light) and the measurement (dark).")
        sec.table(["phase and op kind", "predicted", "measured", "predicted / measured"],
                  [[k, fmt.seconds(p), fmt.seconds(m), fmt.ratio(p / m if m else None)] for k, p, m in kinds],
                  caption="Per op kind (the attention row covers scores, softmax and context together)")
    top = sorted(prof.ops, key=lambda r: -r.measured_s)[:10]
    sec.table(["op (slowest ten)", "phase", "measured", "predicted", "ratio", "achieved FLOP/s", "bound"],
              [[r.name, r.phase, fmt.seconds(r.measured_s), fmt.seconds(r.predicted_s), fmt.ratio(r.ratio),
                fmt.rate(r.achieved_flops_per_s), r.bound] for r in top], caption="The ten slowest measured ops")
    all_rows = [[r.name, r.phase, r.kind, fmt.seconds(r.measured_s), fmt.seconds(r.predicted_s), fmt.ratio(r.ratio),
                 fmt.count(r.measured_flops), r.bound] for r in prof.ops]
    sec.table(["op", "phase", "kind", "measured", "predicted", "ratio", "measured FLOPs", "bound"], all_rows,
              caption="Every profiled op of the training step", collapsed=True)
    sec.bullets(prof.notes)


def _inference(ctx, sec: Section) -> None:
    profs = ctx.results["profiles"]
    rows = []
    for name in ("prefill", "decode", "forward"):
        p = profs.get(name)
        if p is None:
            continue
        rows.append([name, fmt.seconds(p.step.measured_s), fmt.seconds(p.step.predicted_s), fmt.ratio(p.step.ratio),
                     fmt.num(p.tokens_per_s, 4), fmt.pct(p.utilization.mfu_measured)])
    if rows:
        sec.table(["inference step", "measured", "predicted", "predicted / measured", "tokens/s", "MFU (measured peak)"],
                  rows, caption="Profiled inference steps (batch 1; decode at the longest context)")
    gen = ctx.results.get("generation")
    if gen:
        c = gen["cache"]
        n = gen.get("nocache")
        state = "the trained model" if gen["trained"] else "an untrained model (random weights)"
        skipped = "not run (--quick; see the decode curve)"
        sec.table(["real decoding", "with KV cache", "without cache"], [
            ["decode tokens/s measured", fmt.num(c["decode_tokens_per_s"], 4),
             fmt.num(n["decode_tokens_per_s"], 4) if n else skipped],
            ["decode tokens/s predicted", fmt.num(gen["predicted_cache_tokens_per_s"], 4),
             fmt.num(gen["predicted_nocache_tokens_per_s"], 4) if n else skipped],
            ["prefill tokens/s measured", fmt.num(c["prefill_tokens_per_s"], 4),
             fmt.num(n["prefill_tokens_per_s"], 4) if n else skipped],
            ["KV cache at the end", fmt.nbytes(c["cache_bytes"]), fmt.nbytes(n["cache_bytes"]) if n else skipped],
        ], caption=f"Generating {gen['new_tokens']} tokens after a {gen['prompt_tokens']}-token prompt from {state} "
                   "(sampling: " + ", ".join(f"{k} {v}" for k, v in gen["sampling"].items() if k != "do_sample") + ")")
        sec.text(f"Sample (with cache): `{c['text']!r}`")


def build(ctx) -> Section:
    sec = Section(4, "Prediction vs measurement", "measurement")
    for note in ctx.notes:
        sec.text(f"**Note:** {note}")
    _training(ctx, sec)
    _profile(ctx, sec)
    _inference(ctx, sec)
    prof = ctx.results["profiles"]["train"]
    tr = ctx.results.get("train_run")
    gen = ctx.results.get("generation")
    ctx.data["measurement"] = {
        "train_run": {k: v for k, v in tr.items() if k not in ("model", "tokenizer", "config")} if tr else None,
        "train_skip_reason": ctx.results.get("train_skip_reason"),
        "profiles": {k: {"step_time_s": {"measured": p.step.measured_s, "predicted": p.step.predicted_s,
                                         "ratio": p.step.ratio},
                         "tokens_per_s": p.tokens_per_s, "mfu": p.utilization.mfu_measured,
                         "hfu": p.utilization.hfu_measured, "mfu_theoretical": p.utilization.mfu_theoretical,
                         "measured_flops": p.measured_flops, "ledger_matmul_flops": p.ledger_matmul_flops,
                         "peak_memory_bytes": p.memory.peak_bytes}
                     for k, p in ctx.results["profiles"].items()},
        "ops": [r.to_dict() for r in prof.ops],
        "generation": gen,
    }
    return sec
