"""Section 11: serving — what batching buys. The ledger's part is always shown (no torch, no measurement):
a decode step over b sequences reads the weights once for all b, so tokens/s grow with b until compute
catches up (tformer.cost.batching), for the report's model on the report's device. The measured part is
read from the latest bench/serve_load.py record filed for this CPU: `tformer serve` driven by 1 to 128
concurrent clients, continuous batching against one request at a time in the same run. Nothing is served
while the report runs.
"""

from __future__ import annotations

from tformer.core import fmt
from tformer.cost.batching import crossover_batch, decode_speedups, decode_terms, device_roofs
from tformer.report import plots
from tformer.report.doc import Section
from tformer.report.section_long_context import RESULTS_DIR, bench_record, parsed_record

COMMAND = "python bench/serve_load.py"
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128)
MODES = ("continuous", "one-at-a-time")


def build(ctx) -> Section:
    sec = Section(11, "Serving: what batching buys", "serving")
    data: dict = {}
    series: dict = {}
    config = ctx.config
    if config.traits.decoder:
        context = min(config.max_positions - 1, ctx.options.seq or 128)
        rows = decode_speedups(config, ctx.target, BATCHES, context)
        data["predicted"] = {"context": context, "device": ctx.target.name, "rows": rows}
        sec.text(_ledger_text(config, ctx.target, context))
        sec.table(["batch", "s / step", "tokens/s", "speed-up over batch 1", "bound"],
                  [[r["batch"], fmt.seconds(r["seconds"]), fmt.num(r["tokens_per_s"]), fmt.ratio(r["speedup"]),
                    r["bound"]] for r in rows],
                  caption=f"Predicted by the ledger's roofline on {ctx.target.name}: one decode step of this model "
                          f"over b sequences, each with {context} tokens cached")
        if all(r["speedup"] for r in rows):
            series["this model (ledger)"] = {"predicted": [(r["batch"], r["speedup"]) for r in rows]}
    else:
        sec.text(f"This model is {config.traits.label}; it does not decode, so `tformer serve` answers "
                 "/v1/embeddings for it, batched by a short window rather than step by step.")
    _measured(sec, ctx, data, series)
    if series:
        sec.figure("serving_speedup", plots.loglog_by_kind(series, "tokens/s over batch 1 (one at a time)",
                                                           "What batching buys"),
                   "Decode speed-up over batch 1: the ledger's prediction (dashed) and, for the bench's model, "
                   "continuous batching's tokens/s over one-at-a-time serving measured against the number of "
                   "concurrent clients (markers).")
    ctx.data["serving"] = data
    return sec


def _ledger_text(config, device, context: int) -> str:
    text = ("Decoding reads every weight once per step, whatever the number of sequences in the step: at batch 1 a "
            "step is a matrix-vector product, memory-bound; at batch b the same bytes serve b tokens. Attention "
            "over each sequence's own KV cache gains nothing. ")
    peak, bandwidth = device_roofs(device)
    if peak and bandwidth:
        b_star = crossover_batch(decode_terms(config, context).weights, peak, bandwidth)
        if b_star is not None:
            text += (f"On the roofs of {device.name} the weight matmuls stay memory-bound up to a batch of about "
                     f"{b_star:.0f} (b* = weight-read time / (per-row FLOP time - per-row byte time)); beyond it "
                     "tokens/s stop growing.")
    return text


def _measured(sec: Section, ctx, data: dict, series: dict) -> None:
    record, source = bench_record(ctx.specs.cpu, "serve_load", "serve_load record", COMMAND, "results", RESULTS_DIR)
    parsed = parsed_record(sec, data, record, source, "serve_load", COMMAND, _rows)
    if parsed is None:
        return
    rows, measured = parsed
    model = record.get("model", {})
    sec.table(["clients", "continuous tok/s", "one-at-a-time tok/s", "measured ratio", "predicted speed-up",
               "TTFT p50 (cont. / one)", "TTFT p99 (cont. / one)", "failed"], rows,
              caption=f"Measured on this CPU ({source}): `tformer serve` with a {model.get('n_layers')}-layer, "
                      f"d_model {model.get('d_model')} decoder, {record.get('max_tokens')} tokens per request, "
                      f"both modes in the same run; predicted: the ledger at the batch those clients fill")
    series["bench model"] = measured
    data["measured"] = {"source": source, "record": record}


def _rows(record: dict) -> tuple[list, dict]:
    """The table rows and the plotted points; a record missing a part raises (KeyError, TypeError, ...)."""
    results, predicted = record["results"], record.get("predicted_speedup", {})
    rows, points, expected = [], [], []
    for clients in record["levels"]:
        cont, one = (results[mode][str(clients)] for mode in MODES)
        ratio = cont["tokens_per_s"] / one["tokens_per_s"]
        guess = (predicted.get(str(clients)) or {}).get("profile")
        rows.append([clients, fmt.num(cont["tokens_per_s"]), fmt.num(one["tokens_per_s"]), fmt.ratio(ratio),
                     fmt.ratio(guess), _pair(cont, one, "p50"), _pair(cont, one, "p99"),
                     cont["failed"] + one["failed"]])
        points.append((clients, ratio))
        if guess:
            expected.append((clients, guess))
    return rows, {"measured": points, "predicted": expected}


def _pair(cont: dict, one: dict, q: str) -> str:
    return f"{fmt.seconds(cont['ttft_s'][q])} / {fmt.seconds(one['ttft_s'][q])}"
