"""Metrics as JSON lines (metrics.jsonl) and CSV (metrics.csv) in the run directory."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

from tformer.core.atomic import append_line, atomic_write_text, complete_lines, make_dir

COLUMNS = ["step", "train_loss", "val_loss", "val_ppl", "lr", "tokens_per_s", "mfu", "elapsed_s"]


class MetricsLog:
    def __init__(self, out: str | Path):
        self.out = Path(out)
        make_dir(self.out, "--out")
        self.jsonl = self.out / "metrics.jsonl"
        self.csv = self.out / "metrics.csv"
        self.tb = _tensorboard(self.out / "tb")

    def write(self, record: dict) -> None:
        append_line(self.jsonl, json.dumps(record))
        row = io.StringIO()
        writer = csv.DictWriter(row, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
        if not self.csv.exists():
            writer.writeheader()
        writer.writerow(record)
        append_line(self.csv, row.getvalue())
        if self.tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.tb.add_scalar(key, value, record["step"])
            self.tb.flush()

    def records(self) -> list[dict]:
        if not self.jsonl.exists():
            return []
        return [r for r in map(_record, complete_lines(self.jsonl.read_text(encoding="utf-8", errors="replace")))
                if r is not None]

    def truncate_after(self, step: int) -> None:
        """Drop lines logged after ``step`` (a resumed run repeats those steps)."""
        kept = [r for r in self.records() if r["step"] <= step]
        atomic_write_text(self.jsonl, "".join(json.dumps(r) + "\n" for r in kept))
        lines = [",".join(COLUMNS)] + [",".join("" if r.get(c) is None else str(r[c]) for c in COLUMNS) for r in kept]
        atomic_write_text(self.csv, "\n".join(lines) + "\n")


def _record(line: str) -> dict | None:
    """One logged record; None for a line a hand edit or a crash left unreadable (the log is a
    by-product of training: a damaged line must not stop a resume)."""
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record if isinstance(record, dict) and isinstance(record.get("step"), int) else None


def _tensorboard(path: Path):
    """A SummaryWriter when the tensorboard package is installed; the JSONL/CSV logs otherwise."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(path))
