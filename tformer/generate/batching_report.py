"""What batching bought, measured beside the ledger's prediction: a ContinuousBatcher's decode steps by
batch size (StepStats) set against tformer.cost.batching on a device.

    rows = batching_rows(batcher.stats, model.config, resolve_hardware("measured"))
    print(format_batching_table(rows))

A decode step at batch b reads the weights once for b tokens: the predicted speed-up is what the
roofline says that saving is worth at each row's mean context; the measured one is the batcher's own
clock (seconds inside runner.step, summed per batch size).
"""

from __future__ import annotations

from tformer.core import fmt
from tformer.cost.batching import decode_speed
from tformer.generate.continuous import StepStats
from tformer.machine import detect, load_measured_device

COLUMNS = ("batch", "steps", "tokens", "mean context", "measured tok/s", "predicted tok/s", "measured speed-up",
           "predicted speed-up")


def prediction_device():
    """This machine's measured profile (`tformer bench`) when one is saved, else its theoretical CPU roofs."""
    return load_measured_device() or detect().cpu_device()


def _ledger_context(config, mean_length: float) -> int:
    """The batcher records the cache length after the step (the new token included); the ledger's
    context is what was cached before it, within the position table."""
    return max(0, min(round(mean_length) - 1, config.max_positions - 1))


def batching_rows(stats: StepStats, config, device, *, dtype: str = "fp32") -> list[dict]:
    """One row per batch size seen, smallest first: steps, tokens (= batch x steps), mean context, measured
    and predicted tokens/s, and each speed-up over batch 1: measured against the measured batch-1 rows
    when there are any, else against the prediction at 1; predicted against the prediction at 1 at the
    same context (so it is 1 at batch 1)."""
    base = stats.steps.get(1)
    measured_one = base[0] / base[1] if base and base[1] > 0 else None
    rows = []
    for batch in sorted(stats.steps):
        steps, seconds, mean_length = stats.steps[batch]
        context = _ledger_context(config, mean_length)
        predicted = decode_speed(config, device, batch, context, dtype=dtype).tokens_per_s
        predicted_one = decode_speed(config, device, 1, context, dtype=dtype).tokens_per_s
        measured = batch * steps / seconds if seconds > 0 else None
        reference = measured_one if measured_one is not None else predicted_one
        rows.append({
            "batch": batch, "steps": steps, "tokens": batch * steps, "seconds": seconds, "mean_context": context,
            "measured_tokens_per_s": measured, "predicted_tokens_per_s": predicted,
            "measured_speedup": measured / reference if measured and reference else None,
            "predicted_speedup": predicted / predicted_one if predicted and predicted_one else None,
            "speedup_reference": "measured" if measured_one is not None else "predicted",
        })
    return rows


def format_batching_table(rows: list[dict]) -> str:
    """Plain columns, right-aligned, two spaces apart; a note says what the measured speed-up is against."""
    body = [[str(r["batch"]), fmt.count(r["steps"]), fmt.count(r["tokens"]), str(r["mean_context"]),
             fmt.num(r["measured_tokens_per_s"]), fmt.num(r["predicted_tokens_per_s"]),
             fmt.ratio(r["measured_speedup"]), fmt.ratio(r["predicted_speedup"])] for r in rows]
    widths = [max(len(c) for c in col) for col in zip(COLUMNS, *body)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in [COLUMNS, *body]]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if rows and rows[0]["speedup_reference"] == "predicted":
        lines.append("(no batch-1 steps measured: measured speed-ups are against the predicted batch-1 tokens/s)")
    return "\n".join(lines)


__all__ = ["batching_rows", "format_batching_table", "prediction_device"]
