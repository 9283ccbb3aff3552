"""Few-row (GEMV) weight-read bandwidth: measured by the bench, used by the roofline for decode matmuls."""

from __future__ import annotations

import json

import pytest
import torch

from tformer.core.errors import TformerError
from tformer.cost.ops import MatMul, Op
from tformer.cost.roofline import gemv_bandwidth_for, gemv_dims, measured_op_time, roofline
from tformer.machine import Device, device_from_dict
from tformer.machine.profile_store import PROFILE_VERSION, load_measured_device, profile_path
from tformer.measure.bench import BenchResult, bench_gemv

CURVE = {"fp32": [[32, 1e10], [4096, 5e10]]}
STREAM = {"copy": 8e9, "scale": 8e9, "add": 1e10, "triad": 1e10}
# 1 row: 5 GB/s at k = 768, 20 GB/s at k = 3072; 8 rows: 4 GB/s flat.
GEMV = {"fp32": [[1, 768, 5e9], [1, 3072, 2e10], [8, 768, 4e9], [8, 3072, 4e9]]}


def _device(gemv=None, overhead=3e-6):
    return Device("fake cpu", "measured", {"fp32": 5e10}, bandwidth=1e10, source="test", matmul_curve=CURVE,
                  stream_bandwidth=STREAM, call_overhead_s=overhead, gemv_bandwidth=gemv or {})


def _linear(rows, k=768, n=3072):
    flops = 2 * rows * k * n
    read = 4 * (rows * k + k * n + n)
    written = 4 * rows * n
    return Op(name="mlp.up", kind="ffn_up", layer=0, phase="forward", shapes=f"[{rows}, {k}] @ [{k}, {n}] + bias",
              dims=MatMul(1, rows, k, n, weight=True),
              matmul_flops=flops, bytes_read=read, bytes_written=written)


def test_gemv_dims_only_for_few_rows_with_a_weight():
    assert gemv_dims(_linear(1)) == (1, 768)
    assert gemv_dims(_linear(8)) == (8, 768)
    assert gemv_dims(_linear(9)) is None
    assert gemv_dims(_linear(8192)) is None
    bmm = Op(name="attn.scores", kind="scores", layer=0, phase="forward", shapes="[1, 12, 1, 64] @ [1, 12, 64, 513]",
             dims=MatMul(12, 1, 64, 513),
             matmul_flops=10, bytes_read=10, bytes_written=1)
    assert gemv_dims(bmm) is None  # a batched product over the KV cache, not a weight GEMV


def test_batch_one_matmul_is_bytes_over_gemv_bandwidth_plus_overhead():
    op = _linear(1)
    with_gemv, without = _device(GEMV), _device()
    t, bound, _ = measured_op_time(op, with_gemv, "fp32", 5e10)
    assert bound == "memory"
    assert t == pytest.approx(op.bytes / 5e9 + 3e-6)  # k = 768: the 1-row point
    t_old, _, _ = measured_op_time(op, without, "fp32", 5e10)
    assert t_old == pytest.approx(op.bytes / 1e10 + 3e-6)  # no GEMV measured: STREAM triad, as before
    # k between measured points: interpolated in log k (k = 1536 is halfway between 768 and 3072).
    mid = _linear(1, k=1536)
    t_mid, _, _ = measured_op_time(mid, with_gemv, "fp32", 5e10)
    assert t_mid == pytest.approx(mid.bytes / 1.25e10 + 3e-6)
    # 2..8 rows use the 8-row points.
    four = _linear(4)
    t4, _, _ = measured_op_time(four, with_gemv, "fp32", 5e10)
    assert t4 == pytest.approx(four.bytes / 4e9 + 3e-6)


