"""Runs of tests/train/helpers/tiny_train.py (a tiny model on a synthetic stream) and what they leave behind,
shared by the resume, DDP and compile tests."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
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
    # A two-rank run takes ~15 s; one that hangs (a rank stuck in the process group's teardown, which
    # tformer.train.distributed now avoids) fails with its output rather than being retried.
    limit = 120 if torchrun else 300
    done = _run_group(cmd, env, limit)
    return done if done is not None else _timed_out(cmd)


def _run_group(cmd, env, timeout_s=300):
    """The finished process, or None when it ran past ``timeout_s``: then it and every process it started are
    killed, so none outlives the test holding a port or a file.

    torchrun starts each rank in a session of its own, so killing torchrun's process group leaves its ranks
    running; and a rank that outlives torchrun (one stuck in the process group's shutdown) keeps any pipe it
    inherited open, so reading the output to its end would wait for it forever. Hence the output goes to files,
    and every process of the run is found by a marker in its environment, which the ranks inherit."""
    marker = uuid.uuid4().hex
    env = {**env, "TFORMER_TEST_RUN": marker}
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, env=env, start_new_session=True)
        try:
            proc.wait(timeout=timeout_s)
            hung = False
        except subprocess.TimeoutExpired:
            hung = True
        _kill_marked(marker)  # a rank left behind by a finished torchrun too
        proc.wait()
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if hung:
        print(f"timed out after {timeout_s} s: {' '.join(cmd)}\n--- stdout ---\n{stdout[-3000:]}\n"
              f"--- stderr ---\n{stderr[-3000:]}")
        return None
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def _kill_marked(marker: str) -> None:
    """SIGKILL every process whose environment holds TFORMER_TEST_RUN=marker (Linux's /proc; elsewhere nothing)."""
    needle = f"TFORMER_TEST_RUN={marker}".encode()
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
        except (OSError, ValueError):  # gone meanwhile, or not ours to read
            continue


def _timed_out(cmd):
    raise AssertionError(f"{' '.join(cmd)} ran past its limit (its output is printed above)")


def losses(out: Path) -> list[float]:
    return [json.loads(line)["train_loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def weights(out: Path) -> dict:
    return load_file(str(out / "model.safetensors"))
