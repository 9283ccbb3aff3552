"""What bench/vit_digits.py and bench/clip_digits.py share: run the documented `tformer train --task ...` command
end to end in a fresh process, time it, and file its held-out figures under bench/results/."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import _results

REPO = Path(__file__).resolve().parents[1]


def main(section: str, task: str, summarise, description: str) -> int:
    """Parse --json / --no-save / --max-steps, train, print ``summarise(run folder) -> (record, lines)``, file it."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--max-steps", type=int, help="override the image default (1500) for a quick check")
    parser.add_argument("--json", help="also write the record to this file")
    parser.add_argument("--no-save", action="store_true", help="do not file the figures under bench/results/")
    args = parser.parse_args()
    m = _results.machine()
    print(_results.header(m))
    with tempfile.TemporaryDirectory(prefix=f"bench-{section}-") as tmp:
        out = Path(tmp) / "run"
        command = ["tformer", "train", "--task", task, "--out", str(out), "--no-progress"]
        if args.max_steps:
            command += ["--max-steps", str(args.max_steps)]
        print("command: " + " ".join(command[:4] + command[7:]))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "tformer", *command[1:]], env=env, capture_output=True, text=True)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            print(done.stdout[-2000:] + done.stderr[-2000:], file=sys.stderr)
            return done.returncode
        record, lines = summarise(out)
        evals = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        record = {"trains": " ".join(command[:4]), "steps": evals[-1]["step"], "train_s": evals[-1]["elapsed_s"],
                  "wall_s": wall, **record}
    for line in lines:
        print(line)
    print(f"steps {record['steps']}, training {record['train_s']:.0f} s, wall {wall:.0f} s (command start to end; "
          "timings on a shared machine vary)")
    _results.write(section, record, m, args.json, not args.no_save)
    return 0


def last_eval(out: Path) -> dict:
    """The last metrics.jsonl record that holds a validation result."""
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "val_loss" in r][-1]
