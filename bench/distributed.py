"""Measured, not only predicted: the ledger's per-device bytes and traffic beside a real torchrun.

Runs `torchrun --standalone` with 2 CPU processes (4 where os.cpu_count() allows) over gloo, one thread
each, fp32 AdamW, for DDP (ZeRO 0), FSDP2 full_shard (ZeRO 3) and FSDP2 shard_grad_op (ZeRO 2) on a
small decoder with odd sizes (so FSDP's ceil-sharding of dim 0 matters), then prints for each layout
the bytes rank 0 holds in weights, gradients and optimizer state and sends per step, measured beside
tformer.cost.parallel's prediction; and the step time: one process alone, the N-process step, the
prediction from the single-process step and the traffic at the measured loopback all-reduce bandwidth,
and the scaling efficiency (single step / N-process step; the per-replica batch is the same).

Bytes sent per step, rank 0: DDP's all-reduce 2 (N - 1) / N x the payload its communication hook
counts; FSDP2's reduce-scatter and all-gather (N - 1) / N x the payloads it hands to torch.distributed.

    python bench/distributed.py [--nproc 2] [--steps 5] [--no-save]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tformer.core.config import preset
from tformer.core.errors import TformerError
from tformer.core.files import read_json
from tformer.cost.parallel import Layout, communication, per_device, ring_all_reduce_bytes, step_time
from tformer.cost.workload import Workload

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # after the path insert (bench/_results.py: the machine header and bench/results/ files)

WORKER = Path(__file__).resolve().parent / "_distributed_worker.py"
ROOT = Path(__file__).resolve().parents[1]
# A small decoder whose every size is odd: each tensor's rows split unevenly over 2 or 4 ranks.
OVERRIDES = ["d_model=75", "n_heads=3", "d_ff=201", "n_layers=2", "vocab_size=67"]
# worker's counter -> (ledger's communication kind, bytes one rank sends in a ring for a payload on N ranks)
TRAFFIC = {"all_reduce": ("data_parallel_all_reduce", ring_all_reduce_bytes),
           "reduce_scatter": ("zero_reduce_scatter", lambda payload, n: (n - 1) / n * payload),
           "all_gather": ("zero_all_gather", lambda payload, n: (n - 1) / n * payload)}


def run_workers(nproc: int, overrides: list[str], batch: int, seq: int, warmup: int, steps: int,
                layouts: str | None = None) -> dict:
    """The worker's JSON: N ranks under torchrun, or one plain process when ``nproc`` is 1."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "measured.json"
        args = [str(WORKER), "--batch", str(batch), "--seq", str(seq), "--warmup", str(warmup),
                "--steps", str(steps), "--out", str(out)]
        args += [a for o in overrides for a in ("--override", o)]
        if layouts:
            args += ["--layouts", layouts]
        launch = [sys.executable] if nproc == 1 else [
            sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               "OMP_NUM_THREADS": "1"}
        done = subprocess.run(launch + args, env=env, capture_output=True, text=True, check=False)
        if done.returncode != 0 or not out.is_file():
            raise TformerError(f"the distributed worker failed (exit {done.returncode}): "
                               f"{(done.stderr or done.stdout).strip().splitlines()[-1:] or 'no output'}")
        return read_json(out, "distributed worker output", fix="rerun the bench")


def workload(batch: int, seq: int) -> Workload:
    return Workload(phase="train", batch=batch, seq=seq, dtype="fp32", optimizer="adamw")


def compare(config, measured: dict, batch: int, seq: int) -> list[dict]:
    """Per layout and kind: rank 0's measured bytes beside the ledger's."""
    n, w = measured["world"], workload(batch, seq)
    rows = []
    for m in measured["layouts"]:
        layout = Layout(devices=n, zero=m["zero"])
        mem, comm = per_device(config, w, layout), communication(config, w, layout)["bytes"]
        for kind in ("weights", "gradients", "optimizer"):
            rows.append({"layout": m["layout"], "kind": kind, "measured": m[kind], "predicted": mem[kind]})
        for counter, payload in m["collectives"].items():
            ledger_kind, sent = TRAFFIC[counter]
            rows.append({"layout": m["layout"], "kind": ledger_kind, "measured": round(sent(payload, n)),
                         "predicted": comm.get(ledger_kind, 0), "payload": payload})
    for r in rows:
        r["ratio"] = r["measured"] / r["predicted"] if r["predicted"] else None
    return rows


