"""Section 5: training vs inference — which phase uses the hardware better and why (arithmetic
intensity against the ridge point), and decode cost against context with and without the KV cache,
measured and predicted."""

from __future__ import annotations

from tformer.core import fmt
from tformer.cost.roofline import COMPUTE_DTYPE, roofline
from tformer.cost.scaling import decode_compute_bound_batch
from tformer.report import plots
from tformer.report.doc import Section
from tformer.report.section_model import describe


def phase_rows(ctx) -> list[dict]:
    """Train, prefill and decode (encoders: train and forward) at the report's own workloads: the
    ledger's intensity and predicted time on the measured roofs, the profile's measured MFU."""

    profs = ctx.results["profiles"]
    peak = ctx.measured.peak(COMPUTE_DTYPE[ctx.dtype])
    rows = []
    for name, prof in profs.items():
        lg = ctx.ledgers[name]
        roof = roofline(lg, ctx.measured)
        nbytes = sum(op.bytes for op in lg.ops)
        t = roof.time_s
        share = roof.bound_share or {}
        rows.append({"phase": name, "workload": describe(ctx.workloads[name]),
                     "intensity": lg.flops["total"] / nbytes if nbytes else 0.0, "predicted_s": t,
                     "predicted_mfu": lg.flops["matmul"] / t / peak if isinstance(t, float) and t > 0 and peak else None,
                     "measured_s": prof.step.measured_s, "measured_mfu": prof.utilization.mfu_measured,
                     "tokens_per_s": prof.tokens_per_s, "bound": max(share, key=share.get) if share else "unknown"})
    return rows


def reason(rows: list[dict], ridge) -> str:
    hi = max(rows, key=lambda r: r["measured_mfu"] or 0.0)
    lo = min(rows, key=lambda r: r["intensity"])
    return (f"**{hi['phase']}** uses the hardware best (measured MFU {fmt.pct(hi['measured_mfu'])}): at "
            f"{hi['intensity']:.3g} FLOP/B it does more arithmetic per byte than the ridge point "
            f"({fmt.num(ridge)} FLOP/B), because every weight it reads serves many tokens. **{lo['phase']}** "
            f"({lo['workload'].split(': ', 1)[-1]}) reads every weight for one token per sequence: {lo['intensity']:.3g} FLOP/B, so it "
            f"waits on memory, not on the multipliers (measured MFU {fmt.pct(lo['measured_mfu'])}). Batching "
            "sequences, or many tokens per step as prefill and training do, is what raises the intensity.")


def build(ctx) -> Section:
    sec = Section(5, "Training vs inference", "phases")
    rows = phase_rows(ctx)
    ridge = ctx.measured.ridge_point(ctx.dtype)
    sec.table(["phase", "workload", "intensity (FLOP/B)", "predicted step", "measured step", "predicted MFU",
               "measured MFU", "bound", "tokens/s measured"],
              [[r["phase"], r["workload"], f"{r['intensity']:.3g}", fmt.seconds(r["predicted_s"]),
                fmt.seconds(r["measured_s"]), fmt.pct(r["predicted_mfu"]), fmt.pct(r["measured_mfu"]), r["bound"],
                fmt.num(r["tokens_per_s"])] for r in rows],
              caption=f"Training vs inference on the measured roofs (ridge point {fmt.num(ridge)} FLOP/B); MFU = "
                      "matmul FLOPs / step time / measured peak")
    sec.text(reason(rows, ridge))

    curve = ctx.results.get("decode_curve")
    if curve:
        sec.figure("decode_curve", plots.decode_curve(curve),
                   "One new token at context n, batch 1: with the KV cache a decode step reads the weights and n cached "
                   "keys/values (O(d² + n·d) per token); without it the whole prefix is recomputed (O(n·d² + n²·d)).")
        sec.table(["context n", "KV cache", "FLOPs with cache", "FLOPs without", "measured with cache",
                   "predicted with cache", "measured without", "predicted without"],
                  [[str(r["context"]), fmt.nbytes(r["kv_cache_bytes"]), fmt.count(r["flops_cache"]),
                    fmt.count(r["flops_nocache"]), fmt.seconds(r["measured_cache_s"]), fmt.seconds(r["predicted_cache_s"]),
                    fmt.seconds(r["measured_nocache_s"]), fmt.seconds(r["predicted_nocache_s"])] for r in curve],
                  caption="Decode cost vs context (measured: median of timed steps; predicted: the ledger's roofline "
                          "on the measured roofs)")
        last = curve[-1]
        sec.text(f"At context {last['context']} the cache saves {fmt.ratio(last['flops_nocache'] / last['flops_cache'])} "
                 f"in FLOPs and measures {fmt.ratio(last['measured_nocache_s'] / last['measured_cache_s'])} faster "
                 f"per token, for {fmt.nbytes(last['kv_cache_bytes'])} of cache.")
        dw = ctx.workloads["decode"]
        cb = decode_compute_bound_batch(ctx.config, dw.decode_context, ctx.measured, dtype=ctx.dtype)
        if cb.get("batch") not in (None, "unknown"):
            sec.text(f"Decode turns compute-bound on these roofs at batch **{cb['batch']}** (context "
                     f"{dw.decode_context}): each added sequence brings {fmt.count(cb['flops_per_sequence'])} FLOPs and "
                     f"{fmt.count(cb['bytes_per_sequence'])} bytes, while the {fmt.count(cb['weight_bytes'])} bytes of "
                     f"weights are read once per step whatever the batch; ridge point {fmt.num(cb['ridge_point'])} FLOP/B.")
        else:
            sec.text(f"No batch size turns decode compute-bound on these roofs at context {dw.decode_context}: "
                     f"{cb.get('reason', '')}.")
        ctx.data["decode_compute_bound_batch"] = cb
    ctx.data["phases"] = {"rows": rows, "reason": reason(rows, ridge), "decode_curve": curve}
    return sec
