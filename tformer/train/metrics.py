"""Metrics as JSON lines (metrics.jsonl) and CSV (metrics.csv) in the run directory."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from tformer.core.atomic import atomic_write_text

COLUMNS = ["step", "train_loss", "val_loss", "val_ppl", "lr", "tokens_per_s", "mfu", "elapsed_s"]


class MetricsLog:
    def __init__(self, out: str | Path):
        self.out = Path(out)
        self.out.mkdir(parents=True, exist_ok=True)
        self.jsonl = self.out / "metrics.jsonl"
        self.csv = self.out / "metrics.csv"
        self.tb = _tensorboard(self.out / "tb")

    def write(self, record: dict) -> None:
        with self.jsonl.open("a") as f:
            f.write(json.dumps(record) + "\n")
        new = not self.csv.exists()
        with self.csv.open("a", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
            if new:
                writer.writeheader()
            writer.writerow(record)
        if self.tb is not None:
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    self.tb.add_scalar(key, value, record["step"])
            self.tb.flush()

    def records(self) -> list[dict]:
        if not self.jsonl.exists():
            return []
        return [json.loads(line) for line in self.jsonl.read_text().splitlines() if line.strip()]

    def truncate_after(self, step: int) -> None:
        """Drop lines logged after ``step`` (a resumed run repeats those steps)."""
        kept = [r for r in self.records() if r["step"] <= step]
        atomic_write_text(self.jsonl, "".join(json.dumps(r) + "\n" for r in kept))
        lines = [",".join(COLUMNS)] + [",".join("" if r.get(c) is None else str(r[c]) for c in COLUMNS) for r in kept]
        atomic_write_text(self.csv, "\n".join(lines) + "\n")


def _tensorboard(path: Path):
    """A SummaryWriter when the tensorboard package is installed; the JSONL/CSV logs otherwise."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        return None
    return SummaryWriter(str(path))