def timing(config, measured: dict, single_s: float, batch: int, seq: int) -> list[dict]:
    """Per layout: the measured N-process step beside step_time's prediction at the loopback bandwidth."""
    n, bw = measured["world"], measured["loopback"]["bus_bytes_per_s"]
    out = []
    for m in measured["layouts"]:
        layout = Layout(devices=n, zero=m["zero"])
        comm_s = communication(config, workload(batch, seq), layout, bw)["seconds"]
        p = step_time(single_s, comm_s, layout)
        out.append({"layout": m["layout"], "measured_s": m["step_s"], "comm_s": comm_s,
                    "overlapped_s": p["overlapped_s"], "serial_s": p["serial_s"],
                    "efficiency": single_s / m["step_s"], "efficiency_overlapped": single_s / p["overlapped_s"],
                    "efficiency_serial": single_s / p["serial_s"]})
    return out


def print_tables(rows: list[dict], times: list[dict], single_s: float, measured: dict) -> None:
    n, lb = measured["world"], measured["loopback"]
    print(f"\nbytes per device, rank 0 of {n} (ratio = measured / predicted; 1.000 is exact)")
    print(f"  {'layout':<14} {'kind':<26} {'measured':>12} {'predicted':>12} {'ratio':>7}")
    for r in rows:
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        print(f"  {r['layout']:<14} {r['kind']:<26} {r['measured']:>12,} {r['predicted']:>12,} {ratio:>7}")
    print(f"\nloopback all-reduce: {lb['bytes'] / 2**20:.0f} MiB in {lb['seconds'] * 1e3:.1f} ms, "
          f"bus bandwidth {lb['bus_bytes_per_s'] / 1e9:.2f} GB/s (2 (N - 1) / N x bytes / seconds)")
    print(f"step time: 1 process alone {single_s * 1e3:.1f} ms (same per-replica batch); "
          "efficiency = single step / N-process step")
    print(f"  {'layout':<14} {'measured':>10} {'comm (pred)':>12} {'overlapped':>11} {'serial':>9} "
          f"{'eff. meas.':>11} {'eff. overl.':>12} {'eff. serial':>12}")
    for t in times:
        print(f"  {t['layout']:<14} {t['measured_s'] * 1e3:>7.1f} ms {t['comm_s'] * 1e3:>9.2f} ms "
              f"{t['overlapped_s'] * 1e3:>8.1f} ms {t['serial_s'] * 1e3:>6.1f} ms {t['efficiency']:>11.0%} "
              f"{t['efficiency_overlapped']:>12.0%} {t['efficiency_serial']:>12.0%}")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nproc", type=int, default=4 if (os.cpu_count() or 1) >= 4 else 2)
    parser.add_argument("--batch", type=int, default=4, help="sequences per replica")
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--no-save", action="store_true", help="do not file the figures under bench/results/")
    args = parser.parse_args(argv)
    machine = _results.machine()
    print(_results.header(machine))
    config = preset("char-small").with_overrides(OVERRIDES)
    print(f"char-small with {', '.join(OVERRIDES)}; batch {args.batch} x seq {args.seq} per replica, fp32 AdamW; "
          f"{args.nproc} processes over gloo, 1 thread each")
    single_s = run_workers(1, OVERRIDES, args.batch, args.seq, args.warmup, args.steps)["single"]["step_s"]
    measured = run_workers(args.nproc, OVERRIDES, args.batch, args.seq, args.warmup, args.steps)
    rows = compare(config, measured, args.batch, args.seq)
    times = timing(config, measured, single_s, args.batch, args.seq)
    print_tables(rows, times, single_s, measured)
    if not args.no_save:
        record = {"world": measured["world"], "overrides": OVERRIDES, "batch": args.batch, "seq": args.seq,
                  "bytes": rows, "single_step_s": single_s, "time": times, "loopback": measured["loopback"]}
        print(f"  saved in {_results.save('distributed', record, machine)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
