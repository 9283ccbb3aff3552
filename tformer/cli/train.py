"""`tformer train`: train a model on real text (or a synthetic task), on CPU, GPU or many (torchrun)."""
import json
import math
from dataclasses import asdict
from pathlib import Path
from types import SimpleNamespace

from tformer.cli._source import check_output
from tformer.core.atomic import atomic_write_text, check_output_dir
from tformer.core.errors import TformerError
from tformer.cost.ledger import Workload, ledger
from tformer.machine import resolve_hardware

NAME = "train"
HELP = ("Train a model: causal LM (decoder, RNN), masked LM (encoder), seq2seq (encoder-decoder), an image "
        "classifier (ViT) or CLIP on images and captions; --objective picks span corruption, BART denoising, a prefix "
        "LM, or BERT's mlm+nsp / ALBERT's mlm+sop instead.")


def add_arguments(p) -> None:
    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.train.loop import TrainArgs
    from tformer.train.setup import RESUME_MAY_CHANGE

    d = TrainArgs()
    src = p.add_argument_group("model")
    src.add_argument("--preset", help="preset name (default char-small)")
    src.add_argument("--config", help="a tformer or Hugging Face config JSON")
    src.add_argument("--hf", help="fine-tune from a Hugging Face-format checkpoint directory")
    src.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    src.add_argument("--objective", help="causal | mlm | seq2seq | span-corruption | denoise | prefix-lm | "
                                         "mlm+nsp | mlm+sop (default: the architecture's own)")
    src.add_argument("--task", dest="objective",
                     help="the same as --objective, for images: image-classification (a ViT; default model "
                          "vit-digits) | contrastive (CLIP on images and captions; default model clip-digits)")
    data = p.add_argument_group("data")
    data.add_argument("--data",
                      help="shakespeare (default) | wikitext2 | tatoeba-en-es | copy | reverse | a text file or "
                           "folder; for images: digits (default) | an image folder (one subfolder of PNG/JPEG files "
                           "per class)")
    data.add_argument("--tokenizer", help="char (default) | bpe | gpt2 | a saved tokenizer folder")
    data.add_argument("--vocab-size", type=int, help="BPE vocabulary size")
    data.add_argument("--seq-len", type=int, help="tokens per training sequence (default: the model's context)")
    data.add_argument("--max-pairs", type=int, help="translation: use the first N training pairs")
    run = p.add_argument_group("run")
    run.add_argument("--out", default=d.out, help="output directory (checkpoints, metrics, final weights)")
    run.add_argument("--resume", action="store_true",
                     help="continue the run in --out exactly where it stopped, with its saved flags; only "
                          + ", ".join("--" + f.replace("_", "-") for f in RESUME_MAY_CHANGE) + " may change")
    run.add_argument("--max-steps", type=int)
    run.add_argument("--time-budget", type=float, help="stop after this many seconds of wall time")
    run.add_argument("--batch-size", type=int, help="sequences per optimizer step (global)")
    run.add_argument("--grad-accum", type=int, help="micro-batches per optimizer step")
    run.add_argument("--lr", type=float, help="peak learning rate (noam: multiplier)")
    run.add_argument("--min-lr", type=float, help="final learning rate of the cosine (default lr/10)")
    run.add_argument("--warmup", type=int, help="warm-up steps")
    run.add_argument("--schedule", help="cosine | linear | noam | constant")
    run.add_argument("--optimizer", help="adamw | adam | sgd | momentum")
    run.add_argument("--weight-decay", type=float)
    run.add_argument("--beta2", type=float)
    run.add_argument("--grad-clip", type=float, help="max gradient norm (0 = off)")
    run.add_argument("--label-smoothing", type=float)
    run.add_argument("--loss-chunk", type=int, metavar="ROWS",
                     help="form the LM head's logits ROWS token positions at a time, forward and backward: the same "
                          "loss and gradients without the whole (tokens x vocabulary) logits in memory (decoder-only "
                          "models; default 0: all at once)")
    run.add_argument("--eval-interval", type=int)
    run.add_argument("--eval-batches", type=int)
    run.add_argument("--log-interval", type=int)
    run.add_argument("--ckpt-interval", type=int)
    run.add_argument("--sample-interval", type=int, help="print a sample every N steps")
    run.add_argument("--seed", type=int)
    run.add_argument("--device", help="cpu | cuda | cuda:N")
    run.add_argument("--precision", help="fp32 | bf16 | fp16 (autocast)")
    run.add_argument("--compile", action="store_true", help="torch.compile the model")
    run.add_argument("--activation-checkpointing", action="store_true", help="recompute activations in backward")
    run.add_argument("--fsdp", action="store_true",
                     help="with torchrun: shard weights, gradients and optimizer state over the processes "
                          "(FSDP2) instead of a full copy each (DDP), for models too big for one device")
    run.add_argument("--no-progress", action="store_true",
                     help="plain log lines even on a terminal (the live bar is only drawn when stderr is a TTY)")


