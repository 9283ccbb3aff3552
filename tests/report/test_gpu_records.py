"""The report lists GPU figures measured elsewhere (bench/results/ records from bench/gpu_check.sh) with
their device and date, says "unmeasured" when there are none, and leaves out smoke and CPU records."""

from __future__ import annotations

import json

from tformer.report import gpu_records
from tformer.report.doc import Section, Table, Text

H100 = "NVIDIA H100 80GB HBM3"


def _record(path, device=H100, mode="full", date="2026-12-01", **parts):
    check = {"date": date, "device": device, "mode": mode, "tests": {"summary": "1210 passed, 4 skipped in 600s"},
             "train": {"skipped": "bench/train_throughput.py has no --device"},
             "decode": {"headline": "gpt2 batch 1: 1,480 tok/s compiled, HF static 610", "data": {}},
             "report": {"step_time_s": {"predicted": 0.09, "measured": 0.1, "ratio": 0.9}}, **parts}
    path.write_text(json.dumps({"machine": {"cpu": "Some CPU", "gpu": device if mode == "full" else None},
                                "gpu_check": check}))


def _section(tmp_path) -> tuple[Section, dict]:
    sec, data = Section(1, "The machine", "machine"), {}
    gpu_records.add_to(sec, data, tmp_path)
    return sec, data


def test_no_gpu_record_says_unmeasured(tmp_path):
    (tmp_path / "intel-cpu-2c.json").write_text(json.dumps({"machine": {"cpu": "x"}, "decode_speed": {}}))
    _record(tmp_path / "smoke-intel.json", device="Intel CPU", mode="smoke")
    sec, data = _section(tmp_path)
    assert data["gpu_records"] == []
    assert [b for b in sec.blocks if isinstance(b, Table)] == []
    assert "unmeasured" in sec.blocks[-1].text and "bench/gpu_check.sh" in sec.blocks[-1].text


def test_gpu_records_listed_with_device_and_date(tmp_path):
    _record(tmp_path / "gpu-nvidia-h200.json", device="NVIDIA H200", date="2026-12-03")
    _record(tmp_path / "gpu-nvidia-h100.json")
    sec, data = _section(tmp_path)
    assert [r["device"] for r in data["gpu_records"]] == [H100, "NVIDIA H200"]  # oldest first
    table = next(b for b in sec.blocks if isinstance(b, Table))
    assert not any(isinstance(b, Text) and "unmeasured" in b.text for b in sec.blocks)
    h100 = table.rows[0]
    assert h100[:3] == [H100, "2026-12-01", "1210 passed, 4 skipped in 600s"]
    assert h100[3].startswith("skipped: ") and h100[4].startswith("gpt2 batch 1: 1,480 tok/s")
    assert "ratio 0.9" in h100[5]


def test_unreadable_record_is_named_not_fatal(tmp_path):
    (tmp_path / "gpu-broken.json").write_text("{not json")
    sec, data = _section(tmp_path)
    assert data["gpu_records"][0]["file"] == "gpu-broken.json" and "problem" in data["gpu_records"][0]
    assert "unmeasured" in sec.blocks[0].text
    assert next(b for b in sec.blocks if isinstance(b, Table)).rows[0][:2] == ["gpu-broken.json", "unreadable"]
