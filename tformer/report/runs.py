"""The report's measurements of the model on this machine: a short training run, per-op profiles of
a training step, a prefill and a decode step, decode cost against context with and without the KV
cache, real generation, and the attention maps. Each returns plain data for the sections."""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import torch

from tformer.core.attention_kinds import ATTN_KINDS
from tformer.core.errors import TformerError
from tformer.cost.ledger import Workload, ledger
from tformer.cost.roofline import roofline
from tformer.generate import generate
from tformer.measure.profile import profile_model
from tformer.measure.step import StepRunner
from tformer.report.attention_maps import attention_maps
from tformer.train.loop import TrainArgs, Trainer
from tformer.train.parallel_check import can_run, run_probe
from tformer.train.setup import build_run


class CharTokenizer:
    """For an untrained model (--no-train, or an architecture the report does not train): the
    sentence's own characters as ids, so the maps have labels without preparing a corpus."""

    def __init__(self, text: str, vocab_size: int):
        chars = sorted(set(text))
        self.to_id = {c: i % vocab_size for i, c in enumerate(chars)}
        self.to_char = {i % vocab_size: c for i, c in enumerate(chars)}

    def encode(self, text: str) -> list[int]:
        return [self.to_id[c] for c in text if c in self.to_id]

    def decode(self, ids: list[int]) -> str:
        return "".join(self.to_char.get(i, "?") for i in ids)


def can_train(ctx) -> tuple[bool, str]:
    """Whether the report trains this model, and why not when it does not."""
    if not ctx.options.train:
        return False, "--no-train was given"
    if ctx.config.traits.objective != "causal":
        return False, (f"the report's training run is next-character prediction on {ctx.options.data}, which needs a "
                       f"decoder; train a {ctx.config.arch} with `tformer train`")
    need = ctx.ledgers["train"].memory["total"]
    have = ctx.measured.memory_bytes or ctx.specs.memory.total_bytes
    if have and need > have // 2:
        return False, (f"one training step needs {need / 2**30:.3g} GiB by the ledger, more than half of this "
                       f"device's {have / 2**30:.3g} GiB")
    return True, ""


def training_run(ctx) -> dict:
    """Train on the corpus for the time budget; returns the metrics, the trained model and tokenizer."""

    opts, w = ctx.options, ctx.workloads["train"]
    ctx.say(f"training on {opts.data} for {opts.train_budget:.0f} s")
    run = build_run(opts.data, ctx.config, w.seq, opts.seed, "char")
    trained_config = run.model.config
    flops = ledger(trained_config, w).flops["matmul"]
    peak = ctx.measured.peak(ctx.dtype)
    quick = opts.quick
    with tempfile.TemporaryDirectory(prefix="tformer-report-train-") as tmp:
        args = TrainArgs(out=tmp, max_steps=10**9, time_budget=opts.train_budget, batch_size=w.batch,
                         schedule="constant", warmup=5 if quick else 20, lr=1e-3,
                         eval_interval=10 if quick else 25, eval_batches=2 if quick else 4,
                         log_interval=2 if quick else 5, ckpt_interval=10**9, seed=opts.seed,
                         device=ctx.torch_device)
        trainer = Trainer(run.model, run.source, args, flops_per_step=flops, peak_flops=peak, log=lambda *_: None)
        t0 = time.perf_counter()
        final = trainer.run()
        wall = time.perf_counter() - t0
        path = Path(tmp) / "metrics.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    steps = final["step"]
    tokens = steps * w.batch * run.source.tokens_per_row
    rates = [r["tokens_per_s"] for r in records if "tokens_per_s" in r]
    mfus = [r["mfu"] for r in records if "mfu" in r]
    return {"model": run.model, "tokenizer": run.tokenizer, "config": trained_config, "records": records,
            "steps": steps, "wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "tokens_per_s_median": statistics.median(rates) if rates else None,
            "mfu_median": statistics.median(mfus) if mfus else None, "flops_per_step": flops,
            "first_loss": records[0]["train_loss"] if records else None,
            "last_loss": records[-1]["train_loss"] if records else None,
            "val_loss": final.get("val_loss"), "best_val_loss": final.get("best_val_loss"),
            "lr": args.lr, "schedule": args.schedule, "warmup": args.warmup, "budget_s": opts.train_budget}