def run(args) -> int:
    # Inputs are never written: a run folder inside (or holding) a model, config, corpus or tokenizer is refused.
    check_output(args, args.out, flags=("--hf", "--config", "--data", "--tokenizer"))
    check_output_dir(args.out)  # refuse an unwritable --out in the first second, not after the work

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    import torch

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.measure.bench import torch_device
    from tformer.train import distributed
    from tformer.train.progress import TrainProgress
    from tformer.train.run_lock import run_lock

    out = Path(args.out)
    flags = _resolve_flags(args, out)  # before anything is written: a refused --resume changes nothing
    # Before any parallel op: OpenMP workers copy the floating-point mode when they start. Adam's
    # second moments decay into denormal floats, which x86 handles on a slow path (an optimizer
    # step measured here went from ~7 ms to ~1.6 s); flushing them to zero changes no result
    # that matters and is what GPUs do by default.
    torch.set_flush_denormal(True)
    # A name torch cannot parse ("tpu") is a RuntimeError at the first tensor; refuse it here in one line.
    # Under torchrun "cuda" later becomes each rank's own cuda:N, so only the check is kept.
    torch_device(flags.device)
    world = distributed.init_from_env(flags.device)
    # None = draw the live bar only if stderr is a terminal; off for other ranks and with --no-progress.
    progress = TrainProgress(enabled=False if flags.no_progress or world.rank != 0 else None)
    log = progress.print if world.rank == 0 else (lambda *_: None)
    # One writer per run folder; under torchrun rank 0 holds it for all (the ranks live and die together).
    with run_lock(out, note=log, enabled=world.rank == 0):
        code = _train(flags, out, world, log, progress)
    distributed.shutdown()
    return code


def _resolve_flags(args, out: Path) -> SimpleNamespace:
    """The flags this run trains with: the defaults, then (with --resume) the run's saved flags, then the
    flags typed on this command line; a typed flag that contradicts the saved run is refused."""

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.train.setup import RUN_ARGS, resume_args, saved_run_args

    defaults = _defaults()
    # argparse leaves untyped flags at None (False, [] for switches and --set): what is left was typed.
    given = {k: v for k, v in vars(args).items() if k in defaults and v is not None and v is not False and v != []}
    saved = saved_run_args(out) if args.resume else None
    if saved is None and _reads_images(given):
        defaults.update(IMAGE_DEFAULTS)
    merged = {**defaults, **(resume_args(saved, given, out / RUN_ARGS) if saved is not None else given)}
    return SimpleNamespace(**{k: merged[k] for k in defaults}, out=args.out, resume=args.resume)


# What an image run trains with unless told otherwise (flags typed win): vit-digits passed 95% held-out accuracy on
# digits by step 800 with these, clip-digits 97% zero-shot after 1500 steps (about a minute on one core).
IMAGE_DEFAULTS = {"batch_size": 64, "lr": 3e-3, "max_steps": 1500, "warmup": 100, "weight_decay": 0.05,
                  "eval_interval": 250, "ckpt_interval": 250, "log_interval": 50}


def _reads_images(given: dict) -> bool:
    """Whether the run's model reads images (so IMAGE_DEFAULTS apply): its config, as _train will build it."""

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.train.setup import base_config

    return base_config(given.get("preset"), given.get("config"), given.get("hf"), given.get("set", []),
                       given.get("objective")).traits.images


