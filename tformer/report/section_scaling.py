"""Section 6: scaling — what doubling d_model, layers, sequence or batch does to FLOPs, memory and
time; whether it still fits this device's memory; and what would make it fit (mixed precision,
activation checkpointing, fused attention, gradient accumulation, int8 weights), with the
ledger's numbers for each."""

from __future__ import annotations

from dataclasses import replace

from tformer.core import fmt
from tformer.core.errors import TformerError
from tformer.cost.ledger import ledger
from tformer.cost.scaling import (
    CHINCHILLA_TOKENS_PER_PARAM,
    WHAT_IF_KNOBS,
    attention_crossover,
    scaled_config,
    training_run,
    what_if,
)
from tformer.report.doc import Section

FACTOR = 2
MAX_DOUBLINGS = 16


def scaled(config, workload, knob: str, factor: int):
    """(config, workload) with one knob multiplied, as tformer.cost.scaling.what_if does it."""
    if knob in ("d_model", "n_layers"):
        return scaled_config(config, knob, factor), workload
    w = replace(workload, **{knob: getattr(workload, knob) * factor})
    if knob == "seq" and config.position in ("learned", "sinusoidal") and w.seq > config.max_positions:
        config = config.replace(max_positions=w.seq)  # the position table grows with the sequence
    return config, w


