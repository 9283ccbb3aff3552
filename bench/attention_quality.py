"""What the sparse and approximate attention kinds cost in quality: a small char model trained on
Shakespeare with each kind, the same steps, seed, data and size as exact attention (sdpa), and the
validation loss of each beside exact attention's.

    python bench/attention_quality.py                 # 300 steps per kind (about a minute per kind on 2 cores)
    python bench/attention_quality.py --quick         # 60 steps
    python bench/attention_quality.py --kinds sliding,performer --steps 500

The model: a 2-layer decoder, d_model 64, 4 heads, context 128 characters, AdamW; every kind gets the
same initial weights for the layers it shares (one seed) and the same batches. The kinds' settings
are tformer.measure.attention_sweep.QUALITY_SETTINGS (a window of 32, not 256: at 128 characters a
256-token window is full attention). A kind that cannot be causal (Linformer) cannot train a
left-to-right char model and is listed as skipped.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

from tformer.core.attention_kinds import ATTN_KINDS
from tformer.core.config import preset
from tformer.core.errors import TformerError
from tformer.measure.attention_sweep import (
    QUALITY_HEADERS,
    QUALITY_SETTINGS,
    available_kinds,
    kind_settings,
    quality_rows,
)
from tformer.model import runner_for
from tformer.train import build_run

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402  (bench/_results.py: the machine header and bench/results/ files)

MODEL = {"n_layers": 2, "d_model": 64, "n_heads": 4, "d_ff": 256, "max_positions": 128, "dropout": 0.0,
         "attention_dropout": 0.0}
EXACT = "sdpa"


def train_one(kind: str, steps: int, batch: int, seq: int, seed: int, eval_batches: int, lr: float) -> dict:
    """Validation loss (nats per character) of a char model trained ``steps`` steps with attention ``kind``."""
    config = preset("char-small").replace(**MODEL, attn_impl=kind, **kind_settings(kind, QUALITY_SETTINGS))
    run = build_run("shakespeare", config, seq_len=seq, seed=seed)
    model, runner = run.model, runner_for(run.model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.1)
    started = time.perf_counter()
    model.train()
    for step in range(steps):
        for group in optimizer.param_groups:  # cosine from lr to lr / 10
            group["lr"] = lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / steps)))
        loss = runner.loss(run.source.next_batch(batch))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    model.eval()
    with torch.no_grad():
        losses = [float(runner.loss(b)) for b in run.source.eval_batches(eval_batches, batch)]
    return {"kind": kind, "family": ATTN_KINDS[kind].family, "settings": kind_settings(kind, QUALITY_SETTINGS),
            "train_loss": loss.item(), "val_loss": sum(losses) / len(losses), "seconds": time.perf_counter() - started}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=None, help="optimizer steps per kind (default 300, --quick 60)")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--kinds", default=None, help="comma-separated kinds (default: every sparse and approximate one)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--eval-batches", type=int, default=None, help="validation batches (default 20, --quick 5)")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--json", default=None)
    p.add_argument("--no-save", action="store_true", help="do not file the figures under bench/results/")
    args = p.parse_args(argv)
    steps = args.steps or (60 if args.quick else 300)
    evals = args.eval_batches or (5 if args.quick else 20)
    machine = _results.machine()
    print(_results.header(machine))
    try:
        wanted = [k.strip() for k in args.kinds.split(",")] if args.kinds else \
            [k for k, info in ATTN_KINDS.items() if info.family != "exact"]
        kinds, notes = available_kinds([EXACT] + [k for k in wanted if k != EXACT])
        notes += [f"{k}: cannot be causal, so it cannot train a left-to-right char model (skipped)"
                  for k in kinds if not ATTN_KINDS[k].causal]
        kinds = [k for k in kinds if ATTN_KINDS[k].causal]
        print(f"char model {MODEL['n_layers']} layers x d_model {MODEL['d_model']}, {MODEL['n_heads']} heads, "
              f"{args.seq} characters, batch {args.batch}, {steps} steps, seed {args.seed}, shakespeare")
        results = []
        for kind in kinds:
            results.append(train_one(kind, steps, args.batch, args.seq, args.seed, evals, args.lr))
            print(f"  {kind}: validation loss {results[-1]['val_loss']:.3f} ({results[-1]['seconds']:.0f} s)")
    except TformerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"  {note}")
    record = {"exact": EXACT, "steps": steps, "batch": args.batch, "seq": args.seq, "seed": args.seed,
              "eval_batches": evals, "model": MODEL, "kinds": results, "skipped": notes}
    rows = quality_rows(record)
    print("\n" + _results.table(QUALITY_HEADERS, rows))
    _results.write("attention_quality", record, machine, args.json, not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