def _defaults() -> dict:
    """Every flag that defines a run, with its default (--out and --resume say which run, and how)."""

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.train.loop import TrainArgs

    train = {k: v for k, v in asdict(TrainArgs()).items() if k != "out"}
    return {"preset": None, "config": None, "hf": None, "set": [], "objective": None, "data": None,
            "tokenizer": "char",
            "vocab_size": None, "seq_len": None, "max_pairs": None, "no_progress": False, **train}


def _train(args, out: Path, world, log, progress) -> int:
    """Build, (resume,) train and report, inside the run's lock; the exit code."""

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.train.interrupt import exit_code, stop_on_signals, stopped_line
    from tformer.train.loop import TrainArgs, Trainer, find_checkpoint
    from tformer.train.setup import base_config, build_run, save_run_files

    device = args.device
    if device == "cuda" and world.size > 1:
        device = f"cuda:{world.local_rank}"
    config = base_config(args.preset, args.config, args.hf, args.set, args.objective)
    if config.traits.images and args.seq_len is not None:
        raise TformerError(f"--seq-len does not apply to images: {config.name} reads {config.image_tokens} tokens per "
                           "image (its patches and [CLS]); set the size with --set image_size=N / patch_size=N")
    data = args.data or ("digits" if config.traits.images else "shakespeare")
    seq_len = args.seq_len or config.max_positions
    if seq_len < 1:
        raise TformerError("--seq-len must be at least 1")
    targs = TrainArgs(**{k: getattr(args, k) for k in asdict(TrainArgs())})
    targs.device = device
    targs.validate()
    if args.resume:
        find_checkpoint(out)
    elif (out / "checkpoint").exists():
        raise TformerError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    run_ = build_run(data, config, seq_len, args.seed, args.tokenizer, args.vocab_size, args.hf, args.max_pairs,
                     args.objective)
    if run_.objective == "contrastive" and world.size > 1:
        # Each process would score its images against its own texts only: fewer negatives, a different loss.
        raise TformerError("contrastive training scores every image against every text of the batch, which one "
                           "process holds here; train CLIP in a single process (drop torchrun)")
    # An image's tokens are fixed by the config; CLIP's text tower reads captions of text_len tokens.
    ledger_seq = getattr(run_.source, "text_len", run_.source.tokens_per_row)
    flops, peak = _flops_and_peak(run_.model.config, ledger_seq, args, device, log)
    trainer = Trainer(run_.model, run_.source, targs, flops_per_step=flops, peak_flops=peak,
                      sampler=_sampler(run_) if run_.objective == "causal" else None, log=log, progress=progress)
    if args.resume:
        trainer.resume()  # before any file is written: a checkpoint that does not fit is refused here
    if world.rank == 0:
        save_run_files(out, run_, {"command": NAME, **vars(args), "train_args": asdict(targs)})
        n = run_.model.num_parameters()
        log(f"training {run_.model.config.name} ({run_.model.config.arch}, {n:,} parameters) on {data}: "
            f"{run_.objective} objective{_adds(run_.objective)}, {targs.batch_size} x {run_.source.tokens_per_row} tokens per step, "
            f"{world.size} process(es), {device}")
    with stop_on_signals(trainer):
        result = trainer.run()
    if "stopped_by" in result:
        launcher = f"torchrun --nproc_per_node={world.size} -m tformer" if world.size > 1 else "tformer"
        log(stopped_line(result, out, f"{launcher} train"))
        return exit_code(result["stopped_by"])
    if world.rank == 0 and run_.objective == "seq2seq":
        if trainer.fsdp:  # the sharded model cannot decode on rank 0 alone; the final weights can
            log(f"held-out decoding skipped under --fsdp; run `tformer translate --ckpt {out}`")
        else:
            _report_decoding(run_, out, log)
    if world.rank == 0 and run_.objective in IMAGE_REPORTS:
        IMAGE_REPORTS[run_.objective](run_, result, out, log)
    elif world.rank == 0 and "val_loss" in result:
        log(f"done: step {result['step']}, val loss {result['val_loss']:.4f} nats/token "
            f"(ppl {math.exp(min(result['val_loss'], 50)):.2f}); weights in {out / 'model.safetensors'}")
    return 0


