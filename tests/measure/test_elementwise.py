"""Element-wise kernels measured by the bench (add, gelu, layer_norm, softmax) and used by the roofline
for the ops that run them, in place of STREAM's bandwidth."""

from __future__ import annotations

import pytest

from tformer.cost.ops import Op
from tformer.cost.roofline import ELEMENTWISE_KERNEL, elementwise_bandwidth_for, measured_op_time
from tformer.machine import Device
from tformer.machine.bench_records import BenchResult, DeviceBench
from tformer.measure.bench import ELEMENTWISE_ARRAYS, bench_elementwise

STREAM = {"copy": 2e10, "scale": 2e10, "add": 2e10, "triad": 2e10}
# gelu: 4 GB/s at 64k outputs, 16 GB/s at 4M (log-interpolated between); layer_norm: 10 GB/s flat.
ELEMENTWISE = {"gelu": [[65536, 4e9], [4194304, 1.6e10]], "layer_norm": [[65536, 1e10]]}


def _device(elementwise=None):
    return Device("fake cpu", "measured", {"fp32": 5e10}, bandwidth=2e10, source="test",
                  matmul_curve={"fp32": [[32, 1e10], [4096, 5e10]]}, stream_bandwidth=STREAM, call_overhead_s=0.0,
                  elementwise_bandwidth=elementwise or {})


def _op(kind, elements, arrays=2):
    return Op(name=f"mlp.{kind}", kind=kind, layer=0, phase="forward", shapes=f"[{elements}]",
              other_flops=elements, bytes_read=4 * elements * (arrays - 1), bytes_written=4 * elements)


def test_an_op_runs_at_its_kernel_s_measured_rate_at_its_size():
    dev = _device(ELEMENTWISE)
    small, mid = _op("activation", 65536), _op("activation", 524288)
    assert elementwise_bandwidth_for(small, dev, "fp32") == pytest.approx(4e9)
    assert elementwise_bandwidth_for(mid, dev, "fp32") == pytest.approx(1e10)  # halfway in log size
    t, bound, _ = measured_op_time(small, dev, "fp32", 5e10)
    assert bound == "memory" and t == pytest.approx(small.bytes / 4e9)
    norm = _op("norm", 1 << 20)
    assert measured_op_time(norm, dev, "fp32", 5e10)[0] == pytest.approx(norm.bytes / 1e10)


def test_stream_stands_where_the_kernel_was_not_measured_or_the_op_is_no_element_wise_kernel():
    op = _op("activation", 65536)
    assert elementwise_bandwidth_for(op, _device(), "fp32") is None
    assert measured_op_time(op, _device(), "fp32", 5e10)[0] == pytest.approx(op.bytes / 2e10)
    assert elementwise_bandwidth_for(_op("residual", 65536, 3), _device(ELEMENTWISE), "fp32") is None  # add unmeasured
    assert elementwise_bandwidth_for(_op("loss", 65536), _device(ELEMENTWISE), "fp32") is None
    assert elementwise_bandwidth_for(op, _device(ELEMENTWISE), "bf16") is None  # measured in fp32 only
    assert set(ELEMENTWISE_KERNEL.values()) <= set(ELEMENTWISE_ARRAYS)


def test_the_bench_measures_each_kernel_with_the_ledger_s_byte_convention_and_the_profile_carries_it():
    points = bench_elementwise("cpu", 64, 96, reps=2, min_rep_s=0.001)
    assert [p.kernel for p in points] == ["add", "gelu", "layer_norm", "softmax"]
    for p in points:
        assert p.elements == 64 * 96 and p.bytes == ELEMENTWISE_ARRAYS[p.kernel] * 64 * 96 * 4
        assert p.bytes_per_s == pytest.approx(p.bytes / p.median_s)
    result = BenchResult(machine_key="k", created="today", quick=True, torch_version="x", wall_s=1.0,
                         devices=[DeviceBench(device="cpu", name="cpu", elementwise=points)])
    device = BenchResult.from_dict(result.to_dict()).to_device("cpu")
    assert device.elementwise_rate("gelu", 64 * 96) == pytest.approx(points[1].bytes_per_s)
    assert device.elementwise_rate("gelu", 10) == pytest.approx(points[1].bytes_per_s)  # flat below the sweep