def test_large_batch_matmul_is_unchanged_and_roofline_notes_the_source():
    big = _linear(8192)
    a = measured_op_time(big, _device(GEMV), "fp32", 5e10)
    b = measured_op_time(big, _device(), "fp32", 5e10)
    assert a == b
    # Through roofline(): a ledger with one of each; only the one-row op changes.
    from types import SimpleNamespace

    ledger = SimpleNamespace(workload=SimpleNamespace(dtype="fp32"), ops=[_linear(1), big])
    new, old = roofline(ledger, _device(GEMV)), roofline(ledger, _device())
    assert new.ops[1].time_s == old.ops[1].time_s
    assert new.ops[0].time_s == pytest.approx(_linear(1).bytes / 5e9 + 3e-6)
    assert "GEMV" in new.model and "5.0 GB/s at 1 row k=768" in new.model
    assert "no GEMV bandwidth measured" in old.model
    # A dtype with no GEMV measurement falls back to STREAM.
    assert _device(GEMV).gemv_rate("bf16", 1, 768) is None
    assert _device(GEMV).gemv_rate("fp32", 16, 768) is None  # above every measured row count


def test_device_from_dict_reads_and_checks_gemv_bandwidth():
    spec = {"name": "x", "kind": "measured", "peak_fp32": 1e11, "bandwidth": 1e10, "gemv_bandwidth": GEMV}
    dev = device_from_dict(spec)
    assert dev.gemv_rate("fp32", 1, 768) == 5e9
    assert device_from_dict({"peak_fp32": 1e11, "bandwidth": 1e10}).gemv_bandwidth == {}
    with pytest.raises(TformerError, match="gemv_bandwidth"):
        device_from_dict({**spec, "gemv_bandwidth": {"fp32": [[1, 768]]}})
    with pytest.raises(TformerError, match="gemv_bandwidth"):
        device_from_dict({**spec, "gemv_bandwidth": {"fp99": []}})


def test_bench_gemv_counts_weight_bytes():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        p = bench_gemv("cpu", "fp32", 256, 128, rows=1, reps=3, min_rep_s=0.002, count=3)
    finally:
        torch.set_num_threads(prev)
    assert p.weight_bytes == 256 * 128 * 4 and p.rows == 1 and p.k == 128
    assert p.bytes_per_s == pytest.approx(p.weight_bytes / p.median_s)
    assert p.min_s <= p.median_s <= p.max_s


def _old_profile():
    """A profile as saved before GEMV points existed: no "gemv" key."""
    return {"machine_key": "old-machine", "created": "2024-01-01T00:00:00+00:00", "quick": True,
            "torch_version": "t", "wall_s": 1.0, "devices": [{
                "device": "cpu", "name": "old cpu", "threads": 2, "memory_bytes": 2**30,
                "matmul": [{"device": "cpu", "dtype": "fp32", "n": 64, "flops": 2 * 64**3, "median_s": 1e-4,
                            "min_s": 1e-4, "max_s": 1e-4, "q1_s": 1e-4, "q3_s": 1e-4, "reps": 3,
                            "calls_per_rep": 10, "flops_per_s": 2 * 64**3 / 1e-4, "flops_per_s_best": 2 * 64**3 / 1e-4}],
                "stream": [{"device": "cpu", "kernel": "triad", "elements": 10, "element_bytes": 4, "bytes": 120,
                            "median_s": 1e-8, "min_s": 1e-8, "max_s": 1e-8, "q1_s": 1e-8, "q3_s": 1e-8, "reps": 3,
                            "calls_per_rep": 10, "bytes_per_s": 1.2e10, "bytes_per_s_best": 1.2e10}],
                "skipped": [], "comparisons": []}]}


