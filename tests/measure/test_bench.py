"""The benchmark harness on tiny sizes, the saved profile, and the bench CLI."""

import json
import math
import os
import subprocess
import sys

import pytest
import torch

from tformer.machine import resolve_hardware
from tformer.core.errors import TformerError
from tformer.measure.bench import STREAM_ARRAYS, BenchResult, bench_matmul, bench_stream, run_bench, time_calls
from tformer.machine.profile_store import load_measured_device, load_profile, profile_path, save_profile


@pytest.fixture
def one_thread():
    # One thread: the figures do not hinge on a second BLAS thread being scheduled on a busy machine.
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


@pytest.fixture(scope="module")
def tiny_result():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return run_bench(quick=True, devices="cpu", dtypes=["fp32", "fp16"], sizes=[32, 64], reps=3)
    finally:
        torch.set_num_threads(prev)


def test_time_calls_excludes_warmup_and_counts():
    calls = []
    times, per_rep, one = time_calls(lambda: calls.append(1), lambda: None, reps=4, min_rep_s=0.001, warmup=3)
    assert len(times) == 4 and per_rep >= 1 and one > 0
    # warm-up (3) + the estimating loop (>=2) + 4 timed repetitions of per_rep calls each
    assert len(calls) >= 3 + 2 + 4 * per_rep


def test_matmul_point_is_sane_and_repeatable(one_thread):
    a, _ = bench_matmul("cpu", "fp32", 96, reps=3, min_rep_s=0.005)
    b, _ = bench_matmul("cpu", "fp32", 96, reps=3, min_rep_s=0.005)
    for p in (a, b):
        assert p.flops == 2 * 96**3
        assert p.min_s <= p.q1_s <= p.median_s <= p.q3_s <= p.max_s
        assert 1e8 < p.flops_per_s_best < 1e14 and math.isfinite(p.flops_per_s)
    # Best repetitions of two runs agree within a loose factor (a shared machine adds noise).
    ratio = a.flops_per_s_best / b.flops_per_s_best
    assert 1 / 4 < ratio < 4


def test_stream_counts_bytes_by_convention(one_thread):
    points = bench_stream("cpu", 1 << 18, reps=3, min_rep_s=0.002)
    assert [p.kernel for p in points] == ["copy", "scale", "add", "triad"]
    for p in points:
        assert p.bytes == STREAM_ARRAYS[p.kernel] * (1 << 18) * 4
        assert 1e8 < p.bytes_per_s < 1e13 and math.isfinite(p.bytes_per_s)


def test_run_bench_result(tiny_result):
    r = tiny_result
    assert r.devices and r.devices[0].device == "cpu"
    cpu = r.devices[0]
    assert {(p.dtype, p.n) for p in cpu.matmul} == {("fp32", 32), ("fp32", 64), ("fp16", 32), ("fp16", 64)}
    assert cpu.best_stream("copy").bytes_per_s > 0 and cpu.best_stream("triad").bytes_per_s > 0
    quantities = {c.quantity for c in cpu.comparisons}
    assert {"fp32 matmul", "copy bandwidth", "triad bandwidth"} <= quantities
    for c in cpu.comparisons:
        if c.theoretical:
            assert c.ratio == pytest.approx(c.measured / c.theoretical)
        assert c.reasons or c.ratio, c
    json.dumps(r.to_dict())


def test_run_bench_rejects_bad_input():
    with pytest.raises(TformerError, match="fp99"):
        run_bench(devices="cpu", dtypes=["fp99"])
    with pytest.raises(TformerError, match="device"):
        run_bench(devices="tpu")


def test_profile_round_trip(cache, tiny_result):
    path = save_profile(tiny_result)
    assert path.startswith(str(cache)) and os.path.isfile(path)
    assert [n for n in os.listdir(os.path.dirname(path)) if n.endswith(".tmp")] == []  # atomic: no leftovers
    again = load_profile(tiny_result.machine_key)
    assert again.to_dict() == BenchResult.from_dict(tiny_result.to_dict()).to_dict() == tiny_result.to_dict()
    dev = load_measured_device(tiny_result.machine_key)
    assert dev.kind == "measured"
    assert dev.peak("fp32") == tiny_result.devices[0].best_matmul("fp32").flops_per_s
    assert dev.bandwidth == tiny_result.devices[0].best_stream("triad").bytes_per_s
    assert "triad" in dev.source
    # resolve_hardware finds it by this machine's key.
    assert resolve_hardware("measured").peak("fp32") == dev.peak("fp32")


def test_corrupt_profile_is_a_clear_error(cache, tiny_result):
    path = profile_path(tiny_result.machine_key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as fh:
        fh.write("{half")
    with pytest.raises(TformerError, match="rerun"):
        load_profile(tiny_result.machine_key)


def test_no_profile_means_none(cache):
    assert load_measured_device() is None


def _main(capsys, *args):
    from tformer.cli import main

    rc = main(list(args))
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_cli_bench_json_custom_sweep_not_saved(cache, capsys):
    rc, out, err = _main(capsys, "bench", "--quick", "--json", "--device", "cpu", "--sizes", "32,64", "--reps", "2",
                         "--threads", "1")
    assert rc == 0, err
    data = json.loads(out)
    summary = data["summary"]["cpu"]
    assert summary["fp32_matmul_flops_per_s"] > 0 and summary["copy_bytes_per_s"] > 0
    assert data["profile_path"] is None  # a custom sweep is not the machine's profile


@pytest.mark.slow
def test_cli_bench_quick_saves_profile_and_is_fast(cache):
    # A real process, as a user runs it: the 30 s promise includes start-up.
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "COLUMNS": "200"}
    out = subprocess.run([sys.executable, "-m", "tformer", "bench", "--quick"], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "measured vs theoretical" in out.stdout and "saved as this machine's profile" in out.stdout
    assert float(out.stdout.split("took ")[1].split(" s")[0]) > 0  # its time is printed (a figure, not a test)
    saved = os.listdir(os.path.join(cache, "tformer", "profiles"))
    if torch.get_num_threads() > 1:  # the child runs with the same default: two paths to time
        assert "nn.Linear paths at decode's shapes" in out.stdout
        assert any(name.endswith(".paths.json") for name in saved)  # the split/plain timings, beside the profile
    assert any(name.endswith(".json") and not name.endswith(".paths.json") for name in saved)


@pytest.mark.parametrize("args", [["--sizes", "0"], ["--dtypes", "fp99"], ["--device", "tpu"], ["--reps", "0"],
                                  ["--threads", "0"]])
def test_cli_bench_bad_input(capsys, args):
    rc, out, err = _main(capsys, "bench", "--quick", *args)
    assert rc == 2
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