def profiles(ctx) -> dict:
    """`tformer profile` of a training step, a prefill and one decode step (encoders: a forward)."""
    quick = ctx.options.quick
    steps, warmup, op_steps = (2, 1, 1) if quick else (4, 2, 2)
    out = {}
    names = ["train"] + (["prefill", "decode"] if "decode" in ctx.workloads else ["forward"])
    for name in names:
        ctx.say(f"profiling one {name} step op by op")
        out[name] = profile_model(ctx.config, ctx.workloads[name], device=ctx.torch_device, hardware=ctx.measured,
                                  steps=steps if name == "train" else steps + 2, warmup=warmup, op_steps=op_steps)
    return out


PARALLEL_PROCESSES = 2


def parallel_run(ctx) -> dict | None:
    """A measured 2-process training run (DDP, FSDP2 full_shard, shard_grad_op over gloo) of the report's
    model, the report's batch split over the replicas; None (and the reason in ctx.results) when it
    cannot run here or fails: the rest of the report never depends on it."""
    if not ctx.options.distributed:
        ctx.results["distributed_skip_reason"] = "skipped (--no-distributed)"
        return None
    ok, why = can_run(PARALLEL_PROCESSES)
    if not ok:
        ctx.results["distributed_skip_reason"] = why
        return None
    w = ctx.workloads["train"]
    batch = max(1, w.batch // PARALLEL_PROCESSES)
    warmup, steps = (1, 2) if ctx.options.quick else (2, 5)
    ctx.say(f"measuring {PARALLEL_PROCESSES} processes (DDP, FSDP2) over gloo, {batch} x {w.seq} per replica")
    try:
        return run_probe(ctx.config, PARALLEL_PROCESSES, batch, w.seq, warmup, steps)
    except TformerError as e:
        ctx.results["distributed_skip_reason"] = str(e)
        return None


def decode_contexts(seq: int, points: int) -> list[int]:
    """Contexts from 1 to seq - 1, spread evenly on a log scale (the cost grows linearly in n)."""
    top = seq - 1
    if top <= 1:
        return [max(top, 0)]
    out = sorted({max(1, round(top ** (i / (points - 1)))) for i in range(points)} | {top})
    return out


def _median_time(runner, sync, reps: int, cap_s: float) -> float:
    """Median seconds of ``runner.step()`` after one warm-up, over at most ``reps`` runs and about
    ``cap_s`` seconds (at least one run): a loaded machine gets fewer samples, not a longer report."""
    runner.step()
    times = []
    spent = 0.0
    while len(times) < reps and (not times or spent < cap_s):
        sync()
        t0 = time.perf_counter()
        runner.step()
        sync()
        times.append(time.perf_counter() - t0)
        spent += times[-1]
    return statistics.median(times)


def decode_curve(ctx) -> list[dict]:
    """Seconds per new token at context n: one cached decode step, and (no cache) a full forward over
    the n + 1 tokens, each measured and predicted by the roofline on the measured roofs."""
    seq = ctx.workloads["decode"].seq
    contexts = decode_contexts(seq, 4 if ctx.options.quick else 6)
    reps, cap = (3, 0.3) if ctx.options.quick else (5, 0.6)
    sync = (lambda: torch.cuda.synchronize(ctx.torch_device)) if ctx.is_gpu else (lambda: None)
    rows = []
    ctx.say(f"timing decode at contexts {contexts}")
    for n in contexts:
        dec = Workload(phase="decode", batch=1, seq=n + 1, context=n)
        full = Workload(phase="forward", batch=1, seq=n + 1)
        lg_dec, lg_full = ledger(ctx.config, dec), ledger(ctx.config, full)
        row = {"context": n, "flops_cache": lg_dec.flops["total"], "flops_nocache": lg_full.flops["total"],
               "kv_cache_bytes": lg_dec.memory["kv_cache"],
               "predicted_cache_s": roofline(lg_dec, ctx.measured).time_s,
               "predicted_nocache_s": roofline(lg_full, ctx.measured).time_s}
        row["measured_cache_s"] = _median_time(StepRunner(ctx.config, dec, device=ctx.torch_device), sync, reps, cap)
        row["measured_nocache_s"] = _median_time(StepRunner(ctx.config, full, device=ctx.torch_device), sync, reps, cap)
        rows.append(row)
    return rows


SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 40, "seed": 0}  # a readable sample, repeatable
GENERATION_BUDGET_S = {True: 4.0, False: 12.0}  # --quick: seconds of real decoding the report may spend
GENERATION_TOKENS = {True: 40, False: 96}


