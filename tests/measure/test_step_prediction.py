"""The decode step predicted in named terms (tformer.measure.step_prediction): weight products at the measured GEMV
rate of their layout, the other ops at their measured rates, a fixed cost per ledger op (compiled: the profile's
per-call cost; eager: the framework glue timed on the skeleton, or given)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tformer.core.config import ModelConfig
from tformer.cost.ledger import Workload, ledger
from tformer.cost.roofline import roofline
from tformer.machine import Device
from tformer.measure.step_prediction import predict_decode_step

CURVE = {"fp32": [[32, 1e10], [4096, 5e10]]}
STREAM = {"copy": 8e9, "scale": 8e9, "add": 1e10, "triad": 1e10}
GEMV = {"fp32": [[1, 256, 8e9], [1, 1024, 2e10], [8, 256, 4e9]], "q4_1": [[1, 256, 4e9], [1, 1024, 1e10]]}


def _config(**kw):
    return ModelConfig(arch="decoder", position="rope", norm="rmsnorm", activation="silu", gated_mlp=True, n_layers=2,
                       d_model=256, n_heads=4, n_kv_heads=2, d_ff=512, vocab_size=512, max_positions=128, **kw)


def _device(overhead=4e-6):
    return Device("fake cpu", "measured", {"fp32": 5e10}, bandwidth=1e10, source="test", matmul_curve=CURVE,
                  stream_bandwidth=STREAM, call_overhead_s=overhead, gemv_bandwidth=GEMV)


def test_compiled_terms_add_up_to_the_roofline_with_the_per_call_cost():
    config, device = _config(), _device()
    p = predict_decode_step(config, device, compiled=True, context=64)
    book = ledger(config, Workload(phase="decode", batch=1, seq=65, context=64))
    assert p.n_ops == len(book.ops) and p.per_op_s == 4e-6
    # the three terms are the measured roofline with its per-call cost, split by what each op is
    assert p.step_s == pytest.approx(roofline(book, device).time_s)
    weights = [op for op in book.ops if op.matmul_flops and op.weight_bytes]
    bare = roofline(book, replace(device, call_overhead_s=None))
    assert p.products_s == pytest.approx(sum(t.time_s for op, t in zip(book.ops, bare.ops) if op in weights))
    assert 0 < p.others_s < p.products_s and p.bytes_read == sum(op.bytes_read for op in book.ops)
    attention = [op for op in book.ops if op.kind in ("scores", "softmax", "context")]
    assert p.attention_s == pytest.approx(sum(t.time_s for op, t in zip(book.ops, bare.ops) if op in attention))


def test_kept_blocks_read_at_their_layout_s_rate_and_eager_glue_is_taken_as_given():
    device = _device()
    fp32 = predict_decode_step(_config(), device, compiled=False, glue=(2e-5, "given"))
    kept = predict_decode_step(_config(quantize="q4_1"), device, compiled=False, glue=(2e-5, "given"))
    assert fp32.per_op_s == kept.per_op_s == 2e-5 and fp32.how == "given"
    assert fp32.fixed_s == pytest.approx(fp32.n_ops * 2e-5)
    assert kept.bytes_read < fp32.bytes_read / 3  # 20 bytes per 32 weights against 4 per weight
    assert kept.products_s < fp32.products_s


def test_eager_glue_is_measured_on_the_skeleton_when_not_given():
    p = predict_decode_step(_config(), _device(), compiled=False, context=8)
    assert p.per_op_s > 0 and "skeleton" in p.how


def test_a_device_without_measured_roofs_is_refused():
    bare = Device("unknown", "spec", {}, bandwidth=None, source="test")
    with pytest.raises(ValueError, match="no measured roofs"):
        predict_decode_step(_config(), bare, compiled=True)


def test_row_exact_attention_is_the_routine_timed_at_the_model_s_heads(monkeypatch):
    from tformer.measure import step_prediction
    from tformer.model import ggml_kernel

    if not ggml_kernel.available():
        pytest.skip(ggml_kernel.unavailable_reason())
    config = _config()
    one = step_prediction.row_exact_call_s(config, 64)
    assert 1e-7 < one < 1e-2  # one decode query's C call: microseconds
    monkeypatch.setattr(step_prediction, "row_exact_call_s", lambda c, context: 3e-5 if c is config else None)
    p = predict_decode_step(config, _device(), compiled=True, context=64, row_exact=True)
    plain = predict_decode_step(config, _device(), compiled=True, context=64)
    assert p.attention_s == pytest.approx(config.n_layers * 3e-5)  # one call per layer, in place of the roofline's
    assert (p.products_s, p.others_s, p.fixed_s) == (plain.products_s, plain.others_s, plain.fixed_s)
