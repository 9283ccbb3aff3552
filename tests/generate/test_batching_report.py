"""The measured-vs-predicted batching table from a real ContinuousBatcher run (structure and relations,
never timings)."""

from __future__ import annotations

import threading

import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.cost.batching import decode_speed
from tformer.generate.batching_report import batching_rows, format_batching_table
from tformer.generate.continuous import ContinuousBatcher, Request, StepStats
from tformer.machine import Device
from tformer.model import build

DEVICE = Device.from_roofs("toy", "custom", {"fp32": 1e12}, source="test", bandwidth=1e11)
CONFIG = ModelConfig(arch="decoder", n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=24, max_positions=48)


def _served_stats(max_batch: int, lengths: list[int]) -> StepStats:
    torch.manual_seed(0)
    batcher = ContinuousBatcher(build(CONFIG).eval(), max_batch=max_batch).start()
    done = threading.Semaphore(0)
    try:
        for i, n in enumerate(lengths):
            batcher.submit(Request([1 + i % 5, 2, 3], max_new_tokens=n, stop_tokens=()),
                           lambda seq, token, finish: finish is not None and done.release())
        for _ in lengths:
            assert done.acquire(timeout=60)
    finally:
        assert batcher.shutdown(drain=True, timeout=60)
    return batcher.stats


@pytest.fixture(scope="module")
def stats():
    return _served_stats(4, [6, 9, 3, 12, 5, 8])


def test_rows_relate_steps_tokens_and_speedups(stats):
    rows = batching_rows(stats, CONFIG, DEVICE)
    assert [r["batch"] for r in rows] == sorted(stats.steps) and rows
    assert all(1 <= r["batch"] <= 4 for r in rows)
    for r in rows:
        steps, seconds, _ = stats.steps[r["batch"]]
        assert r["steps"] == steps and r["tokens"] == r["batch"] * steps
        assert r["measured_tokens_per_s"] == pytest.approx(r["tokens"] / seconds)
        assert r["predicted_tokens_per_s"] == decode_speed(CONFIG, DEVICE, r["batch"], r["mean_context"]).tokens_per_s
        assert 0 <= r["mean_context"] < CONFIG.max_positions
        if r["batch"] == 1:
            assert r["predicted_speedup"] == 1.0 and r["measured_speedup"] == pytest.approx(1.0)
        else:
            assert r["predicted_speedup"] > 1.0
        assert r["measured_speedup"] > 0
    # Every generated token but each request's first (from its prefill) came out of a decode step.
    assert sum(r["tokens"] for r in rows) == stats.tokens - 6 == sum([6, 9, 3, 12, 5, 8]) - 6
    text = format_batching_table(rows)
    lines = text.splitlines()
    assert "measured speed-up" in lines[0] and "predicted speed-up" in lines[0] and set(lines[1]) <= {"-", " "}
    assert len(lines) == 2 + len(rows) + (0 if 1 in stats.steps else 1)


def test_without_batch_one_rows_the_measured_speedup_is_against_the_prediction():
    stats = StepStats()
    stats.add_step(4, 0.01, 10)
    stats.add_step(4, 0.03, 12)
    (row,) = batching_rows(stats, CONFIG, DEVICE)
    assert row["tokens"] == 8 and row["mean_context"] == 10  # mean cache length 11, less the new token
    one = decode_speed(CONFIG, DEVICE, 1, 10).tokens_per_s
    assert row["measured_speedup"] == pytest.approx((8 / 0.04) / one)
    assert row["speedup_reference"] == "predicted"
    assert "against the predicted batch-1" in format_batching_table([row])


def test_one_at_a_time_serving_has_only_batch_one_rows():
    rows = batching_rows(_served_stats(1, [4, 4, 4]), CONFIG, DEVICE)
    assert [r["batch"] for r in rows] == [1] and rows[0]["tokens"] == 9
