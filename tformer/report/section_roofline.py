"""Section 3: the roofline — the machine's roofs (theoretical and measured, and --hardware's when
given) with every op of a training step, a prefill and a decode step placed by its arithmetic
intensity; the verdict per op kind, per op (appendix) and overall, with the reason."""

from __future__ import annotations

from tformer.core import fmt
from tformer.cost.roofline import COMPUTE_DTYPE, roofline
from tformer.report import plots
from tformer.report.doc import Section

PHASES = ("train", "prefill", "decode", "forward")


def rooflines(ctx) -> dict:
    """name -> (ledger, Roofline on the target device), computed once and shared with the appendix."""
    if "rooflines" not in ctx.results:
        names = [n for n in PHASES if n in ctx.ledgers and not (n == "forward" and "prefill" in ctx.ledgers)]
        ctx.results["rooflines"] = {n: (ctx.ledgers[n], roofline(ctx.ledgers[n], ctx.target)) for n in names}
    return ctx.results["rooflines"]


def _roofs(ctx, dtype) -> list[dict]:
    roofs = [{"label": f"theoretical {ctx.theoretical.name}", "peak": ctx.theoretical.peak(dtype),
              "bandwidth": ctx.theoretical.bandwidth, "color": "#444444", "ls": "--"},
             {"label": f"measured {ctx.bench.device(ctx.torch_device).name}", "peak": ctx.measured.peak(dtype),
              "bandwidth": ctx.measured.bandwidth, "color": "#000000", "ls": "-"}]
    if ctx.target is not ctx.measured:
        roofs.append({"label": f"--hardware {ctx.target.name}", "peak": ctx.target.peak(dtype),
                      "bandwidth": ctx.target.bandwidth, "color": "#9467bd", "ls": "-."})
    return roofs


def _theoretical_source(ctx, dtype) -> str:
    """The source of the one peak the roofline uses (the Device's source lists every dtype's)."""
    if not ctx.is_gpu and dtype in ctx.specs.cpu_peaks:
        return ctx.specs.cpu_peaks[dtype].source + "; bandwidth: " + ctx.specs.cpu_bandwidth.source
    return ctx.theoretical.source


def _verdict(lg, roof) -> tuple[str, str]:
    share = roof.bound_share or {}
    total = sum(share.values())
    if not total:
        return "unknown", f"{roof.device}: peak or bandwidth unknown"
    flops = lg.flops["total"]
    nbytes = sum(op.bytes for op in lg.ops)
    main = max(share, key=share.get)
    intensity = flops / nbytes if nbytes else 0.0
    ridge = roof.ridge_point
    parts = ", ".join(f"{fmt.pct(v / total)} of the predicted time in {k}-bound ops"
                      for k, v in share.items() if v / total >= 0.0005)
    why = {"compute": "its big matmuls reuse each weight across many tokens, so arithmetic outruns memory",
           "memory": "it moves more bytes than its arithmetic can hide: weights and caches are read for few FLOPs",
           "overhead": "its ops are so small that the fixed cost of each call exceeds both roofs"}[main]
    return main, (f"{parts}; overall intensity {intensity:.3g} FLOP/B against a ridge point of "
                  f"{fmt.num(ridge)} FLOP/B — {why}")


