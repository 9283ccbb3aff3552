"""Runs of tests/train/helpers/tiny_train.py (a tiny model on a synthetic stream) and what they leave behind,
shared by the resume, DDP and compile tests."""

import json
import os
import signal
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
    first = _run_group(cmd, env)
    if first is not None or not torchrun:
        return first if first is not None else _timed_out(cmd)
    # A two-rank run takes ~15 s here; once in CI one hung in torchrun's rendezvous for the whole limit (its ranks
    # never logged a step). Such a hang is retried once, its output printed; a second hang fails with its output.
    print("torchrun hung; retrying once")
    second = _run_group(cmd, env)
    return second if second is not None else _timed_out(cmd)


def _run_group(cmd, env, timeout_s=300):
    """The finished process, or None when it ran past ``timeout_s``: then it and every process it started
    (torchrun's ranks) are killed, so none outlives the test holding a port or a file."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        print(f"timed out after {timeout_s} s: {' '.join(cmd)}\n--- stdout ---\n{out[-3000:]}\n"
              f"--- stderr ---\n{err[-3000:]}")
        return None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _timed_out(cmd):
    raise AssertionError(f"{' '.join(cmd)} ran past its limit (its output is printed above)")


def losses(out: Path) -> list[float]:
    return [json.loads(line)["train_loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def weights(out: Path) -> dict:
    return load_file(str(out / "model.safetensors"))
