"""Two-rank trainings back to back, to show that none hangs at exit: `torchrun --nproc_per_node=2 -m tformer train`
on a small model, DDP and FSDP in turn (gloo on CPU), each given a time limit far above its run time.

    python bench/two_rank_stress.py                 # 20 runs, filed under bench/results/ as "two_rank_stress"
    python bench/two_rank_stress.py --runs 40 --limit 180

Why it exists: a rank could hang in the process group's teardown (a gloo worker waiting for the GIL while the main
thread joined it: tformer/train/distributed.py says how, and how it is avoided). It showed on one run in two or
three on two loaded cores, so the runs here may share the machine with other work; the record says whether they did
(the load average before and after). A run past --limit is a hang: where py-spy is installed, every process of the
run has its stacks printed before the run is killed; each run's exit status and seconds are kept.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _results  # noqa: E402 -- bench's own helper, beside this script

MODEL = ["--preset", "char-small", "--set", "n_layers=2", "--set", "d_model=64", "--set", "n_heads=4",
         "--set", "d_ff=128"]
TRAIN = ["--data", "shakespeare", "--max-steps", "10", "--batch-size", "8", "--seq-len", "64", "--eval-interval", "5",
         "--log-interval", "1", "--ckpt-interval", "5", "--no-progress"]


def processes(marker: str) -> list[int]:
    """Every process whose environment holds TFORMER_STRESS_RUN=marker (torchrun puts each rank in its own
    session, so a process group does not reach them)."""
    needle = f"TFORMER_STRESS_RUN={marker}".encode()
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def one_run(index: int, fsdp: bool, limit: float, folder: Path) -> dict:
    out = folder / f"run{index}"
    marker = uuid.uuid4().hex
    env = {**os.environ, "TFORMER_STRESS_RUN": marker, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "tformer",
           "train", *MODEL, *TRAIN, "--out", str(out), *(["--fsdp"] if fsdp else [])]
    log = folder / f"run{index}.log"
    start = time.perf_counter()
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        try:
            code = proc.wait(timeout=limit)
            hung = False
        except subprocess.TimeoutExpired:
            code, hung = None, True
    seconds = time.perf_counter() - start
    if hung:
        print(f"run {index} ({'fsdp' if fsdp else 'ddp'}) ran past {limit:.0f} s: stacks of its processes follow")
        for pid in processes(marker):
            if shutil.which("py-spy"):
                subprocess.run(["py-spy", "dump", "--native", "--pid", str(pid)], timeout=60)
    for pid in processes(marker):  # a hung run, or a rank a finished torchrun left behind
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    proc.wait()
    if code not in (0, None):
        print(log.read_text()[-2000:])
    return {"mode": "fsdp" if fsdp else "ddp", "seconds": round(seconds, 1), "exit": code, "hung": hung}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20, help="two-rank runs, DDP and FSDP in turn (default 20)")
    p.add_argument("--limit", type=float, default=120.0, help="seconds a run may take before it counts as hung")
    p.add_argument("--json", default=None, help="also write the record here")
    p.add_argument("--no-save", action="store_true", help="do not file the record under bench/results/")
    args = p.parse_args(argv)
    m = _results.machine()
    print(_results.header(m))
    load_before = os.getloadavg()[0]
    runs = []
    with tempfile.TemporaryDirectory(prefix="two_rank_stress-") as tmp:
        for i in range(args.runs):
            r = one_run(i, fsdp=i % 2 == 1, limit=args.limit, folder=Path(tmp))
            runs.append(r)
            ended = "HUNG" if r["hung"] else f"exit {r['exit']}"
            print(f"run {i + 1}/{args.runs} {r['mode']}: {ended} in {r['seconds']} s", flush=True)
    hung = sum(r["hung"] for r in runs)
    failed = sum(r["exit"] not in (0, None) for r in runs)
    record = {"runs": runs, "hung": hung, "failed": failed, "limit_s": args.limit,
              "each_run": "torchrun --nproc_per_node=2 -m tformer train " + " ".join(MODEL + TRAIN) + " [--fsdp]",
              "load_average_before": round(load_before, 2), "load_average_after": round(os.getloadavg()[0], 2)}
    print(f"{args.runs - hung - failed}/{args.runs} finished cleanly, {hung} hung, {failed} failed "
          f"(load average {record['load_average_before']} before, {record['load_average_after']} after)")
    _results.write("two_rank_stress", record, m, args.json, not args.no_save)
    return 1 if hung or failed else 0


if __name__ == "__main__":
    sys.exit(main())
