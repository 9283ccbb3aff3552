"""The ledger's decode speed by batch size (tformer.cost.batching): the same number as the ledger's own
decode prediction at batch 1, a speed-up that grows with b and saturates at the roofline's crossover."""

from __future__ import annotations

import math

import pytest

from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.cost.batching import (OpGroup, crossover_batch, decode_ledger, decode_speed, decode_speedups,
                                   decode_terms, device_roofs)
from tformer.cost.ledger import ledger
from tformer.cost.roofline import roofline
from tformer.cost.workload import Workload
from tformer.machine import Device

PEAK, BW = 1e12, 1e11  # ridge point 10 FLOP/B
TEXTBOOK = Device.from_roofs("toy", "custom", {"fp32": PEAK}, source="test", bandwidth=BW)
# A measured profile (matmul curve, STREAM, GEMV points): the roofline's measured model runs.
MEASURED = Device.from_roofs("toy-measured", "measured", {"fp32": PEAK}, source="test", bandwidth=BW,
                             matmul_curve={"fp32": [[64, 1e10], [1024, 5e11]]},
                             stream_bandwidth={"copy": 5e10, "triad": 6e10},
                             gemv_bandwidth={"fp32": [[1, 256, 4e10], [8, 256, 2e10]]}, call_overhead_s=2e-6)
TINY = ModelConfig(arch="decoder", n_layers=2, d_model=32, n_heads=4, d_ff=64, vocab_size=40, max_positions=64)
SMALL = ModelConfig(arch="decoder", n_layers=4, d_model=256, n_heads=4, d_ff=1024, vocab_size=512, max_positions=256)


@pytest.mark.parametrize("device", [TEXTBOOK, MEASURED], ids=["textbook", "measured"])
@pytest.mark.parametrize("context", [0, 8, 63])
def test_batch_one_is_the_ledgers_decode_prediction(device, context):
    step = Workload(phase="decode", batch=1, seq=context + 1, context=context)
    expected = roofline(ledger(TINY, step), device).time_s
    s = decode_speed(TINY, device, 1, context)
    assert s.seconds == expected
    assert s.tokens_per_s == 1 / expected
    rows = decode_speedups(TINY, device, [1, 4], context)
    assert rows[0]["speedup"] == 1.0 and rows[0]["seconds"] == expected


def test_hand_checked_group():
    # 1M fp32 weights (4 MB read once), 2 FLOPs per weight per row, no per-row bytes:
    # t(1) = max(2e6 / 1e12, 4e6 / 1e11) = 40 us; b* = 40 us / 2 us = 20.
    g = OpGroup(fixed_bytes=4_000_000, row_bytes=0, row_flops=2_000_000)
    assert g.seconds(1, PEAK, BW) == pytest.approx(4e-5, rel=1e-12)
    assert crossover_batch(g, PEAK, BW) == pytest.approx(20.0, rel=1e-12)
    assert g.seconds(20, PEAK, BW) == pytest.approx(4e-5, rel=1e-12)  # 20 tokens for the price of one
    assert g.seconds(40, PEAK, BW) == pytest.approx(8e-5, rel=1e-12)  # compute-bound: twice the time
    # Per-row bytes that outrun the FLOPs (R / bw >= F / peak): memory-bound at every batch.
    assert crossover_batch(OpGroup(4_000_000, 400, 2_000), PEAK, BW) is None


def test_terms_are_the_hand_counted_weights_flops_and_kv():
    t = decode_terms(TINY, 8)
    d, ff, v, layers = 32, 64, 40, 2
    weights = layers * (4 * d * d + 2 * d * ff) + v * d  # q, k, v, o, up, down; the tied head still reads its matrix
    biases = layers * (4 * d + ff + d)
    assert t.weights.fixed_bytes == 4 * (weights + biases)
    assert t.weights.row_flops == 2 * weights + biases  # a multiply-add per weight, an add per bias
    assert t.kv_bytes_per_row == layers * 2 * (8 + 1) * d * 4  # K and V of 9 positions, fp32
    # The one-roofline groups give the op-by-op prediction wherever no op sits near its own crossover.
    for b in (1, 2, 4, 64):
        assert t.step_seconds(b, PEAK, BW) == pytest.approx(decode_speed(TINY, TEXTBOOK, b, 8).seconds, rel=0.02)


def test_speedup_grows_then_saturates_at_the_crossover():
    context = 64
    peak, bw = device_roofs(TEXTBOOK)
    b_star = crossover_batch(decode_terms(SMALL, context).weights, peak, bw)
    assert 2 * 10 < b_star < 2 * 10 * 1.25  # about twice the ridge point (fp32: 4 bytes per 2 FLOPs)
    batches = [1, 2, 4, 8, 16, 32, 64, 128, 256, 1024]
    rows = {r["batch"]: r for r in decode_speedups(SMALL, TEXTBOOK, batches, context)}
    speedups = [rows[b]["speedup"] for b in batches]
    assert all(s2 >= s1 for s1, s2 in zip(speedups, speedups[1:]))
    assert all(rows[b]["speedup"] <= b for b in batches)
    assert rows[4]["speedup"] / rows[2]["speedup"] > 1.7  # below b*: nearly linear
    past = decode_speed(SMALL, TEXTBOOK, 2 * math.ceil(b_star), context).tokens_per_s
    assert rows[1024]["tokens_per_s"] / past < 1.01  # above: flat
    # Every weight matmul turns compute-bound between floor(b*) - 1 and ceil(b*) + 1, where the roofline says.
    for b, bound in ((math.floor(b_star) - 1, "memory"), (math.ceil(b_star) + 1, "compute")):
        lg = decode_ledger(SMALL, b, context)
        bounds = {t.bound for op, t in zip(lg.ops, roofline(lg, TEXTBOOK).ops) if op.dims and op.dims.weight}
        assert bounds == {bound}, b


def test_bad_input_and_unknown_roofs():
    with pytest.raises(TformerError, match="batch"):
        decode_speed(TINY, TEXTBOOK, 0, 8)
    with pytest.raises(TformerError, match="context"):
        decode_speed(TINY, TEXTBOOK, 1, -1)
    blind = Device.from_roofs("blind", "custom", {"fp32": None}, source="test", bandwidth=None)
    s = decode_speed(TINY, blind, 4, 8)
    assert s.seconds is None and s.tokens_per_s is None and s.bound == "unknown"