def build(ctx) -> Section:
    sec = Section(3, "The roofline", "roofline")
    dtype = COMPUTE_DTYPE[ctx.dtype]
    rl = rooflines(ctx)
    points = []
    for name, (lg, roof) in rl.items():
        for op, t in zip(lg.ops, roof.ops):
            if op.intensity and op.flops and isinstance(t.time_s, float) and t.time_s > 0:
                points.append({"phase": name, "intensity": op.intensity, "rate": op.flops / t.time_s})
    measured = []
    prof = ctx.results.get("profiles", {}).get("train")
    if prof is not None:
        for r in prof.ops:
            if r.ledger_bytes and r.ledger_flops and r.measured_s > 0:
                measured.append({"intensity": r.ledger_flops / r.ledger_bytes, "rate": r.ledger_flops / r.measured_s})
    roofs = _roofs(ctx, dtype)
    sec.figure("roofline", plots.roofline(roofs, points, measured, dtype),
               "Roofline (log-log). Filled markers: every op with FLOPs, at FLOPs / predicted time on "
               f"{ctx.target.name} (below the roof when the measured matmul curve says that size runs slower, or "
               "when per-call overhead dominates); hollow: the profiled training step's ops at their measured rate.")
    sec.table(["roof", "peak FLOP/s", "bandwidth", "ridge point (FLOP/B)", "source"],
              [[r["label"], fmt.rate(r["peak"]), fmt.bandwidth(r["bandwidth"]),
                fmt.num(r["peak"] / r["bandwidth"]) if r["peak"] and r["bandwidth"] else "unknown",
                src] for r, src in zip(roofs, [_theoretical_source(ctx, dtype), ctx.measured.source, ctx.target.source])],
              caption=f"The roofs ({dtype}); attainable FLOP/s = min(peak, bandwidth x intensity)")
    any_roof = next(iter(rl.values()))[1]
    sec.text(f"Prediction model: {any_roof.model}; efficiency {any_roof.efficiency:g} (1 = the ideal roofline).")

    verdicts = {}
    for name, (lg, roof) in rl.items():
        main, reason = _verdict(lg, roof)
        verdicts[name] = {"bound": main, "reason": reason, "time_s": roof.time_s, "bound_share": roof.bound_share}
        rows = {}
        for op, t in zip(lg.ops, roof.ops):
            key = (op.phase, op.kind)
            r = rows.setdefault(key, {"n": 0, "imin": None, "imax": None, "t": 0.0, "bounds": {}})
            r["n"] += 1
            if op.intensity is not None:
                r["imin"] = op.intensity if r["imin"] is None else min(r["imin"], op.intensity)
                r["imax"] = op.intensity if r["imax"] is None else max(r["imax"], op.intensity)
            if isinstance(t.time_s, float):
                r["t"] += t.time_s
                r["bounds"][t.bound] = r["bounds"].get(t.bound, 0.0) + t.time_s
        total = roof.time_s if isinstance(roof.time_s, float) else 0.0
        table = []
        for (phase, kind), r in rows.items():
            bound = max(r["bounds"], key=r["bounds"].get) if r["bounds"] else "unknown"
            span = "—" if r["imin"] is None else (f"{r['imin']:.3g}" if r["imin"] == r["imax"] else
                                                 f"{r['imin']:.3g} .. {r['imax']:.3g}")
            table.append([phase, kind, str(r["n"]), span, bound, fmt.seconds(r["t"]),
                          fmt.pct(r["t"] / total) if total else "unknown"])
        w = ctx.workloads[name]
        sec.table(["phase", "op kind", "ops", "intensity (FLOP/B)", "bound", "predicted time", "share"], table,
                  caption=f"{name} ({w.batch} x {w.seq}{', context ' + str(w.decode_context) if w.phase == 'decode' else ''}): "
                          f"verdict **{main}-bound**, predicted {fmt.seconds(roof.time_s)} on {roof.device}")
        sec.text(f"**{name}: {main}-bound.** {reason}.")
    sec.text("Every op with its intensity, bound and predicted time is listed in the appendix.")
    ctx.data["roofline"] = {"device": ctx.target.name, "dtype": dtype, "verdicts": verdicts,
                            "roofs": [{k: v for k, v in r.items() if k in ("label", "peak", "bandwidth")} for r in roofs]}
    return sec


def appendix_ops(ctx, sec: Section) -> None:
    """Every op of every analysed step: the per-op verdict."""
    for name, (lg, roof) in rooflines(ctx).items():
        rows = [[op.name, op.phase, op.kind, fmt.count(op.flops), fmt.count(op.bytes),
                 f"{op.intensity:.3g}" if op.intensity is not None else "—", t.bound, fmt.seconds(t.time_s)]
                for op, t in zip(lg.ops, roof.ops)]
        sec.table(["op", "phase", "kind", "FLOPs", "bytes", "FLOP/B", "bound", "predicted"], rows,
                  caption=f"Every op of the {name} step on {roof.device}", collapsed=True)
