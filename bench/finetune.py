"""Fine-tuning all-MiniLM-L6-v2 (the packaged real weights) on line-level authorship, Shakespeare vs Milton, split by
passage (tformer.data.authorship): full fine-tuning, head only, BitFit, LoRA r = 4/8/16, adapters and prompt tuning, the
same steps each. One table: trainable parameters, peak training memory (ledger predicted vs measured), time per
step, held-out accuracy on the test passages' lines.

    python bench/finetune.py                 # 60 steps of batch 16 per method; minutes on a 2-core CPU
    python bench/finetune.py --steps 400 --eval-rows 0    # the filed figures: about 8 minutes on a 2-core Xeon
    python bench/finetune.py --steps 600 --eval-rows 0     # longer, and the whole test split

Measured peak: the tensor bytes alive before a training step (weights, optimizer state) plus the peak of what the
step allocates above them (tformer.measure.memory_peak: every tensor the forward, backward and optimizer step create,
on the CPU). Predicted: the ledger's peak training memory at the batch's mean
tokens per row, under the method (tformer.cost.peft.training_memory: gradients and optimizer state only for what
trains; activations less what frozen parts need not keep).
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402  (bench/_results.py)
import torch  # noqa: E402

from tformer.adapt import trainable_parameters  # noqa: E402
from tformer.core.peft import PeftSpec  # noqa: E402
from tformer.cost.ledger import Workload  # noqa: E402
from tformer.cost.peft import training_memory  # noqa: E402
from tformer.measure.memory_peak import PeakTensorMemory  # noqa: E402
from tformer.train.finetune import build_finetune, held_out_scores  # noqa: E402
from tformer.train.loop import TrainArgs, Trainer  # noqa: E402

ROWS = [("full", PeftSpec(method="full")), ("head only", PeftSpec(method="head")),
        ("BitFit", PeftSpec(method="bitfit")),
        *[(f"LoRA r={r}", PeftSpec(method="lora", rank=r, alpha=float(r))) for r in (4, 8, 16)],
        ("adapters", PeftSpec(method="adapter", bottleneck=64)), ("prompt tuning", PeftSpec(method="prompt"))]
LR = {"full": 5e-5, "prompt": 1e-2}  # as `tformer finetune`; every other method 1e-3
WARM_STEPS = 2  # the first steps pay one-off costs (allocator, thread pools); not timed


def predicted_bytes(model, source, spec: PeftSpec, batch: int) -> int:
    """The ledger's peak training memory of fine-tuning ``model`` by ``spec`` (tformer.cost.peft)."""
    return int(training_memory(model.config, spec, Workload(phase="train", batch=batch, seq=source.tokens_per_row))
               ["total"])


def live_bytes(model, optimizer) -> int:
    tensors = {id(p): p for p in model.parameters()}
    for state in optimizer.state.values():
        tensors.update({id(t): t for t in state.values() if isinstance(t, torch.Tensor)})
    return sum(t.numel() * t.element_size() for t in tensors.values())


def bench_row(label: str, spec: PeftSpec, args) -> dict:
    run_ = build_finetune("all-minilm-l6-v2", "authorship", spec=spec, max_len=args.max_len, seed=args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-finetune-") as out:
        targs = TrainArgs(out=out, max_steps=args.steps, batch_size=args.batch, lr=LR.get(spec.method, 1e-3),
                          warmup=max(args.steps // 10, 1), weight_decay=0.01, eval_interval=args.steps,
                          ckpt_interval=args.steps, log_interval=args.steps, seed=args.seed)
        trainer = Trainer(run_.model, run_.source, targs, log=lambda *_: None)
        times = []
        for _ in range(WARM_STEPS):
            trainer.train_step()  # also creates the optimizer state the measured peak counts
        before = live_bytes(run_.model, trainer.optimizer)
        with PeakTensorMemory() as peak:
            trainer.train_step()
        while trainer.step < args.steps:
            start = time.perf_counter()
            trainer.train_step()
            times.append(time.perf_counter() - start)
    predicted = predicted_bytes(run_.model, run_.source, spec, args.batch)
    batches = None if args.eval_rows == 0 else max(args.eval_rows // 64, 1)
    test = held_out_scores(run_.model, run_.source, "test", rows=64, batches=batches)
    return {"method": label, "trainable_parameters": trainable_parameters(run_.model),
            "parameters": run_.model.num_parameters(), "predicted_peak_bytes": predicted,
            "measured_peak_bytes": before + peak.peak,
            "step_s": statistics.median(times) if times else None, "test_accuracy": test["accuracy"],
            "test_rows": test["rows"]}


def table_rows(records: list[dict]) -> list[list[str]]:
    rows = []
    for r in records:
        step = f"{r['step_s'] * 1000:,.0f} ms" if r["step_s"] is not None else "-"
        rows.append([r["method"], f"{r['trainable_parameters']:,} ({r['trainable_parameters'] / r['parameters']:.2%})",
                     _mb(r["predicted_peak_bytes"]), _mb(r["measured_peak_bytes"]), step,
                     f"{r['test_accuracy']:.1%}"])
    return rows


def _mb(n: int) -> str:
    return f"{n / 1e6:,.0f} MB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per method (default 60)")
    parser.add_argument("--batch", type=int, default=16, help="lines per step (default 16)")
    parser.add_argument("--max-len", type=int, default=64, help="tokens per line at most (default 64)")
    parser.add_argument("--eval-rows", type=int, default=512,
                        help="test lines scored (default 512; 0 = the whole test split)")
    parser.add_argument("--methods", help="comma-separated row names to run (default: all), e.g. full,BitFit")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--json", help="also write the record to this file")
    parser.add_argument("--no-save", action="store_true", help="do not file the figures under bench/results/")
    args = parser.parse_args()
    if args.steps <= WARM_STEPS:
        parser.error(f"--steps must be more than {WARM_STEPS} (the untimed warm-up steps)")
    torch.set_flush_denormal(True)
    m = _results.machine()
    print(_results.header(m))
    chosen = {s.strip().lower() for s in args.methods.split(",")} if args.methods else None
    records = []
    for label, spec in ROWS:
        if chosen is None or label.lower() in chosen or spec.method in chosen:
            records.append(bench_row(label, spec, args))
            print(f"  {label}: done", flush=True)
    print(f"\nall-MiniLM-L6-v2 on authorship (Shakespeare vs Milton lines; test lines from passages never seen in "
          f"training), {args.steps} steps of {args.batch}, at most {args.max_len} tokens per line")
    print(_results.table(["method", "trainable parameters", "peak memory predicted", "measured", "time/step",
                          "held-out accuracy"], table_rows(records)))
    record = {"steps": args.steps, "batch": args.batch, "max_len": args.max_len, "eval_rows": args.eval_rows,
              "rows": records}
    _results.write("finetune", record, m, args.json, not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
