"""tformer profile: measured FLOPs equal the ledger's, rows line up with ledger ops, JSON and CLI, errors.

Tiny configs on the CPU; a fake measured profile is saved in a temporary cache so no test runs the real
bench, and detection is stubbed (the theoretical peak is then "unknown", which is itself checked).
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from tformer.cli import main
from tformer.core.config import preset, preset_names
from tformer.machine import Device
from tformer.cost.ledger import Workload, ledger
from tformer.cost.roofline import roofline
from tformer.measure.bench import BenchResult, DeviceBench, MatmulPoint, StreamPoint
from tformer.measure.profile import profile_model
from tformer.measure.step import skeleton

TINY = ["n_layers=2", "d_model=32", "n_heads=2", "d_ff=64", "vocab_size=40", "max_positions=32"]
FAKE = Device("fake cpu", "measured", {"fp32": 5e10}, bandwidth=1e10, source="test",
              matmul_curve={"fp32": [[32, 1e10], [256, 5e10]]}, stream_bandwidth={"copy": 8e9, "triad": 1e10},
              call_overhead_s=2e-6)


def tiny(arch="decoder", **extra):
    over = list(TINY) + [f"{k}={v}" for k, v in extra.items()]
    if arch == "encoder":
        return preset("bert-base").with_overrides(over + ["type_vocab_size=2"])
    if arch == "encoder-decoder":
        return preset("bart-base").with_overrides(over + ["n_decoder_layers=1"])
    return preset("char-small").with_overrides(over)


def _point(n, rate):
    t = 2 * n**3 / rate
    return MatmulPoint(device="cpu", dtype="fp32", n=n, flops=2 * n**3, median_s=t, min_s=t, max_s=t, q1_s=t, q3_s=t,
                       reps=3, calls_per_rep=1, flops_per_s=rate, flops_per_s_best=rate)


def _stream(kernel, bw):
    nbytes = 3 * 4 * 1000 if kernel in ("add", "triad") else 2 * 4 * 1000
    t = nbytes / bw
    return StreamPoint(device="cpu", kernel=kernel, elements=1000, element_bytes=4, bytes=nbytes, median_s=t, min_s=t,
                       max_s=t, q1_s=t, q3_s=t, reps=3, calls_per_rep=1, bytes_per_s=bw, bytes_per_s_best=bw)


@pytest.fixture
def saved_profile(tmp_path, monkeypatch):
    """A fake measured profile in a temporary cache; machine detection stubbed out."""
    from tformer.machine import profile_store, specs
    from tformer.machine.profile_store import save_profile

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(profile_store, "machine_key", lambda specs=None: "test-machine")

    def no_detect(*_a, **_k):
        raise RuntimeError("detection stubbed in tests")

    monkeypatch.setattr(specs, "detect", no_detect)
    result = BenchResult(machine_key="test-machine", created="2024-01-01T00:00:00+00:00", quick=True,
                         torch_version="test", wall_s=0.1,
                         devices=[DeviceBench(device="cpu", name="fake cpu", threads=1,
                                              matmul=[_point(32, 1e10), _point(256, 5e10)],
                                              stream=[_stream(k, 1e10) for k in ("copy", "scale", "add", "triad")])])
    save_profile(result)
    return result


# The prediction model ------------------------------------------------------------------------------------
def test_matmul_rate_interpolates_in_log_size_and_clamps():
    assert FAKE.matmul_rate("fp32", 8, 8, 8) == 1e10  # below the curve: its first point
    assert FAKE.matmul_rate("fp32", 4096, 4096, 4096) == 5e10  # above: its last point
    mid = FAKE.matmul_rate("fp32", 90, 91, 92)  # cube root ~91, between 32 and 256
    assert 1e10 < mid < 5e10
    assert FAKE.matmul_rate("bf16", 64, 64, 64) is None


def test_every_ledger_matmul_carries_its_dims():
    lg = ledger(tiny(), Workload(phase="forward", batch=2, seq=8))
    for op in lg.ops:
        if op.matmul_flops:
            batch, m, k, n, _ = op.dims
            assert 2 * batch * m * n * k == op.matmul_flops == op.dims.flops, op.name


def test_measured_roofline_is_slower_than_the_single_peak_and_keeps_totals_consistent():
    lg = ledger(tiny(), Workload(phase="train", batch=2, seq=8))
    plain = roofline(lg, FAKE, model="peak")
    measured = roofline(lg, FAKE)
    assert measured.time_s > plain.time_s  # small matmuls below peak, plus the per-op overhead
    assert measured.time_s == pytest.approx(sum(o.time_s for o in measured.ops))
    assert "measured roofline" in measured.model


# The profile ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("arch,phase", [("decoder", "forward"), ("decoder", "train"), ("encoder", "forward"),
                                        ("encoder", "train"), ("encoder-decoder", "forward"),
                                        ("encoder-decoder", "train")])
def test_measured_flops_equal_ledger_and_rows_line_up(arch, phase):
    config = tiny(arch)
    w = Workload(phase=phase, batch=2, seq=6)
    r = profile_model(config, w, hardware=FAKE, steps=1, warmup=0)
    lg = ledger(config, w)
    assert r.measured_flops == lg.flops["matmul"] and r.flops_match
    # Per-row FLOPs add up to the total, and each row's measured FLOPs equal the ledger's for what it covers.
    assert sum(row.measured_flops for row in r.ops) == r.measured_flops
    for row in r.ops:
        assert row.measured_flops == row.ledger_matmul_flops, (row.phase, row.covers)
    names = {op.name for op in lg.ops}
    assert {row.name for row in r.ops} <= names
    assert {c for row in r.ops for c in row.covers} <= names
    # Every op kind the profile measures has a positive time, and each ledger op is covered once per phase.
    assert all(row.measured_s > 0 for row in r.ops)
    for ph in {op.phase for op in lg.ops}:
        covered = [c for row in r.ops if row.phase == ph for c in row.covers]
        assert sorted(covered) == sorted(op.name for op in lg.select(phase=ph))


def test_decode_and_prefill_run_and_match_ledger():
    config = tiny()
    for w in (Workload(phase="decode", batch=2, seq=8, context=5), Workload(phase="prefill", batch=2, seq=8)):
        r = profile_model(config, w, hardware=FAKE, steps=2, warmup=1)
        assert r.measured_flops == ledger(config, w).flops["matmul"]
        assert r.step.measured_s > 0 and isinstance(r.step.predicted_s, float)
        assert r.tokens == (2 if w.phase == "decode" else 16)


@pytest.mark.parametrize("name", preset_names())
def test_skeleton_has_the_full_models_ops_at_negligible_size(name):
    config = preset(name)
    seq = min(64, config.max_positions)  # clip-digits' text tower holds 32 positions
    phases = [Workload(phase="train", batch=8, seq=seq), Workload(phase="forward", batch=8, seq=seq)]
    if "decode" in config.traits.phases:
        phases.append(Workload(phase="decode", batch=4, seq=seq, context=seq - 1))
    for w in phases:
        small, work = skeleton(config, w)
        full, skel = ledger(config, w), ledger(small, work)
        assert [(o.name, o.kind, o.phase) for o in skel.ops] == [(o.name, o.kind, o.phase) for o in full.ops]
        assert small.head_dim == 8 and work.batch == 1 and work.seq <= 16
        # The digits presets are themselves small (0.26 GFLOP a step): their skeleton is 1/46 of it, not 1/50.
        assert skel.flops["total"] < full.flops["total"] / (50 if full.flops["total"] > 1e9 else 20)


def test_result_json_has_step_times_tokens_per_second_and_mfu():
    r = profile_model(tiny(), Workload(phase="train", batch=2, seq=8), hardware=FAKE, steps=2, warmup=1)
    d = json.loads(json.dumps(r.to_dict()))
    assert d["step_time_s"]["measured"] == r.step.measured_s > 0
    # On a CPU the per-op fixed cost is measured on the model's skeleton and replaces the device's.
    assert r.call_overhead_s > 0 and r.call_overhead_s != FAKE.call_overhead_s
    assert any("skeleton" in n for n in r.notes)
    calibrated = replace(FAKE, call_overhead_s=r.call_overhead_s)
    assert d["step_time_s"]["predicted"] == pytest.approx(roofline(ledger(tiny(), Workload(phase="train", batch=2, seq=8)),
                                                                   calibrated).time_s)
    assert d["step_time_s"]["ratio"] == pytest.approx(d["step_time_s"]["predicted"] / d["step_time_s"]["measured"])
    assert d["tokens_per_s"] == pytest.approx(16 / r.step.measured_s)
    assert d["mfu"] == pytest.approx(r.utilization.model_flops / r.step.measured_s / 5e10)
    assert d["utilization"]["hfu_measured"] == d["mfu"]  # nothing recomputed
    assert [p["phase"] for p in d["phases"]] == ["train", "prefill", "decode"]
    assert d["phases"][0]["measured_mfu"] == d["mfu"]


# The command ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("phase", ["forward", "train", "decode"])
def test_cli_json_on_a_tiny_config(saved_profile, capsys, phase):
    args = ["profile"] + sum((["--set", s] for s in TINY), []) + ["--phase", phase, "--batch", "2", "--seq", "8",
                                                                  "--steps", "1", "--warmup", "0", "--json"]
    assert main(args) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["step_time_s"]["measured"] > 0 and d["step_time_s"]["predicted"] > 0
    assert d["hardware"].startswith("measured fake cpu")
    assert d["utilization"]["theoretical_peak"] is None  # detection unavailable: unknown, not guessed
    assert d["mfu"] == pytest.approx(d["utilization"]["model_flops"] / d["step_time_s"]["measured"] / 5e10)
    assert d["flops_match"]


def test_cli_human_output_with_ops(saved_profile, capsys):
    args = ["profile"] + sum((["--set", s] for s in TINY), []) + ["--phase", "train", "--batch", "2", "--seq", "8",
                                                                  "--steps", "1", "--warmup", "0", "--ops"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "ratio predicted/measured" in out and "MFU" in out and "training vs inference" in out
    assert "+softmax" in out and "peak memory" in out


def test_cli_runs_a_quick_bench_when_no_profile_is_saved(tmp_path, monkeypatch, capsys):
    """No saved profile: the command benches first (stubbed here) and says so."""
    from tformer.machine import profile_store
    from tformer.measure import profile

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(profile_store, "machine_key", lambda specs=None: "test-machine")
    calls = []

    def fake_bench(quick=True, devices=None, **_):
        calls.append((quick, devices))
        return BenchResult(machine_key="test-machine", created="now", quick=True, torch_version="t", wall_s=0.0,
                           devices=[DeviceBench(device="cpu", name="fake cpu", matmul=[_point(64, 2e10)],
                                                stream=[_stream("triad", 1e10)])])

    monkeypatch.setattr(profile, "run_bench", fake_bench)  # the name the profile command calls
    args = ["profile"] + sum((["--set", s] for s in TINY), []) + ["--phase", "forward", "--batch", "1", "--seq", "4",
                                                                  "--steps", "1", "--warmup", "0"]
    assert main(args) == 0
    assert calls == [(True, "cpu")]
    assert "ran a quick bench" in capsys.readouterr().out
    assert profile_store.load_profile() is not None  # and saved it


@pytest.mark.parametrize("extra,needle", [
    (["--preset", "bert-base", "--phase", "decode"], "encoder-only"),
    (["--preset", "no-such-model"], "no-such-model"),
    (["--batch", "0"], "batch"),
    (["--seq", "4096"], "max_positions"),
])
def test_bad_input_is_one_line_exit_2(saved_profile, capsys, extra, needle):
    assert main(["profile", *extra, "--steps", "1", "--warmup", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and needle in err and "Traceback" not in err
