"""Turn one bench/gpu_check.sh run (its work folder) into a bench record: bench/results/gpu-<device>.json
(smoke runs: smoke-<cpu>.json), read back by `tformer report` (tformer/report/gpu_records.py).

Each part left in the work folder: <part>.status ("ok", "skipped: why" or "error: why") and its output:
tests.log (pytest -q), train.json, decode.json (the benches' --json), report/report.json.

    python bench/gpu_record.py --work DIR --results DIR --mode full|smoke --device cuda
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
from pathlib import Path

import torch

from tformer.core.atomic import atomic_write_text
from tformer.core.errors import TformerError
from tformer.core.files import read_json

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402  (bench/_results.py: the machine description)

PARTS = ("tests", "train", "decode", "report")
SUMMARY = re.compile(r"\b\d+ (passed|failed|skipped|errors?|xfailed|xpassed|deselected)\b")
TOLERANCE = 0.15  # the target: predicted step time within 15% of the measured one


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60] or "device"


def status(work: Path, part: str) -> dict | None:
    """{"skipped": why} / {"error": why} / None when the part ran."""
    path = work / f"{part}.status"
    text = path.read_text().strip() if path.is_file() else "error: no status (the script stopped before it)"
    kind, _, why = text.partition(":")
    return None if kind == "ok" else {("skipped" if kind == "skipped" else "error"): why.strip() or kind}


def pytest_summary(log: str) -> str | None:
    """The last line of `pytest -q` that counts outcomes ('1203 passed, 4 skipped in 610.2s'), bare."""
    lines = [ln.strip().strip("=").strip() for ln in log.splitlines() if SUMMARY.search(ln)]
    return lines[-1] if lines else None


def tests_part(work: Path) -> dict:
    log = (work / "tests.log").read_text(errors="replace") if (work / "tests.log").is_file() else ""
    rc = (work / "tests.rc").read_text().strip() if (work / "tests.rc").is_file() else None
    part = {"summary": pytest_summary(log), "rc": int(rc) if rc and rc.lstrip("-").isdigit() else None}
    return {**part, **(status(work, "tests") or {})}


def bench_part(work: Path, name: str) -> dict:
    """A bench's --json output, whole, with its "summary" (if it has one) as the record's headline."""
    why = status(work, name)
    if why:
        return why
    data = read_json(work / f"{name}.json", f"{name} bench output", fix="rerun bench/gpu_check.sh")
    summary = data.get("summary") if isinstance(data, dict) else None
    headline = "; ".join(summary) if isinstance(summary, list) else summary
    return {"headline": headline, "data": data}


def _ridge(peak, bandwidth):
    return peak / bandwidth if peak and bandwidth else None


def report_part(work: Path) -> dict:
    """Predicted vs measured training step and the GPU roofs (tensor-core peak, HBM bandwidth, ridge
    point), theoretical and measured, from the report's report.json."""
    why = status(work, "report")
    if why:
        return why
    data = read_json(work / "report" / "report.json", "report.json", fix="rerun bench/gpu_check.sh")
    step = data["measurement"]["profiles"]["train"]["step_time_s"]
    pred, meas = step.get("predicted"), step.get("measured")
    m = data["machine"]
    theo, measured = m.get("theoretical") or {}, m.get("measured_peak_flops") or {}
    bw_theo, bw_meas = theo.get("bandwidth"), m.get("measured_bandwidth")
    dtypes = sorted({k for k in theo if k != "bandwidth"} | set(measured))
    gpu = {
        "device": m.get("device"), "name": m.get("name"),
        # bf16 dense matmul: what the tensor cores do in the bf16 autocast training measured above
        "tensor_core_peak_flops": {"dtype": "bf16", "theoretical": theo.get("bf16"), "measured": measured.get("bf16")},
        "hbm_bandwidth": {"theoretical": bw_theo, "measured": bw_meas},
        "ridge_point": {d: {"theoretical": _ridge(theo.get(d), bw_theo), "measured": _ridge(measured.get(d), bw_meas)}
                        for d in dtypes},
        "peaks_flops": {"theoretical": {d: theo.get(d) for d in dtypes}, "measured": measured},
        "roofs": (data.get("roofline") or {}).get("roofs"),
    }
    within = abs(pred / meas - 1) <= TOLERANCE if isinstance(pred, (int, float)) and meas else None
    return {"step_time_s": {"predicted": pred, "measured": meas, "ratio": step.get("ratio")},
            "within_15pct": within, "gpu": gpu, "summary": data.get("summary"),
            "files": str(work / "report")}


def machine(torch_device: str) -> dict:
    m = _results.machine()
    if torch_device.startswith("cuda") and torch.cuda.is_available():
        dev = torch.device(torch_device)
        props = torch.cuda.get_device_properties(dev)
        m.update(gpu=props.name, gpu_memory_bytes=props.total_memory, gpu_count=torch.cuda.device_count(),
                 compute_capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda)
    else:
        m["gpu"] = None
    m["torch_device"] = torch_device
    return m


def build_record(work: Path, mode: str, torch_device: str) -> tuple[str, dict]:
    """(file name, record)."""
    m = machine(torch_device)
    device = m["gpu"] or m["cpu"]
    name = f"gpu-{slug(device)}.json" if mode == "full" else f"smoke-{slug(device)}.json"
    check = {"date": datetime.date.today().isoformat(),
             "measured_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "device": device, "torch_device": torch_device, "mode": mode,
             "tests": tests_part(work), "train": bench_part(work, "train"), "decode": bench_part(work, "decode"),
             "report": report_part(work)}
    return name, {"machine": m, "gpu_check": check}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True, help="the gpu_check.sh run's work folder")
    p.add_argument("--results", required=True, help="folder of the bench records (bench/results)")
    p.add_argument("--mode", choices=["full", "smoke"], default="full")
    p.add_argument("--device", default="cuda")
    args = p.parse_args(argv)
    try:
        name, record = build_record(Path(args.work), args.mode, args.device)
    except (TformerError, KeyError, ValueError) as exc:
        print(f"gpu_record: {exc}", file=sys.stderr)
        return 2
    path = Path(args.results) / name
    atomic_write_text(path, json.dumps(record, indent=1, default=str) + "\n")
    c = record["gpu_check"]
    print(f"record: {path} ({c['device']}, {c['date']}, {c['mode']})")
    for part in PARTS:
        v = c[part]
        state = v.get("skipped") and f"skipped: {v['skipped']}" or v.get("error") and f"FAILED: {v['error']}" or "ok"
        print(f"  {part}: {state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