def generation_tokens(ctx) -> int:
    """New tokens to generate: as many as the budget allows at the per-token cost the decode curve
    just measured (a loaded machine gets a shorter sample, not a longer report)."""
    quick = ctx.options.quick
    curve = ctx.results.get("decode_curve") or []
    per_token = 0.0
    if curve:
        per_token = curve[-1]["measured_cache_s"]
        if not quick:  # the no-cache run recomputes prefixes of every length: their mean cost
            per_token += statistics.mean(r["measured_nocache_s"] for r in curve)
    fits = int(GENERATION_BUDGET_S[quick] / per_token) if per_token > 0 else GENERATION_TOKENS[quick]
    return max(8, min(GENERATION_TOKENS[quick], fits))


def generation(ctx, model, tokenizer, trained: bool) -> dict:
    """Real generation from the (trained) model with and without the KV cache, tokens/s measured."""
    seq = ctx.workloads["decode"].seq
    prompt_text = ctx.options.sentence
    prompt = tokenizer.encode(prompt_text)[: max(1, seq // 4)]
    new = max(1, min(seq - len(prompt), generation_tokens(ctx)))
    out = {"prompt_tokens": len(prompt), "new_tokens": new, "trained": trained, "sampling": dict(SAMPLING)}
    cfg = model.config
    ctx.say(f"generating {new} tokens" + (" with the KV cache" if ctx.options.quick else " with and without the KV cache"))
    # Without a cache each token recomputes the whole prefix; --quick leaves that to the decode curve.
    for use_cache in ((True,) if ctx.options.quick else (True, False)):
        extra = {}
        if cfg.traits.seq2seq:  # the prompt is the source; the target starts from the start token
            start = cfg.decoder_start_token_id if cfg.decoder_start_token_id is not None else (cfg.bos_token_id or 0)
            extra["decoder_input_ids"] = [[start]]
        g = generate(model, [prompt], max_new_tokens=new, use_cache=use_cache, **SAMPLING, **extra)
        key = "cache" if use_cache else "nocache"
        out[key] = {"prefill_s": g.prefill_seconds, "decode_s": g.decode_seconds, "decode_tokens": g.decode_tokens,
                    "decode_tokens_per_s": g.decode_tokens_per_s, "prefill_tokens_per_s": g.prefill_tokens_per_s,
                    "cache_bytes": g.cache_bytes,
                    "text": tokenizer.decode(([] if cfg.traits.seq2seq else prompt) + g.sequences[0])}
    # The ledger's prediction for the same generation: one decode step per new token after the first
    # (the first comes from the prefill), at contexts len(prompt) .. len(prompt) + new - 2.
    steps = out["cache"]["decode_tokens"]
    t_cache = t_nocache = 0.0
    for i in range(steps):
        n = len(prompt) + i
        t_cache += roofline(ledger(cfg, Workload(phase="decode", batch=1, seq=n + 1, context=n)), ctx.measured).time_s
        if "nocache" in out:
            t_nocache += roofline(ledger(cfg, Workload(phase="forward", batch=1, seq=n + 1)), ctx.measured).time_s
    out["predicted_cache_tokens_per_s"] = steps / t_cache if t_cache > 0 else None
    out["predicted_nocache_tokens_per_s"] = steps / t_nocache if t_nocache > 0 else None
    return out


def head_maps(ctx, model, tokenizer):
    """Attention weights of the first and the last layer (up to 8 heads each) on the sentence: what the
    model looks at first, and what it has built by the end."""
    kind = model.config.attn_impl
    if ATTN_KINDS[kind].family != "exact":
        ctx.notes.append(f"no attention maps: this model runs '{kind}' attention, which never forms the full "
                         "softmax weights the maps show")
        return []
    sentence = ctx.options.sentence
    limit = ctx.workloads["train"].seq
    ids = tokenizer.encode(sentence)
    if len(ids) > limit:
        # Failing here would throw away minutes of measurement: show the first `limit` tokens, and say so.
        sentence = tokenizer.decode(ids[:limit])
        ctx.notes.append(f"the attention maps use the first {limit} of the sentence's {len(ids)} tokens "
                         f"(the context analysed here is {limit})")
    ctx.results["sentence"] = sentence
    maps = attention_maps(model, tokenizer, sentence, layer=None, max_heads=8)
    n_layers = maps[0].n_layers if maps else 0
    keep = sorted({0, n_layers - 1})
    return [m for m in maps if m.layer in keep]


__all__ = ["CharTokenizer", "can_train", "decode_contexts", "decode_curve", "generation", "head_maps", "profiles",
           "training_run"]
