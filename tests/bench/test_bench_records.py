"""scripts/check_bench_records.py: every filed bench record names its command and commit, and the check fails on a
record whose script or flag no longer exists (so a figure nobody can re-measure does not stay in bench/results/)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _check():
    spec = importlib.util.spec_from_file_location("check_bench_records", ROOT / "scripts" / "check_bench_records.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_filed_records_all_name_a_live_script_and_flags(capsys):
    assert _check().main() == 0, capsys.readouterr().out


def test_a_record_whose_script_or_flag_is_gone_is_named():
    check = _check()
    live = {"command": "python bench/llamacpp.py --gguf gemma3-270m --skip export --repeats 5", "commit": "abc"}
    assert check.problems("llamacpp", live) == []
    assert check.problems("x", {**live, "command": "python bench/llamacpp.py --best-of 3"}) == [
        "bench/llamacpp.py no longer takes --best-of"]
    assert check.problems("x", {**live, "command": "python bench/gone.py"}) == ["its script bench/gone.py no longer exists"]
    assert check.problems("x", {"date": "2026-01-01"}) == ["names no commit", "names no command"]
    # a script that takes the shared --threads/--json/--no-save through bench/_results.add_run_args
    assert check.problems("x", {**live, "command": "python bench/prune.py --threads 2 --no-save"}) == []


def test_a_new_record_carries_its_command_and_commit(tmp_path, monkeypatch):
    import sys

    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import _results
    finally:
        sys.path.remove(str(ROOT / "bench"))
    monkeypatch.setattr(_results, "RESULTS", tmp_path / "bench" / "results")
    monkeypatch.setattr(sys, "argv", ["bench/llamacpp.py", "--repeats", "5"])
    (tmp_path / "bench" / "results").mkdir(parents=True)
    path = _results.save("llamacpp", {"figure": 1.0}, {"cpu": "Test CPU", "physical_cores": 2, "logical_cpus": 2})
    record = json.loads(path.read_text())["llamacpp"]
    assert record["command"] == "python bench/llamacpp.py --repeats 5" and record["figure"] == 1.0
    assert record["commit"]