def _adds(objective: str) -> str:
    """What the objective switched on in the model, for the run's first line."""

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.train.objectives import OBJECTIVES

    adds = OBJECTIVES[objective].adds if objective in OBJECTIVES else ""
    return f" ({adds})" if adds else ""


def _report_decoding(run_, out, log) -> None:
    """Decode held-out sources and score them (exact match; BLEU for text), saved to decode_eval.json."""

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.train.evaluate import decode_scores

    scores = decode_scores(run_.model.eval(), run_.source.val, run_.tokenizer)
    bleu = f", BLEU {scores.bleu:.1f}" if scores.bleu is not None else ""
    log(f"held-out decoding ({scores.pairs} pairs, greedy): exact match {scores.exact_match:.1%}{bleu}")
    for src, ref, hyp in scores.examples[:3]:
        log(f"  {src!r} -> {hyp!r} (reference {ref!r})")
    atomic_write_text(out / "decode_eval.json", json.dumps(asdict(scores), indent=1))


def _report_classifier(run_, result, out, log) -> None:
    """The classifier's held-out accuracy (the last evaluation's, over the whole held-out split by default)."""
    acc = result.get("val_accuracy")
    shown = f", held-out accuracy {acc:.1%} ({len(run_.source.val)} images)" if acc is not None else ""
    log(f"done: step {result['step']}, val loss {result.get('val_loss', float('nan')):.4f}{shown}; "
        f"weights in {out / 'model.safetensors'}")


def _report_contrastive(run_, result, out, log) -> None:
    """Zero-shot accuracy and recall@1/@5 both ways on the held-out pairs, printed and saved (contrastive_eval.json)."""

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.train.contrastive_eval import contrastive_scores

    source = run_.source
    pairs = source.held_out_pairs()
    scores = contrastive_scores(run_.model, pairs, source.val_labels, source.caption_ids, source.caption_mask)
    i2t, t2i = scores.image_to_text_recall, scores.text_to_image_recall
    log(f"held-out ({scores.pairs} image-caption pairs): zero-shot accuracy {scores.zero_shot_accuracy:.1%} "
        f"({scores.classes} classes, {scores.prompts_per_class} prompts each); recall@1/@5 image->text "
        f"{i2t['1']:.1%}/{i2t['5']:.1%}, text->image {t2i['1']:.1%}/{t2i['5']:.1%}")
    atomic_write_text(out / "contrastive_eval.json", json.dumps(scores.as_dict(), indent=1))
    log(f"done: step {result['step']}, val loss {result.get('val_loss', float('nan')):.4f}; "
        f"scores in {out / 'contrastive_eval.json'}, weights in {out / 'model.safetensors'}")


IMAGE_REPORTS = {"image-classification": _report_classifier, "contrastive": _report_contrastive}


def _flops_and_peak(config, seq, args, device, log):
    """Training FLOPs per step from the ledger (``seq``: tokens per row) and this device's peak, for the MFU column."""
    flops = ledger(config, Workload(phase="train", batch=args.batch_size, seq=seq)).flops["matmul"]
    dtype = "bf16" if args.precision == "bf16" else "fp32"
    try:
        peak = resolve_hardware("measured").peak(dtype)
        log(f"MFU is measured against this machine's measured {dtype} matmul peak ({peak / 1e9:,.0f} GFLOP/s)")
    except Exception:
        peak = None
        log("MFU not shown: no measured peak for this machine yet (run `tformer bench --quick`)")
    return flops, peak


def _sampler(run_):
    """A short continuation of a newline, printed during training, to see what the model has learnt."""
    tok = run_.tokenizer

    def sample(model):
        # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
        from tformer.generate import generate

        prompt = tok.encode("\n") or [0]
        out = generate(model, [prompt], max_new_tokens=200, do_sample=True, temperature=0.8, top_k=40, seed=0)
        return repr(tok.decode(prompt + out.sequences[0]))

    return sample
