"""Why attention, measured: an LSTM language model and a Transformer of equal parameter count, the same
data, seed, steps and optimiser, set side by side on this machine.

    python bench/rnn_vs_transformer.py            # about 5 minutes on 2 cores
    python bench/rnn_vs_transformer.py --quick    # about 1-2 minutes: the mechanics; too few steps to learn recall
    python bench/rnn_vs_transformer.py --threads 1    # steadier on a machine other work is using

The models (tformer.cost.rnn_vs_attention): the Transformer is a 4-layer decoder, d_model 128, 4 heads,
d_ff 512, learned positions up to 1024; the LSTM has 2 layers over a 128-wide embedding, its d_hidden
solved for with the ledger's parameter count (within 2%, not by trial). Both are built from the same seed
and trained with the same AdamW (tformer.measure.rnn_vs_attention.train_steps), batches and steps.

What it prints, one table (a row per quantity, a column per model):
  - training tokens/s at n = 64 ... 1024 (the same tokens per step at every n; forward + backward + AdamW;
    best of a few), each model's time per token against its own at n = 64 beside the ledger's FLOPs per
    token growth (the LSTM flat, attention's n^2 term), and the sequential steps per forward pass (L n for
    the LSTM, L for the Transformer): the complexity theorem, measured;
  - validation loss on the char-level Shakespeare corpus after the same training steps;
  - long-range recall accuracy per distance k (tformer.data.recall: a key-value pair shown once, the key
    queried every 8 tokens up to k = 512, the value never shown again; chance = 1/8);
  - the gradient norm of the last query's loss reaching the token embedding d positions back, at
    initialisation and after recall training.

Recall training mixes spans: each step draws one span from 8, 16, ..., 512 and trains on rows holding the
queries up to that span (prefix + span + 1 tokens). Rows of the longest span alone give attention at
initialisation a 1/500 share of the value and leave both models at chance within a bounded budget; short
rows teach the mechanism, long rows train its reach, and the mix costs about a third of training on the
longest rows only. Both models see the same batches; the evaluation uses full-length rows (every k).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from tformer.core.errors import TformerError
from tformer.cost.rnn_vs_attention import NS, model_pair, param_count, predicted_growth, relative_gap
from tformer.data.prepare import prepare
from tformer.data.recall import RecallTask, recall_batch
from tformer.measure.rnn_vs_attention import (
    MODELS,
    comparison_rows,
    gradient_reach,
    log_distances,
    recall_accuracy,
    recall_loss,
    train_steps,
    train_tokens_per_s,
)
from tformer.model import build, runner_for
from tformer.train import build_run

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402  (bench/_results.py: the machine header and bench/results/ files)

DATA = "shakespeare"
SPANS = (8, 16, 32, 64, 128, 256, 512)
SHOWN_K = SPANS
MODES = {  # (default, --quick)
    "lm_steps": (300, 40), "eval_batches": (20, 5), "recall_steps": (400, 100), "recall_eval_batches": (8, 2),
    "tokens_per_step": (4096, 2048), "timed_steps": (2, 2), "reps": (3, 3),
}


def config_fields(config) -> dict:
    """What the record keeps of a model's config: enough to rebuild the pair."""
    own = ("cell", "d_hidden") if config.arch == "rnn" else ("n_heads", "d_ff")
    return {f: getattr(config, f) for f in ("arch", "vocab_size", "d_model", "n_layers", "max_positions", *own)}


def throughput(configs: dict, ns, tokens: int, steps: int, reps: int, seed: int) -> dict:
    """Per model and n: measured tokens/s, time per token over its own at the first n, and the ledger's."""
    out = {"ns": list(ns), "tokens_per_step": tokens}
    for name, config in configs.items():
        torch.manual_seed(seed)
        model = build(config)
        rows = predicted_growth(config, ns)
        for r in rows:
            r["tokens_per_s"] = train_tokens_per_s(model, r["n"], tokens, steps, reps, seed)
            r["predicted_growth"] = r.pop("growth")
            print(f"  {name} n = {r['n']}: {r['tokens_per_s']:,.0f} tokens/s", flush=True)
        for r in rows:
            r["growth"] = rows[0]["tokens_per_s"] / r["tokens_per_s"]
        out[name] = rows
    return out


def language_model(configs: dict, steps: int, batch: int, seq: int, seed: int, eval_batches: int, lr: float) -> dict:
    """Validation loss (nats per character) of each model after ``steps`` steps on the same batches."""
    out = {}
    for name, config in configs.items():
        run = build_run(DATA, config, seq_len=seq, seed=seed)  # seeds torch, then builds the model
        model, runner = run.model, runner_for(run.model)
        started = time.perf_counter()
        losses = train_steps(model, lambda run=run, runner=runner: runner.loss(run.source.next_batch(batch)), steps, lr)
        with torch.no_grad():
            val = [float(runner.loss(b)) for b in run.source.eval_batches(eval_batches, batch)]
        out[name] = {"train_loss": losses[-1], "val_loss": sum(val) / len(val),
                     "seconds": time.perf_counter() - started}
        print(f"  {name}: validation loss {out[name]['val_loss']:.3f} ({out[name]['seconds']:.0f} s)", flush=True)
    return out