def remedies(config, w) -> dict[str, int]:
    """Training memory (bytes) of one step under each remedy, alone and combined."""
    mp = dict(dtype="bf16", mixed_precision=True)
    out = {
        "as is (fp32 AdamW)": ledger(config, w).memory["total"],
        "mixed precision (bf16 + fp32 master)": ledger(config, replace(w, **mp)).memory["total"],
        "activation checkpointing": ledger(config, replace(w, checkpointing=True)).memory["total"],
        "fused attention (no s×s scores)": ledger(config, replace(w, materialize_scores=False)).memory["total"],
    }
    if w.batch >= 2 and w.batch % 2 == 0:
        out["gradient accumulation x2 (half batch per micro-step)"] = ledger(config, replace(w, batch=w.batch // 2)).memory["total"]
    out["all of the above"] = ledger(config, replace(w, checkpointing=True, materialize_scores=False,
                                                     batch=w.batch // 2 if w.batch % 2 == 0 else w.batch, **mp)).memory["total"]
    return out


def _need(config, w, combined: bool) -> int:
    if combined:
        return remedies(config, w)["all of the above"]
    return ledger(config, w).memory["total"]


def headroom(config, w, knob: str, capacity: int, combined: bool) -> tuple[int, int]:
    """How many times ``knob`` can double before training no longer fits ``capacity`` bytes, and the
    largest value that fits. Layers: memory is exactly linear in the layer count (each layer adds the
    same weights, state and activations), so two ledgers fix the line instead of building ledgers of
    thousands of layers."""
    if knob == "n_layers":
        c2 = scaled_config(config, knob, FACTOR)
        m1, m2 = _need(config, w, combined), _need(c2, w, combined)
        per_layer = (m2 - m1) / (c2.n_layers - config.n_layers)
        k, layers = 0, config.n_layers
        while k < MAX_DOUBLINGS and m1 + per_layer * (layers * FACTOR - config.n_layers) <= capacity:
            k, layers = k + 1, layers * FACTOR
        return k, layers
    c, wl = config, w
    for k in range(1, MAX_DOUBLINGS + 1):
        try:
            c2, w2 = scaled(c, wl, knob, FACTOR)
        except TformerError:
            return k - 1, getattr(c, knob) if knob == "d_model" else getattr(wl, knob)
        if _need(c2, w2, combined) > capacity:
            return k - 1, getattr(c, knob) if knob == "d_model" else getattr(wl, knob)
        c, wl = c2, w2
    return MAX_DOUBLINGS, getattr(c, knob) if knob == "d_model" else getattr(wl, knob)


def build(ctx) -> Section:
    sec = Section(6, "Scaling", "scaling")
    w = ctx.workloads["train"]
    capacity = ctx.target_memory
    wi = what_if(ctx.config, w, factor=FACTOR, device=ctx.target)
    base = wi["base"]
    rows = [["(as configured)", fmt.params(base["params"]), fmt.flops(base["flops"]), fmt.nbytes(base["memory_total"]),
             fmt.seconds(base["time_s"]), "yes" if capacity and base["memory_total"] <= capacity else
             ("unknown" if not capacity else "no")]]
    fits = {}
    for r in wi["rows"]:
        v, q = r["values"], r["ratios"]
        ok = None if not capacity else v["memory_total"] <= capacity
        fits[r["knob"]] = ok
        rows.append([f"{r['knob']} x{FACTOR:g}", f"{fmt.params(v['params'])} ({fmt.ratio(q['params'])})",
                     f"{fmt.flops(v['flops'])} ({fmt.ratio(q['flops'])})",
                     f"{fmt.nbytes(v['memory_total'])} ({fmt.ratio(q['memory_total'])})",
                     f"{fmt.seconds(v['time_s'])} ({fmt.ratio(q['time_s'])})",
                     "unknown" if ok is None else ("yes" if ok else "**no**")])
    sec.table(["training step", "parameters", "FLOPs", "training memory", "predicted step time",
               f"fits {fmt.gib(capacity) if capacity else 'unknown'}?"], rows,
              caption=f"Doubling one knob at a time ({w.batch} x {w.seq}, fp32 AdamW; time on {ctx.target.name})")
    sec.text("Doubling d_model roughly quadruples the weight matmuls (d² per token) and the weights; doubling layers "
             "doubles both; doubling the sequence doubles the per-token work and quadruples the s×s scores; doubling "
             "the batch doubles FLOPs and activations but not the weights or optimizer state.")

    rem_rows = []
    names = None
    for knob in WHAT_IF_KNOBS:
        c2, w2 = scaled(ctx.config, w, knob, FACTOR)
        rem = remedies(c2, w2)
        names = names or list(rem)
        rem_rows.append([f"{knob} x{FACTOR:g}"] + [fmt.gib(rem.get(n)) for n in names])
    sec.table(["training step"] + names, rem_rows,
              caption="What would make it fit: training memory under each remedy (ledger; GiB = 2^30 B). "
                      "Checkpointing costs one extra forward pass per step; gradient accumulation keeps the "
                      "optimizer batch but runs two micro-steps.")
    dw = ctx.workloads.get("decode")
    if dw is not None:
        inf = []
        for knob in ("d_model", "n_layers"):
            c2 = scaled_config(ctx.config, knob, FACTOR)
            row = [f"{knob} x{FACTOR:g}"]
            for dtype in ("fp32", "bf16", "int8"):
                row.append(fmt.gib(ledger(c2, replace(dw, dtype=dtype)).memory["total"]))
            inf.append(row)
        sec.table(["inference (decode, batch 1)", "fp32", "bf16", "int8 weights (quantised)"], inf,
                  caption=f"Inference memory at context {dw.decode_context}: quantising the weights shrinks the "
                          "largest term of a decode step")

    if capacity:
        lines = []
        for knob in ("d_model", "n_layers", "batch"):
            plain = headroom(ctx.config, w, knob, capacity, combined=False)
            best = headroom(ctx.config, w, knob, capacity, combined=True)
            lines.append(f"{knob}: doubles {plain[0]} time(s) (to {plain[1]}) before fp32 AdamW training outgrows "
                         f"{fmt.gib(capacity)}; with all the remedies above {best[0]} time(s) (to {best[1]})"
                         + (f" (search stops at {MAX_DOUBLINGS})" if best[0] == MAX_DOUBLINGS else ""))
        sec.text(f"Headroom on {ctx.target.name} ({fmt.gib(capacity)}):")
        sec.bullets(lines)

    cross = attention_crossover(ctx.config)
    sec.text(f"Attention's s² work (QKᵀ and AV) overtakes the FFN matmuls at sequence length {fmt.num(cross['vs_ffn'], 6)} "
             f"and the q/k/v/o projections at {fmt.num(cross['vs_projections'], 6)} ({cross['note']}).")
    prof = ctx.results.get("profiles", {}).get("train")
    mfu = prof.utilization.mfu_measured if prof else None
    peak = ctx.measured.peak(ctx.dtype)
    n = ledger(ctx.config, w).params["non_embedding"]
    if mfu and peak:
        tokens = CHINCHILLA_TOKENS_PER_PARAM * n
        run = training_run(ctx.config, tokens, devices=1, utilization=min(mfu, 1.0), peak_flops=peak, workload=w)
        sec.text(f"Compute-optimal training (Hoffmann et al. 2022: {CHINCHILLA_TOKENS_PER_PARAM} tokens per parameter) of "
                 f"this model is {fmt.count(int(tokens))} tokens = {fmt.flops(int(run['flops']))} "
                 f"(6ND: {fmt.flops(int(run['flops_6nd']))}); at the measured MFU {fmt.pct(mfu)} of "
                 f"{fmt.rate(peak)} that takes {fmt.seconds(run['seconds'])} here.")
        ctx.data["chinchilla"] = run
    ctx.data["scaling"] = {"what_if": wi, "capacity_bytes": capacity, "fits": fits, "crossover": cross}
    return sec
