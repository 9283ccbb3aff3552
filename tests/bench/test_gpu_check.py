"""bench/gpu_check.sh end to end in its smoke mode (the CPU, tiny sizes): it writes one dated record,
named by device, whose parts either ran or say why they were skipped; and bench/gpu_record.py's
readers of pytest's summary and of a part's status."""

from __future__ import annotations

import datetime
import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from tformer.machine.profile_store import save_profile

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "gpu_check.sh"


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


record_mod = _load(ROOT / "bench" / "gpu_record.py", "bench_gpu_record")
# The report tests' made-up measured profile: the smoke report then never benchmarks this machine.
report_fakes = _load(ROOT / "tests" / "report" / "test_report.py", "report_fakes")


@pytest.fixture
def smoke(tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    save_profile(report_fakes.fake_bench())
    results = tmp_path / "results"
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    env.pop("TFORMER_TEST_DEVICE", None)  # the smoke run picks the CPU itself
    proc = subprocess.run(["bash", str(SCRIPT), "--smoke", "--results", str(results)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=900)
    return proc, results


@pytest.mark.slow
def test_smoke_run_writes_a_dated_device_named_record(smoke):
    proc, results = smoke
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    files = sorted(results.glob("*.json"))
    assert len(files) == 1 and files[0].name.startswith("smoke-"), files
    doc = json.loads(files[0].read_text())
    check, machine = doc["gpu_check"], doc["machine"]
    assert check["mode"] == "smoke" and check["torch_device"] == "cpu"
    assert check["device"] == machine["cpu"] and machine["gpu"] is None  # labelled with the device
    assert datetime.date.fromisoformat(check["date"]) <= datetime.date.today()
    # 1. the suite ran on the device and its summary line was kept (tests/gpu skips without CUDA)
    assert check["tests"]["rc"] == 0 and "skipped" in check["tests"]["summary"], check["tests"]
    # 2, 3. the benches ran or name the flags they lack; never a failure
    for part in ("train", "decode"):
        assert "error" not in check[part], check[part]
        assert "data" in check[part] or "has no --" in check[part]["skipped"]
    # 4. the report's predicted and measured step, and the device's roofs, from its report.json
    rep = check["report"]
    assert rep["step_time_s"]["predicted"] > 0 and rep["step_time_s"]["measured"] > 0
    assert rep["gpu"]["name"] == report_fakes.FAKE_NAME
    assert rep["gpu"]["hbm_bandwidth"]["measured"] > 0 and rep["gpu"]["ridge_point"]["fp32"]["measured"] > 0
    assert (Path(rep["files"]) / "report.html").is_file()
    assert "record: " in proc.stdout and "report: ok" in proc.stdout


def test_bad_argument_is_exit_2():
    proc = subprocess.run(["bash", str(SCRIPT), "--no-such-flag"], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown argument --no-such-flag" in proc.stderr


def test_pytest_summary_and_part_status(tmp_path):
    log = "....s.\n=========== 1203 passed, 4 skipped, 1 warning in 610.21s (0:10:10) ===========\n"
    assert record_mod.pytest_summary(log) == "1203 passed, 4 skipped, 1 warning in 610.21s (0:10:10)"
    assert record_mod.pytest_summary("..\n2 failed, 5 passed in 1.0s\n") == "2 failed, 5 passed in 1.0s"
    assert record_mod.pytest_summary("ImportError: no module\n") is None
    (tmp_path / "train.status").write_text("skipped: no --device\n")
    (tmp_path / "decode.status").write_text("error: exit 1 (see decode.log)\n")
    (tmp_path / "tests.status").write_text("ok\n")
    assert record_mod.status(tmp_path, "train") == {"skipped": "no --device"}
    assert record_mod.status(tmp_path, "decode") == {"error": "exit 1 (see decode.log)"}
    assert record_mod.status(tmp_path, "tests") is None
    assert "error" in record_mod.status(tmp_path, "report")  # never reached: not silently fine
