"""Attention at long context: every attention kind timed forward and forward+backward for n = 256 ...
16384, beside the ledger's predicted time and peak memory; the crossover n against sdpa on this
machine; and the measured selection guide beside the textbook's.

    python bench/attention_scaling.py                  # n up to 16384 (minutes: budgets stop the slow kinds)
    python bench/attention_scaling.py --quick          # n up to 2048, one repetition
    python bench/attention_scaling.py --kinds sdpa,tiled --max-n 8192 --json scaling.json

One call: batch 1, 4 heads x 64, fp32, causal where the kind can be (else bidirectional), the kinds'
settings from tformer.measure.attention_sweep.SETTINGS (shared with the quality bench and the report).
Measured peak memory: tensors the call allocates above what existed before (memory_peak.py says what
that leaves out). Predicted time: the roofline of the ledger's rows on this machine's saved profile
(`tformer bench --quick` saves one). A kind stops past --time-budget seconds per call or when its
predicted peak passes --memory-budget-gib; the line under each table says where and why.
"""

from __future__ import annotations

import argparse
import os
import sys

from tformer.core import fmt
from tformer.core.errors import TformerError
from tformer.measure.attention_sweep import (
    CROSSOVER_HEADERS,
    GUIDE_HEADERS,
    POINT_HEADERS,
    SweepSpec,
    crossover,
    crossover_rows,
    guide_rows,
    memory_target,
    point_rows,
    prediction_device,
    selection_guide,
    sweep,
)
from tformer.report.context import load_average, oversubscription_note

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402  (bench/_results.py: the machine header and bench/results/ files)

FULL_NS = (256, 512, 1024, 2048, 4096, 8192, 16384)
QUICK_MAX_N = 2048


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help=f"n up to {QUICK_MAX_N}, one repetition per point")
    p.add_argument("--max-n", type=int, default=None, help="largest sequence length (a power of two from 256)")
    p.add_argument("--kinds", default=None, help="comma-separated attention kinds (default: every registered one)")
    p.add_argument("--modes", default="forward,forward+backward")
    p.add_argument("--time-budget", type=float, default=2.0, help="seconds per call past which a kind stops")
    p.add_argument("--memory-budget-gib", type=float, default=4.0, help="predicted peak past which a kind stops")
    p.add_argument("--attention-flops", choices=("full", "causal"), default="full",
                   help="the ledger's causal accounting: every pair (FlopCounterMode's count) or the unmasked ones")
    p.add_argument("--json", default=None, help="also write the record here")
    p.add_argument("--no-save", action="store_true", help="do not file the figures under bench/results/")
    return p.parse_args(argv)


def spec_from(args) -> SweepSpec:
    top = args.max_n or (QUICK_MAX_N if args.quick else FULL_NS[-1])
    ns = tuple(n for n in FULL_NS if n <= top) or (top,)
    return SweepSpec(ns=ns, modes=tuple(m.strip() for m in args.modes.split(",") if m.strip()),
                     time_budget_s=args.time_budget, memory_budget=int(args.memory_budget_gib * 2**30),
                     reps=1 if args.quick else 3, min_rep_s=0.02 if args.quick else 0.05,
                     attention_flops=args.attention_flops)


def main(argv=None) -> int:
    args = parse_args(argv)
    machine = _results.machine()
    print(_results.header(machine))
    try:
        spec = spec_from(args)
        kinds = [k.strip() for k in args.kinds.split(",")] if args.kinds else None
        device = prediction_device("cpu")
        results, notes = sweep(spec, device, kinds)
    except TformerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"one attention call: batch {spec.batch}, {spec.heads} heads x {spec.head_dim}, fp32, causal where the kind "
          f"can be; budgets {fmt.seconds(spec.time_budget_s)} per call, {fmt.gib(spec.memory_budget)} predicted peak")
    print("predicted time: " + (device.name + " measured profile (roofline of the ledger's rows)" if device else
                                "unknown (no measured profile saved: run `tformer bench --quick`)"))
    busy = oversubscription_note(load_average())
    for note in notes + ([busy[1]] if busy else []):
        print(f"  {note}")
    for mode in spec.modes:
        print(f"\n{mode}")
        print(_results.table(POINT_HEADERS, point_rows(results, mode)))
    print("\ncrossover against sdpa on this machine (the smallest n from which the kind is faster at every larger n)")
    print(_results.table(CROSSOVER_HEADERS, crossover_rows(results)))
    guide_mode = spec.modes[0]
    print(f"\nthe measured selection guide for this machine ({guide_mode}) beside the textbook's")
    print(_results.table(GUIDE_HEADERS, guide_rows(results, guide_mode)))
    target = memory_target(results, spec, n=8192)
    print("\n" + target)
    record = {"spec": {**spec.__dict__, "ns": list(spec.ns), "modes": list(spec.modes)},
              "predicted_on": device.name if device else None, "skipped": notes,
              "kinds": [r.to_dict() for r in results],
              "crossover": {r.kind: {m: crossover(results, r.kind, m)[1] for m in spec.modes} for r in results},
              "guide": selection_guide(results, guide_mode), "target": target}
    _results.write("attention_scaling", record, machine, args.json, not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
