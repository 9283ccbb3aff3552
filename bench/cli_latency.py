"""How long does a pure-arithmetic command take, process start included? `tformer count` on the
llama-70b training ledger, timed as a user runs it (a fresh `python -m tformer` process each run),
beside two peers measured in the same run: `python -c "import torch"` (what the command would pay if
it imported torch) and `python -c pass` (the interpreter's own start). Target: under 0.5 s. Then the
ledger alone, in this process (no start-up): a bf16 training step of the preset at 4096 tokens or its
context if shorter (target 0.5 s;
this was once a test's timed assertion, a figure to read, not a pass/fail that a busy neighbour can flip).

    python bench/cli_latency.py [--runs 7] [--preset llama-70b] [--phase train]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the checkout's tformer, as the subprocesses get through PYTHONPATH
    sys.path.insert(0, str(ROOT))

from tformer.core.config import preset  # noqa: E402
from tformer.cost.ledger import ledger  # noqa: E402

TARGET_S = 0.5


def wall_times(cmd: list[str], runs: int) -> list[float]:
    """Wall seconds of ``runs`` fresh processes of ``cmd`` (output discarded); a failing run raises."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=True)
        out.append(time.perf_counter() - t0)
    return out


def ledger_times(name: str, runs: int) -> tuple[int, list[float]]:
    """Wall seconds of ``runs`` in-process ledgers of a bf16 mixed-precision training step of ``seq`` tokens
    (4096, or the model's context if shorter), every lazy total read (memory, params, FLOPs, rules of thumb)."""
    config = preset(name)
    seq = min(4096, config.max_positions)
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        lg = ledger(config, phase="train", seq=seq, dtype="bf16", mixed_precision=True)
        _ = lg.memory, lg.params, lg.flops, lg.rules_of_thumb
        out.append(time.perf_counter() - t0)
    return seq, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="fresh processes per command (default 7)")
    parser.add_argument("--preset", default="llama-70b")
    parser.add_argument("--phase", default="train")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    count = [sys.executable, "-m", "tformer", "count", "--preset", args.preset, "--phase", args.phase, "--json"]
    rows = [(f"tformer count --preset {args.preset} --phase {args.phase} --json", count),
            ('python -c "import torch"', [sys.executable, "-c", "import torch"]),
            ("python -c pass", [sys.executable, "-c", "pass"])]
    medians = {}
    print(f"median wall time of {args.runs} fresh processes each (process start included); load average "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    for label, cmd in rows:
        times = wall_times(cmd, args.runs)
        medians[label] = statistics.median(times)
        print(f"  {medians[label]:6.3f} s  (min {min(times):.3f}, max {max(times):.3f})  {label}")
    ours = medians[rows[0][0]]
    verdict = "meets" if ours < TARGET_S else "MISSES"
    print(f"count: {ours:.3f} s, {verdict} the {TARGET_S} s target; {ours - medians[rows[2][0]]:.3f} s above bare "
          f"interpreter start; importing torch alone takes {medians[rows[1][0]]:.3f} s")
    seq, times = ledger_times(args.preset, args.runs)
    inner = statistics.median(times)
    print(f"ledger({args.preset}, train, seq {seq}, bf16 mixed) in this process: {inner * 1e3:.1f} ms median "
          f"(min {min(times) * 1e3:.1f}, max {max(times) * 1e3:.1f}), "
          f"{'meets' if inner < TARGET_S else 'MISSES'} the {TARGET_S} s target")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
