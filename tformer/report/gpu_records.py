"""GPU figures measured elsewhere: the bench records bench/gpu_check.sh files under bench/results/
(one JSON per GPU model, its "gpu_check" section dated), listed in the report with the device and
the date, so a report made on a laptop still shows what an H100 measured, and says "unmeasured"
when no GPU record exists.

A record, as bench/gpu_check.sh writes it (bench/gpu_record.py):
    {"machine": {"gpu": "NVIDIA H100 80GB HBM3", ...},
     "gpu_check": {"date": "2026-11-25", "device": "NVIDIA H100 80GB HBM3", "mode": "full",
                   "tests": {"summary": "1210 passed, 4 skipped in 612.3s", "rc": 0},
                   "train": {...} | {"skipped": why} | {"error": why},
                   "decode": {...} | {"skipped": why} | {"error": why},
                   "report": {"step_time_s": {"predicted": s, "measured": s, "ratio": r}, "gpu": {...}}}}
Smoke records (mode "smoke", CPU) prove the script runs; they are not GPU figures and are not listed.
"""

from __future__ import annotations

from pathlib import Path

from tformer.core import fmt
from tformer.core.errors import TformerError
from tformer.core.files import read_json
from tformer.report.section_long_context import RESULTS_DIR

SECTION = "gpu_check"
HEADERS = ["device", "measured", "test suite on the GPU", "training (bf16, compiled)", "decode (CUDA graphs)",
           "report: predicted / measured step"]
COMMAND = "bash bench/gpu_check.sh"


def _part(part) -> str:
    """One cell: the part's own headline, or why it has none."""
    if not isinstance(part, dict):
        return "not run"
    if part.get("skipped"):
        return f"skipped: {part['skipped']}"
    if part.get("error"):
        return f"failed: {part['error']}"
    return str(part.get("headline") or "measured (see the record)")


def _report_cell(part) -> str:
    step = part.get("step_time_s") if isinstance(part, dict) else None
    if not isinstance(step, dict) or not step.get("measured"):
        return _part(part)
    return (f"{fmt.seconds(step.get('predicted'))} / {fmt.seconds(step['measured'])} "
            f"(ratio {fmt.num(step.get('ratio'), 3)})")


def gpu_records(results_dir: Path | None = None) -> list[dict]:
    """Every full GPU record under ``results_dir`` (default bench/results/), oldest first:
    {"file", "device", "date", "tests", "train", "decode", "report"}. Unreadable files are skipped
    with the reason in "problem", so one bad file does not hide the others."""
    folder = Path(results_dir or RESULTS_DIR)
    found = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            doc = read_json(path, "bench results", fix="delete it and rerun the bench")
        except TformerError as exc:
            found.append({"file": path.name, "problem": str(exc)})
            continue
        rec = doc.get(SECTION) if isinstance(doc, dict) else None
        machine = doc.get("machine") if isinstance(doc, dict) else None
        if not isinstance(rec, dict) or rec.get("mode") != "full" or not (machine or {}).get("gpu"):
            continue
        found.append({"file": path.name, "device": rec.get("device") or machine["gpu"],
                      "date": rec.get("date", "undated"), **{k: rec.get(k) for k in ("tests", "train", "decode",
                                                                                     "report")}})
    return sorted(found, key=lambda r: (r.get("date", ""), r["file"]))


def rows(records: list[dict]) -> list[list[str]]:
    out = []
    for r in records:
        if "problem" in r:
            out.append([r["file"], "unreadable", r["problem"], "", "", ""])
            continue
        tests = r.get("tests") or {}
        out.append([r["device"], r["date"], tests.get("summary") or _part(tests), _part(r.get("train")),
                    _part(r.get("decode")), _report_cell(r.get("report"))])
    return out


def add_to(sec, data: dict, results_dir: Path | None = None) -> None:
    """Append the table (or the "unmeasured" line) to a report section; data["gpu_records"] gets the records."""
    records = gpu_records(results_dir)
    data["gpu_records"] = records
    if not any("problem" not in r for r in records):
        sec.text(f"**GPU figures measured elsewhere:** unmeasured: no GPU record under bench/results/ yet "
                 f"(`{COMMAND}` on an H100/H200 files one; docs/GPU.md).")
    if records:
        sec.table(HEADERS, rows(records),
                  caption=f"GPU figures measured elsewhere (bench/results/, written by `{COMMAND}`), each with its "
                          "device and date")


__all__ = ["add_to", "gpu_records", "rows"]
