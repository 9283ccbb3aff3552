"""What every bench prints first and saves last: the machine it ran on, and its figures filed per CPU
model under bench/results/ (one JSON per CPU, each bench its own section, with the date, the command that
made it and the commit it ran on), so the README can show every CPU that has been measured instead of one,
and scripts/check_bench_records.py can tell a record whose script or flag is gone. ``spread`` is the one
statistic a comparison quotes on both sides: the median of the repetitions, their range, and every one."""

from __future__ import annotations

import datetime
import json
import re
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from tformer.core.atomic import atomic_write_text
from tformer.core.files import read_json
from tformer.machine import cpu_info
from tformer.machine.profile_store import bench_results_name

RESULTS = Path(__file__).resolve().parent / "results"
ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "neon", "asimd", "sve", "bf16")


def _blas() -> str:
    found = re.search(r"BLAS_INFO=(\w+)", torch.__config__.show())
    return found.group(1) if found else "unknown"


def machine() -> dict:
    """CPU model, cores, ISA flags, BLAS, threads and versions: what a figure depends on."""
    cpu = cpu_info()
    flags = {name for name, present in (cpu.flags or {}).items() if present}
    return {"cpu": cpu.model, "physical_cores": cpu.physical_cores, "logical_cpus": cpu.logical_cpus,
            "isa": [f for f in ISA_FLAGS if f in flags], "blas": _blas(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads(),
            "torch": torch.__version__}


def header(m: dict) -> str:
    return (f"machine: {m['cpu']}, {m['physical_cores']} cores / {m['logical_cpus']} CPUs, ISA "
            f"{' '.join(m['isa']) or 'baseline'}, BLAS {m['blas']} ({m['cpu_capability']}), torch {m['torch']}, "
            f"{m['threads']} threads")


def read_stream() -> float:
    """Bytes/s of a read-only pass (a sum over 512 MiB), best of 5: the most any weight read can reach."""
    x = torch.ones(512 * 2**20 // 4)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best


def spread(samples: list[float]) -> dict:
    """The median of the repetitions, their min and max, and each one as measured (at least 5 for a comparison)."""
    xs = [float(x) for x in samples]
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs), "samples": xs}


def provenance() -> dict:
    """The command that made a record (this script and its arguments) and the commit it ran on ("+dirty" when the
    tree had changes), as every filed record carries them."""
    root = RESULTS.parents[1]
    command = shlex.join(["python", f"bench/{Path(sys.argv[0]).name}", *sys.argv[1:]])
    try:
        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                                check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit, dirty = "unknown (not a git checkout)", ""
    return {"command": command, "commit": commit + ("+dirty" if dirty else "")}


def save(section: str, data: dict, m: dict) -> Path:
    """File ``data`` as ``section`` of this CPU's results (bench/results/<cpu>.json), dated; other
    sections (other benches) and other CPUs' files are kept."""
    path = RESULTS / bench_results_name(m["cpu"], m["physical_cores"] or m["logical_cpus"])
    doc = read_json(path, "bench results", fix="delete it and rerun the bench") if path.is_file() else {}
    doc["machine"] = m
    doc[section] = {"date": datetime.date.today().isoformat(), **provenance(), **data}
    atomic_write_text(path, json.dumps(doc, indent=1) + "\n")
    return path


def write(section: str, record: dict, m: dict, json_path: str | None, file_it: bool, indent: str = "") -> None:
    """A bench's last act: ``record`` to ``json_path`` (--json) if given, and filed under bench/results/
    as ``section`` unless --no-save; both written whole or not at all."""
    if json_path:
        atomic_write_text(json_path, json.dumps(record, indent=1) + "\n")
    if file_it:
        print(f"{indent}saved in {save(section, record, m)}")


def add_run_args(parser, threads_help: str = "torch threads (default: torch's); 1 on a busy machine") -> None:
    """The options every training bench takes: --threads, --json, --no-save."""
    parser.add_argument("--threads", type=int, default=None, help=threads_help)
    parser.add_argument("--json", default=None, help="also write the record to this file")
    parser.add_argument("--no-save", action="store_true", help="do not file the figures under bench/results/")


def begin(args, modes: dict) -> tuple[dict, dict]:
    """A bench's first act: its settings (each key of ``modes`` holds (default, --quick) values), the thread count
    set, the machine read and printed. Returns (mode, machine)."""
    mode = {key: values[1 if args.quick else 0] for key, values in modes.items()}
    if args.threads:
        torch.set_num_threads(args.threads)
    m = machine()
    print(header(m))
    return mode, m


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Plain columns, left-aligned, two spaces apart."""
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows)]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip() for r in [headers, *rows]]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])