def test_profile_without_gemv_still_loads(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = profile_path("old-machine")
    import os

    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        json.dump({"version": PROFILE_VERSION, "result": _old_profile()}, fh)
    dev = load_measured_device("old-machine")
    assert dev.gemv_bandwidth == {} and dev.bandwidth == 1.2e10
    assert dev.gemv_rate("fp32", 1, 768) is None
    # A new result round-trips its GEMV points into the Device.
    data = _old_profile()
    data["devices"][0]["gemv"] = [{"device": "cpu", "dtype": "fp32", "rows": 1, "n": 10, "k": 768,
                                   "weight_bytes": 30720, "median_s": 1e-6, "min_s": 1e-6, "max_s": 1e-6,
                                   "q1_s": 1e-6, "q3_s": 1e-6, "reps": 3, "calls_per_rep": 5,
                                   "bytes_per_s": 3.072e10, "bytes_per_s_best": 3.072e10}]
    dev = BenchResult.from_dict(data).to_device("cpu")
    assert dev.gemv_bandwidth == {"fp32": [[1, 768, 3.072e10]]}


def test_a_kept_matrix_reads_at_the_block_kernel_s_measured_rate():
    """An op whose weights are kept in a block layout reads at that layout's measured rate (the block kernel's);
    a layout nobody measured, and a float op, read at the float rate; the roofline's note says which."""
    from dataclasses import replace
    from types import SimpleNamespace

    gemv = {**GEMV, "q4_1": [[1, 768, 2.5e9], [8, 768, 1e9]]}
    kept, other, plain = replace(_linear(1), weight_layout="q4_1"), replace(_linear(1), weight_layout="q6_k"), _linear(1)
    dev = _device(gemv)
    assert measured_op_time(kept, dev, "fp32", 5e10)[0] == pytest.approx(kept.bytes / 2.5e9 + 3e-6)
    assert measured_op_time(other, dev, "fp32", 5e10)[0] == pytest.approx(other.bytes / 5e9 + 3e-6)
    assert measured_op_time(plain, dev, "fp32", 5e10)[0] == pytest.approx(plain.bytes / 5e9 + 3e-6)
    eight = replace(_linear(8), weight_layout="q4_1")
    assert measured_op_time(eight, dev, "fp32", 5e10)[0] == pytest.approx(eight.bytes / 1e9 + 3e-6)
    model = roofline(SimpleNamespace(workload=SimpleNamespace(dtype="fp32"), ops=[kept, other]), dev).model
    assert "q4_1 blocks at the block kernel's measured rate" in model and "q6_k blocks at the float rate" in model
    spec = {"name": "x", "kind": "measured", "peak_fp32": 1e11, "bandwidth": 1e10, "gemv_bandwidth": gemv}
    assert device_from_dict(spec).gemv_rate("q4_1", 1, 768) == 2.5e9  # a device file may carry them too


def test_the_ledger_marks_each_weight_product_with_its_layout():
    from tformer.core.config import ModelConfig
    from tformer.cost.ledger import Workload, ledger

    config = ModelConfig(arch="decoder", position="rope", norm="rmsnorm", activation="silu", gated_mlp=True, n_layers=2,
                         d_model=256, n_heads=4, d_ff=512, vocab_size=512, quantize="mixed",
                         quantize_layers=["q:q8_0,k:q4_1,v:q5_0,o:q8_0,gate:q4_1,up:q5_0,down:q4_k"] * 2)
    ops = ledger(config, Workload(phase="decode", batch=1, seq=9, context=8)).ops
    layouts = {op.name.rsplit(".", 1)[-1]: op.weight_layout for op in ops if op.dims is not None and op.dims.weight}
    assert (layouts["q_proj"], layouts["k_proj"], layouts["v_proj"]) == ("q8_0", "q4_1", "q5_0")
    assert (layouts["down"], layouts["gate"], layouts["up"]) == ("q4_k", "q4_1", "q5_0")
    assert all(op.weight_layout == "" for op in ops if op.dims is None or not op.dims.weight)


def test_bench_measures_the_block_kernel_per_layout():
    from tformer.measure.bench import bench_gemv_blocks
    from tformer.model import ggml_kernel

    if not ggml_kernel.available():
        pytest.skip("the block kernel is not built (no C compiler)")
    p = bench_gemv_blocks("q4_k", 64, 512, rows=1, reps=3, min_rep_s=0.002, count=2)
    assert p.dtype == "q4_k" and p.weight_bytes == 64 * 2 * 144 and p.k == 512
    assert p.bytes_per_s == pytest.approx(p.weight_bytes / p.median_s)


def test_a_block_kernel_call_costs_a_fixed_time_plus_its_bytes():
    """Device.call_rate fits t = fixed + bytes / rate on the layout's square-W points, so a small matrix reads far
    below a large one's rate (as the kernel does: dispatch, activation rounding and waking its threads per call)."""
    fixed, rate, per_weight = 5e-6, 25e9, 20 / 32  # q4_1: 20 bytes per 32 weights
    points = [[1, k, (k * k * per_weight) / (fixed + k * k * per_weight / rate)] for k in (256, 768, 2048, 4096)]
    points += [[8, k, bw / 4] for _, k, bw in points]
    dev = _device({**GEMV, "q4_1": points})
    for nbytes in (40_000, 207_360, 5_000_000):
        assert dev.call_rate("q4_1", 1, nbytes) == pytest.approx(nbytes / (fixed + nbytes / rate), rel=1e-6)
    assert dev.call_rate("q4_1", 1, 40_000) < 0.35 * dev.call_rate("q4_1", 1, 5_000_000)
    assert dev.call_rate("q4_1", 8, 207_360) == pytest.approx(dev.call_rate("q4_1", 1, 207_360) / 4, rel=1e-6)
    assert dev.call_rate("fp32", 1, 207_360) is None and dev.call_rate("q6_k", 1, 207_360) is None
    # an op kept in q4_1 reads at its own size's rate in the roofline
    from dataclasses import replace
    op = replace(_linear(1, k=576, n=192), weight_layout="q4_1", weight_bytes=576 * 192 * 20 // 32)
    assert measured_op_time(op, dev, "fp32", 5e10)[0] == pytest.approx(
        op.bytes / dev.call_rate("q4_1", 1, op.weight_bytes) + 3e-6)


def test_linears_that_read_one_input_are_priced_as_one_kernel_call():
    """q, k, v (and gate, up) in one repacked block format run as one block-kernel product (model/stacked_products):
    the ledger marks each with that product's bytes and the roofline charges the call's fixed cost once."""
    from dataclasses import replace

    from tformer.core.config import ModelConfig
    from tformer.cost.ledger import Workload, ledger

    def ops_of(**kw):
        config = ModelConfig(arch="decoder", position="rope", norm="rmsnorm", activation="silu", gated_mlp=True,
                             n_layers=2, d_model=256, n_heads=4, n_kv_heads=2, d_ff=512, vocab_size=512, **kw)
        return {op.name: op for op in ledger(config, Workload(phase="decode", batch=1, seq=9, context=8)).ops}

    ops = ops_of(quantize="q4_1")
    qkv = [ops[f"decoder.layers.0.attn.{n}_proj"] for n in "qkv"]
    gate_up = [ops["decoder.layers.0.mlp.gate"], ops["decoder.layers.0.mlp.up"]]
    assert {op.stack_bytes for op in qkv} == {sum(op.weight_bytes for op in qkv)}
    assert {op.stack_bytes for op in gate_up} == {sum(op.weight_bytes for op in gate_up)}
    assert ops["decoder.layers.0.attn.o_proj"].stack_bytes == ops["decoder.layers.0.mlp.down"].stack_bytes == 0
    # three formats, a K-quant, or float: each its own call
    mixed = ops_of(quantize="mixed", quantize_layers=["q:q8_0,k:q4_1,v:q5_0,gate:q4_k,up:q4_k"] * 2)
    assert all(op.stack_bytes == 0 for op in mixed.values())
    assert all(op.stack_bytes == 0 for op in ops_of().values())
    fixed, rate, per_weight = 5e-6, 25e9, 20 / 32
    points = [[1, k, (k * k * per_weight) / (fixed + k * k * per_weight / rate)] for k in (256, 768, 2048, 4096)]
    dev = _device({**GEMV, "q4_1": points})
    weights = sum(op.weight_bytes for op in qkv)
    together = sum(op.weight_bytes / gemv_bandwidth_for(op, dev, "fp32") for op in qkv)
    alone = sum(op.weight_bytes / gemv_bandwidth_for(replace(op, stack_bytes=0), dev, "fp32") for op in qkv)
    assert together == pytest.approx(fixed + weights / rate, rel=1e-6)  # one call: its fixed cost once
    assert alone == pytest.approx(3 * fixed + weights / rate, rel=1e-6)
