"""How accurate is the ledger on this machine? Predicted vs measured step time for several configs.

Predictions use this machine's measured profile (`tformer bench --quick`, run first when none is
saved) through the measured roofline; measurements are medians of clean steps after warm-up. One
table: config, phase, predicted, measured (median, min..max), ratio predicted/measured, MFU against
the measured peak. The load average is printed before and after: on a shared machine the ratios move.

    python bench/ledger_accuracy.py [--steps 3] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch

torch.set_flush_denormal(True)  # before any parallel op, so every OpenMP worker inherits it

CASES = [
    # (label, preset, overrides, phase, batch, seq, context)
    ("char-small", "char-small", [], "forward", 16, 128, None),
    ("char-small", "char-small", [], "train", 16, 128, None),
    ("char-small", "char-small", [], "train", 64, 128, None),
    ("char-small d512", "char-small", ["d_model=512", "n_heads=8", "d_ff=2048"], "train", 16, 64, None),
    ("char-small 8L", "char-small", ["n_layers=8"], "forward", 32, 128, None),
    ("gpt2", "gpt2", [], "decode", 1, 512, 512),
    ("gpt2", "gpt2", [], "prefill", 1, 128, None),
]


def main() -> None:
    from rich.console import Console
    from rich.table import Table

    from tformer.core.config import preset
    from tformer.cost.ledger import Workload
    from tformer.measure.profile import profile_model, resolve_profile_hardware

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="only the first three cases")
    args = parser.parse_args()
    con = Console(width=160)
    started = time.perf_counter()
    load0 = os.getloadavg()[0]
    device, notes = resolve_profile_hardware(None, "cpu")
    for n in notes:
        con.print(n)
    con.print(f"hardware: {device.name}; {device.source}")
    t = Table(title="ledger accuracy on this machine (ratio = predicted / measured; 1.00 is exact)")
    for col in ("config", "phase", "batch x seq", "predicted", "measured (median)", "min..max", "ratio", "MFU (measured peak)"):
        t.add_column(col, justify="left" if col in ("config", "phase") else "right")
    ratios = []
    for label, name, over, phase, batch, seq, ctx in CASES[:3] if args.quick else CASES:
        config = preset(name).with_overrides(over) if over else preset(name)
        w = Workload(phase=phase, batch=batch, seq=seq if phase != "decode" else ctx + 1, context=ctx)
        r = profile_model(config, w, hardware=device, steps=args.steps, warmup=1, op_steps=1)
        s = r.step
        ratios.append(s.ratio)
        shape = f"{batch} x {seq}" + (f" (context {ctx})" if phase == "decode" else "")
        t.add_row(label, phase, shape, f"{s.predicted_s * 1e3:.1f} ms", f"{s.measured_s * 1e3:.1f} ms",
                  f"{s.min_s * 1e3:.1f}..{s.max_s * 1e3:.1f} ms", f"{s.ratio:.2f}",
                  f"{r.utilization.mfu_measured:.1%}" if r.utilization.mfu_measured is not None else "unknown")
    con.print(t)
    con.print(f"median ratio {statistics.median(ratios):.2f} over {len(ratios)} cases; load average "
              f"{load0:.2f} before, {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} CPUs; "
              f"took {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
