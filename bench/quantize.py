"""Weight-only quantization: model bytes, decode speed (measured beside the ledger's roofline) and the loss.

    python bench/quantize.py                  # ~6-9 minutes on 2 cores
    python bench/quantize.py --steps 300 --runs 5 --json quantize.json

What is measured (CPU, fp32 activations, greedy decode through tformer.generate):
  1. gpt2 (124M preset, random weights: speed does not depend on the values) at batch 1: a 32-token prompt,
     then 64 new tokens; decode tokens/s = 63 / (time of 64 new tokens - time of 1), median of --runs, for
     fp32, PyTorch's dynamic int8 (torch.ao quantize_dynamic: the baseline), tformer's int8 (one scale per
     row) and int4 (groups of 32, 64, 128), each on torch's packed CPU kernels over bf16 activations (the
     --bf16-kernel path: the speed this bench is about; a quantized model's default path widens its weights at
     each product, tformer.model.quantized). Beside each: the model's bytes (state dict, tied tensors once)
     and the ledger's predicted decode speed-up over fp32 (the decode roofline on this machine's measured
     profile, `tformer bench`, as `tformer count` uses it; the spec table's roof where none is saved).
  2. a char-small model trained here on the Shakespeare corpus for --steps steps, then its validation loss
     in fp32 and each quantization, and the relative change (targets: int8 within 1%, int4 within 5%).
  3. with --profile: a torch.profiler table of one int8 decode step (where the time goes).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch

from tformer.adapt.quantize import dynamic_int8, quantize_model
from tformer.core.config import preset
from tformer.cost.ledger import Workload, ledger
from tformer.cost.roofline import roofline
from tformer.generate import generate
from tformer.machine import resolve_hardware
from tformer.model import build, runner_for
from tformer.model.quantized import kernels, use_path
from tformer.train import TrainArgs, Trainer, base_config, build_run

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402  (bench/_results.py: the machine header and bench/results/ files)

VARIANTS = [("fp32", None, None), ("dynamic int8", "dynamic", None), ("int8", "int8", None),
            ("int4 g32", "int4", 32), ("int4 g64", "int4", 64), ("int4 g128", "int4", 128)]


def model_bytes(model) -> int:
    seen, total = set(), 0
    for t in list(model.state_dict().values()):
        if isinstance(t, torch.Tensor) and t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def dynamic_bytes(model) -> int:
    """quantize_dynamic keeps packed weights in opaque objects: int8 weight + the float rest."""
    total = 0
    for m in model.modules():
        if callable(getattr(m, "_weight_bias", None)):
            w, b = m._weight_bias()
            total += w.numel() + (b.numel() * 4 if b is not None else 0)
        else:
            total += sum(t.numel() * t.element_size() for t in m.parameters(recurse=False))
            total += sum(t.numel() * t.element_size() for t in m.buffers(recurse=False))
    return total


def variant(model, kind, group):
    if kind is None:
        return model
    if kind == "dynamic":
        return dynamic_int8(model)
    quantized = quantize_model(model, kind, group)
    if kernels()[8 if kind == "int8" else 4]:
        use_path(quantized, "kernel")  # the kernels' speed; the default path widens the weights per product
    return quantized


def decode_rate(model, prompt: int, new: int, runs: int) -> float:
    ids = torch.randint(0, model.config.vocab_size, (1, prompt), generator=torch.Generator().manual_seed(0))

    def timed(n):
        start = time.perf_counter()
        with torch.no_grad():
            generate(model, ids, max_new_tokens=n, stop_tokens=[])
        return time.perf_counter() - start
    timed(2)  # warm-up: the kernels' layouts, the path tables
    rates = [(new - 1) / max(timed(new) - timed(1), 1e-9) for _ in range(runs)]
    return statistics.median(rates)


def predicted_decode_s(config, device) -> float:
    lg = ledger(config, Workload(phase="decode", batch=1, seq=64))
    return roofline(lg, device).time_s


def validation_loss(model, source, batches: int, rows: int) -> float:
    runner = runner_for(model)
    total = count = 0.0
    with torch.no_grad():
        for batch in source.eval_batches(batches, rows):
            n = int((batch.targets >= 0).sum())
            total += runner.loss(batch).item() * n
            count += n
    return total / count


def profile_step(model) -> str:
    from torch.profiler import ProfilerActivity, profile  # deferred: only with --profile
    ids = torch.randint(0, model.config.vocab_size, (1, 32))
    with torch.no_grad():
        generate(model, ids, max_new_tokens=2, stop_tokens=[])
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            generate(model, ids, max_new_tokens=2, stop_tokens=[])
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--prompt", type=int, default=32)
    p.add_argument("--new", type=int, default=64)
    p.add_argument("--steps", type=int, default=300, help="char-small training steps")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--profile", action="store_true")
    p.add_argument("--json", default=None)
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    m = _results.machine()
    print(_results.header(m))
    try:
        device = resolve_hardware("measured")
        where = "measured profile"
    except Exception:  # no saved `tformer bench` profile: this CPU's spec-table roofs
        device = resolve_hardware("cpu")
        where = "spec table"

    torch.manual_seed(0)
    gpt2 = build(preset("gpt2")).eval()
    rows, base_rate, base_pred = [], None, None
    for label, kind, group in VARIANTS:
        model = variant(gpt2, kind, group)
        nbytes = dynamic_bytes(model) if kind == "dynamic" else model_bytes(model)
        rate = decode_rate(model, args.prompt, args.new, args.runs)
        pred = None if kind == "dynamic" else predicted_decode_s(model.config, device)
        base_rate, base_pred = base_rate or rate, base_pred or pred
        rows.append({"variant": label, "bytes": nbytes, "tokens_per_s": rate, "speedup": rate / base_rate,
                     "predicted_speedup": base_pred / pred if pred else None})
        if args.profile and kind == "int8":
            print(profile_step(model))
        del model

    run = build_run("shakespeare", base_config("char-small", None, None, []), seq_len=128, seed=0)
    with tempfile.TemporaryDirectory() as out:
        Trainer(run.model, run.source, TrainArgs(out=out, max_steps=args.steps, batch_size=32, lr=2e-3,
                                                 eval_interval=10**9, log_interval=10**9)).run()
    char = run.model.eval()
    losses = {}
    for label, kind, group in VARIANTS:
        losses[label] = validation_loss(variant(char, kind, group), run.source, 20, 32)
    for r in rows:
        r["val_loss"] = losses[r["variant"]]

    print(f"\ngpt2 (124M, random init), batch 1, prompt {args.prompt}, {args.new} new tokens, median of {args.runs}; "
          f"roofline: {device.name} ({where}); char-small trained {args.steps} steps on Shakespeare")
    print(f"{'variant':<14}{'gpt2 bytes':>14}{'tokens/s':>10}{'speed-up':>10}{'predicted':>11}"
          f"{'char val loss':>15}{'change':>9}")
    for r in rows:
        loss = losses[r["variant"]]
        change = loss / losses["fp32"] - 1
        r.update(val_loss=loss, loss_change=change)
        pred = f"{r['predicted_speedup']:.2f}x" if r["predicted_speedup"] else "-"
        print(f"{r['variant']:<14}{r['bytes'] / 1e6:>11.1f} MB{r['tokens_per_s']:>10.2f}{r['speedup']:>9.2f}x"
              f"{pred:>11}{loss:>15.4f}{change * 100:>+8.2f}%")
    int8 = next(r for r in rows if r["variant"] == "int8")
    print(f"target: int8 decode >= 1.8x fp32: {int8['speedup']:.2f}x "
          f"({'reached' if int8['speedup'] >= 1.8 else 'not reached'})")
    _results.write("quantize", {"rows": rows, "steps": args.steps, "roofline_device": device.name},
                   m, args.json, not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
