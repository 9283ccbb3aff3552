"""Runs of tests/train/helpers/tiny_train.py (a tiny model on a synthetic stream) and what they leave behind,
shared by the resume, DDP and compile tests."""

import json
import os
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

SCRIPT = Path(__file__).parent / "helpers" / "tiny_train.py"


def run(*args, torchrun=0):
    # The helper script runs from tests/train/helpers; it must import this checkout's tformer, whatever
    # an installed copy points at.
    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    if torchrun:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={torchrun}",
               str(SCRIPT), *args]
    else:
        cmd = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)


def losses(out: Path) -> list[float]:
    return [json.loads(line)["train_loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def weights(out: Path) -> dict:
    return load_file(str(out / "model.safetensors"))
