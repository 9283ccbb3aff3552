"""Pruning, measured: sparsity against validation loss for magnitude pruning, and smaller models from removing
attention heads and FFN neurons, with the ledger's parameters and FLOPs beside the measured speed.

    python bench/prune.py              # about 2-4 minutes on 2 cores with bench/distill.py's teacher cached
    python bench/prune.py --quick      # fewer timing repeats and validation batches
    python bench/prune.py --threads 1  # steadier on a machine other work is using

The model: bench/_char_teacher.py's char-level Shakespeare teacher (4 layers, d_model 128, 4 heads, d_ff 512),
trained here with the project's loop if tformer's cache does not hold it yet. No fine-tuning after pruning: the
losses are what each cut costs the trained weights as they are.

Two tables. Unstructured (tformer.adapt.prune.magnitude_prune): 0/30/50/70/90% of the stacks' Linear weights
zeroed, ranked over all of them (global) or within each matrix (per layer); heads and embeddings kept. The shapes
stay, so the ledger's FLOPs and the forward time stay too: dense kernels multiply the zeros all the same.
Structured (prune_structured): 0/1/2 heads removed in every layer x 0/25/50% of every FFN's neurons, by weight
importance (norms), and the head rows again by gradient importance (Michel et al. 2019, on 4 training batches):
parameters and forward FLOPs from the ledger for the new config, the measured forward time of a batch and decode
tokens/s at batch 1 against the original's in the same run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from tformer.adapt.prune import importance, magnitude_prune, prune_structured
from tformer.core.errors import TformerError
from tformer.cost.ledger import Workload, ledger
from tformer.model import runner_for

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _char_teacher as char  # noqa: E402  (bench/_char_teacher.py: the trained model and the validation loss)
import _results  # noqa: E402  (bench/_results.py: the machine header and bench/results/ files)

SPARSITIES = (0.0, 0.3, 0.5, 0.7, 0.9)
HEADS = (0, 1, 2)
FFN = (0.0, 0.25, 0.5)
TEACHER_STEPS = 400  # bench/distill.py's default teacher: reused from the cache when it is there
MODES = {"reps": (5, 2), "decode_tokens": (48, 16)}  # (default, --quick)


def _paired(fns: list, reps: int) -> list[float]:
    """Best time of each of ``fns``, run in turn within every repeat: the original and the pruned model see the
    same load on a shared machine, so their ratio holds even when the absolute times drift."""
    for fn in fns:
        fn()  # warm-up
    best = [float("inf")] * len(fns)
    for _ in range(reps):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def _decoder(model, prompt, tokens: int):
    runner = runner_for(model)

    def decode():
        cache = runner.new_cache(1)
        logits = runner.prefill(cache, prompt)
        for _ in range(tokens):
            logits = runner.step(cache, logits.argmax(-1))

    return decode


@torch.no_grad()
def speed(original, model, batch, reps: int, decode_tokens: int) -> dict:
    """Forward time of ``batch`` (ms) and greedy decode tokens/s at batch 1 after an 8-token prompt, of ``model``
    and of ``original`` timed in turn (best of reps each); "speedup": original time / pruned time."""
    original.eval(), model.eval()
    fwd = _paired([lambda: model(**batch.inputs), lambda: original(**batch.inputs)], reps)
    prompt = batch.inputs["input_ids"][:1, :8]
    dec = _paired([_decoder(model, prompt, decode_tokens), _decoder(original, prompt, decode_tokens)], reps)
    return {"forward_ms": 1e3 * fwd[0], "forward_speedup": fwd[1] / fwd[0], "decode_tok_s": decode_tokens / dec[0],
            "decode_speedup": dec[1] / dec[0]}


def costs(config) -> dict:
    work = Workload(phase="forward", batch=char.BATCH, seq=char.SEQ)
    lg = ledger(config, work)
    return {"params": lg.params["total"], "forward_gflop": lg.flops["total"] / 1e9}


def unstructured(model, source, batch, mode) -> list[dict]:
    rows = []
    for per_layer in (False, True):
        for s in SPARSITIES:
            pruned, achieved = magnitude_prune(model, s, per_layer=per_layer)
            row = {"scope": "per layer" if per_layer else "global", "sparsity": s, "achieved": achieved["total"],
                   "min_layer": min(v for k, v in achieved.items() if k != "total"),
                   "max_layer": max(v for k, v in achieved.items() if k != "total"),
                   "val_loss": char.val_loss(pruned, source), **costs(pruned.config),
                   **speed(model, pruned, batch, mode["reps"], mode["decode_tokens"])}
            rows.append(row)
            print(f"  {row['scope']} {s:.0%}: val loss {row['val_loss']:.3f}, forward {row['forward_ms']:.1f} ms")
    return rows


def structured(model, source, batch, mode) -> list[dict]:
    by_weight = importance(model, "weight")
    by_grad = importance(model, "gradient", [source.next_batch(char.BATCH) for _ in range(4)])
    plan = [(h, f, "weight", by_weight) for h in HEADS for f in FFN] + [(h, 0.0, "gradient", by_grad) for h in (1, 2)]
    rows = []
    for heads, ffn, method, scores in plan:
        pruned = prune_structured(model, heads=heads, ffn=ffn, scores=scores)
        row = {"heads_removed": heads, "ffn_removed": ffn, "importance": method, "n_heads": pruned.config.n_heads,
               "d_ff": pruned.config.d_ff, "val_loss": char.val_loss(pruned, source), **costs(pruned.config),
               **speed(model, pruned, batch, mode["reps"], mode["decode_tokens"])}
        rows.append(row)
        print(f"  -{heads} heads, -{ffn:.0%} FFN ({method}): val loss {row['val_loss']:.3f}, "
              f"forward {row['forward_ms']:.1f} ms, decode {row['decode_tok_s']:.0f} tok/s")
    return rows


def tables(unstr: list[dict], struct: list[dict]) -> str:
    head_u = ["pruning", "sparsity", "achieved (min..max matrix)", "params", "GFLOP fwd", "forward ms",
              "val loss"]
    rows_u = [[r["scope"], f"{r['sparsity']:.0%}", f"{r['achieved']:.1%} ({r['min_layer']:.0%}..{r['max_layer']:.0%})",
               f"{r['params']:,}", f"{r['forward_gflop']:.2f}",
               f"{r['forward_ms']:.1f} ({r['forward_speedup']:.2f}x)", f"{r['val_loss']:.3f}"]
              for r in unstr]
    ref = struct[0]
    head_s = ["heads/layer", "d_ff", "importance", "params", "GFLOP fwd", "forward ms", "decode tok/s", "val loss"]
    rows_s = [[f"{r['n_heads']} (-{r['heads_removed']})", f"{r['d_ff']} (-{r['ffn_removed']:.0%})", r["importance"],
               f"{r['params']:,} ({r['params'] / ref['params']:.0%})",
               f"{r['forward_gflop']:.2f} ({r['forward_gflop'] / ref['forward_gflop']:.0%})",
               f"{r['forward_ms']:.1f} ({r['forward_speedup']:.2f}x)",
               f"{r['decode_tok_s']:.0f} ({r['decode_speedup']:.2f}x)", f"{r['val_loss']:.3f}"]
              for r in struct]
    return "\n\n".join([_results.table(head_u, rows_u), _results.table(head_s, rows_s)])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer timing repeats and decode tokens")
    p.add_argument("--teacher-steps", type=int, default=TEACHER_STEPS,
                   help="steps of the char model to prune (default 400: bench/distill.py's cached teacher)")
    _results.add_run_args(p)
    args = p.parse_args(argv)
    mode, machine = _results.begin(args, MODES)
    started = time.perf_counter()
    try:
        model, source, trained_s = char.teacher(args.teacher_steps)
        how = f"trained {args.teacher_steps} steps in {trained_s:.0f} s" if trained_s else "cached"
        print(f"model: {char.description(model.config)} ({how})")
        batch = source.next_batch(char.BATCH)
        print("unstructured (magnitude):")
        unstr = unstructured(model, source, batch, mode)
        print("structured (removed):")
        struct = structured(model, source, batch, mode)
    except TformerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    record = {"settings": {"quick": args.quick, "threads": torch.get_num_threads(), "teacher_steps": args.teacher_steps,
                           "batch": char.BATCH, "seq": char.SEQ, "data": char.DATA, **mode},
              "model": char.description(model.config), "unstructured": unstr, "structured": struct,
              "seconds": time.perf_counter() - started}
    print("\n" + tables(unstr, struct))
    print(f"({record['seconds']:.0f} s; (Nx): the original's time / this one's, timed in turn; forward: a batch of "
          f"{char.BATCH} x {char.SEQ}, best of {mode['reps']}; "
          f"decode: batch 1, {mode['decode_tokens']} tokens; val loss: nats per character, no fine-tuning after)")
    _results.write("prune", record, machine, args.json, not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