def recall(configs: dict, task: RecallTask, steps: int, batch: int, seed: int, eval_batches: int, lr: float) -> dict:
    """Accuracy per k after ``steps`` mixed-span steps, and the gradient reach at init and after."""
    probe_ids, probe_labels, _ = recall_batch(task, 8, torch.Generator().manual_seed(seed + 1), prefix=task.prefix)
    distances = log_distances(task.seq_len)
    out = {"distances": list(task.distances), "shown": list(SHOWN_K), "chance": 1 / task.n_values,
           "reach": {"distances": distances}}
    for name, config in configs.items():
        torch.manual_seed(seed)
        model = build(config)
        generator = torch.Generator().manual_seed(seed)

        def loss(model=model, generator=generator):  # bound now: called only in this iteration
            span = SPANS[int(torch.randint(0, len(SPANS), (1,), generator=generator))]
            ids, labels, _ = recall_batch(task.up_to(span), batch, generator)
            return recall_loss(model, ids, labels)

        curves = {"init": gradient_reach(model, probe_ids, probe_labels[:, -1])}
        started = time.perf_counter()
        losses = train_steps(model, loss, steps, lr)
        accuracy = recall_accuracy(model, task, eval_batches, batch, seed + 2)
        curves["trained"] = gradient_reach(model, probe_ids, probe_labels[:, -1])
        out[name] = [[k, a] for k, a in accuracy.items()]
        out["reach"][name] = {when: [c[d] for d in distances] for when, c in curves.items()}
        out.setdefault("train_loss", {})[name] = losses[-1]
        print(f"  {name}: recall at k = 8 / 512: {accuracy[8]:.0%} / {accuracy[512]:.0%} "
              f"({time.perf_counter() - started:.0f} s)", flush=True)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer steps and timings (about 2 minutes)")
    p.add_argument("--lm-steps", type=int, default=None, help="language-model steps per model (default 300, quick 40)")
    p.add_argument("--recall-steps", type=int, default=None, help="recall steps per model (default 400, quick 100)")
    p.add_argument("--batch", type=int, default=16, help="rows per step, both tasks")
    p.add_argument("--seq", type=int, default=128, help="language-model context in characters")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=1337)
    _results.add_run_args(p, "torch threads (default: torch's); 1 keeps the LSTM's small steps steady on a busy machine")
    args = p.parse_args(argv)
    mode, machine = _results.begin(args, MODES)
    mode["lm_steps"] = args.lm_steps or mode["lm_steps"]
    mode["recall_steps"] = args.recall_steps or mode["recall_steps"]
    started = time.perf_counter()
    try:
        vocab = prepare(DATA, "char").tokenizer().vocab_size
        lm = model_pair(vocab)
        task = RecallTask()
        rc = {name: config.replace(vocab_size=task.vocab_size) for name, config in lm.items()}
        counts = {name: param_count(config) for name, config in lm.items()}
        gap = relative_gap(counts["lstm"], counts["transformer"])
        recall_gap = relative_gap(param_count(rc["lstm"]), param_count(rc["transformer"]))
        print(f"LSTM: 2 layers, d_model {lm['lstm'].d_model}, d_hidden {lm['lstm'].d_hidden}: {counts['lstm']:,} "
              f"parameters; Transformer: {counts['transformer']:,} ({gap:.2%} apart; {recall_gap:.2%} with the "
              f"recall task's {task.vocab_size} tokens)")
        print(f"training throughput, {mode['tokens_per_step']} tokens per step:")
        tput = throughput(lm, NS, mode["tokens_per_step"], mode["timed_steps"], mode["reps"], args.seed)
        print(f"language model: {DATA}, {args.seq} characters, batch {args.batch}, {mode['lm_steps']} steps:")
        lm_result = language_model(lm, mode["lm_steps"], args.batch, args.seq, args.seed, mode["eval_batches"],
                                   args.lr)
        print(f"recall: k up to {max(task.distances)} ({task.seq_len} tokens), batch {args.batch}, "
              f"{mode['recall_steps']} steps:")
        rec = recall(rc, task, mode["recall_steps"], args.batch, args.seed, mode["recall_eval_batches"], args.lr)
    except TformerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    record = {
        "settings": {"quick": args.quick, "threads": torch.get_num_threads(), "seed": args.seed, "lr": args.lr,
                     "batch": args.batch, "lm_seq": args.seq, "data": DATA, "spans": list(SPANS), **mode,
                     "task": {"n_distractors": task.n_distractors, "n_keys": task.n_keys, "n_values": task.n_values,
                              "prefix": task.prefix, "seq_len": task.seq_len}},
        "models": {name: {"params": counts[name], "recall_params": param_count(rc[name]),
                          "config": config_fields(lm[name])} for name in MODELS},
        "param_gap": gap,
        "throughput": tput,
        "val_loss": {name: lm_result[name]["val_loss"] for name in MODELS},
        "lm": lm_result,
        "recall": {key: value for key, value in rec.items() if key != "reach"},
        "gradient_reach": rec["reach"],
        "seconds": time.perf_counter() - started,
    }
    headers, rows = comparison_rows(record)
    print("\n" + _results.table(headers, rows))
    print(f"({record['seconds']:.0f} s; recall chance {rec['chance']:.0%})")
    _results.write("rnn_vs_transformer", record, machine, args.json, not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
