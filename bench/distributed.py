"""Measured, not only predicted: the ledger's per-device bytes and traffic beside a real torchrun.

Runs `torchrun --standalone` with 2 CPU processes (4 where os.cpu_count() allows) over gloo, one thread
each, fp32 AdamW, for DDP (ZeRO 0), FSDP2 full_shard (ZeRO 3) and FSDP2 shard_grad_op (ZeRO 2) on a
small decoder with odd sizes (so FSDP's ceil-sharding of dim 0 matters), then prints for each layout
the bytes rank 0 holds in weights, gradients and optimizer state and sends per step, measured beside
tformer.cost.parallel's prediction; and the step time: one process alone, the N-process step, the
prediction from the single-process step and the traffic over the measured loopback link (bytes at
its all-reduce bandwidth, each collective call at its latency),
and the scaling efficiency (single step / N-process step; the per-replica batch is the same).

The runs and the comparison are tformer.train.parallel_check's (the report's "Beyond one device"
section uses the same on the report's model).

    python bench/distributed.py [--nproc 2] [--steps 5] [--no-save]
"""

from __future__ import annotations

import argparse
import os
import sys

from tformer.core.config import preset
from tformer.train.parallel_check import compare, run_probe, timing

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # after the path insert (bench/_results.py: the machine header and bench/results/ files)

# A small decoder whose every size is odd: each tensor's rows split unevenly over 2 or 4 ranks.
OVERRIDES = ["d_model=75", "n_heads=3", "d_ff=201", "n_layers=2", "vocab_size=67"]


def print_tables(rows: list[dict], times: list[dict], single_s: float, measured: dict) -> None:
    n, lb = measured["world"], measured["loopback"]
    print(f"\nbytes per device, rank 0 of {n} (ratio = measured / predicted; 1.000 is exact)")
    print(f"  {'layout':<14} {'kind':<26} {'measured':>12} {'predicted':>12} {'ratio':>7}  calls (meas./pred.)")
    for r in rows:
        ratio = f"{r['ratio']:.3f}" if r["ratio"] is not None else "-"
        calls = f"  {r['calls']} / {r['predicted_calls']}" if "calls" in r else ""
        print(f"  {r['layout']:<14} {r['kind']:<26} {r['measured']:>12,} {r['predicted']:>12,} {ratio:>7}{calls}")
    print(f"\nloopback all-reduce: {lb['bytes'] / 2**20:.0f} MiB in {lb['seconds'] * 1e3:.1f} ms, "
          f"bus bandwidth {lb['bus_bytes_per_s'] / 1e9:.2f} GB/s (2 (N - 1) / N x bytes / seconds); "
          f"latency {lb['latency_s'] * 1e6:.0f} us per call (4-byte all-reduce)")
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
    measured = run_probe(config, args.nproc, args.batch, args.seq, args.warmup, args.steps)
    single_s = measured["single"]["step_s"]
    rows, times = compare(config, measured), timing(config, measured)
    print_tables(rows, times, single_s, measured)
    if not args.no_save:
        record = {"world": measured["world"], "overrides": OVERRIDES, "batch": args.batch, "seq": args.seq,
                  "bytes": rows, "single_step_s": single_s, "time": times, "loopback": measured["loopback"]}
        print(f"  saved in {_results.save('distributed', record, machine)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
