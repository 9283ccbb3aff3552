"""`tformer finetune`: fine-tune a model (default: the packaged all-MiniLM-L6-v2) as a text classifier on labelled
lines (default: Shakespeare vs Milton authorship) by full training, a linear head, BitFit, LoRA, adapters, prompt or
prefix tuning; held-out accuracy at each evaluation and on the test split at the end."""
import json
import sys
from dataclasses import asdict, fields
from pathlib import Path
from types import SimpleNamespace

from tformer.cli._source import check_output
from tformer.core.atomic import atomic_write_text, check_output_dir
from tformer.core.errors import TformerError
from tformer.core.peft import DEFAULT_TARGETS, METHODS, PeftSpec

NAME = "finetune"
HELP = ("Fine-tune a pretrained model as a text classifier: full, head only, BitFit, LoRA, adapters, prompt or prefix "
        "tuning; default all-MiniLM-L6-v2 on line-level authorship (Shakespeare vs Milton, held-out passages).")

# What a fine-tuning run trains with unless told otherwise: a pretrained model needs few, small steps; the frozen
# methods train a few new parameters and take a larger learning rate (LoRA's and BitFit's papers use 1e-4 to 1e-3).
DEFAULTS = {"from_": "all-minilm-l6-v2", "task": "sequence-classification", "pooling": None, "set": [],
            "data": "authorship", "data_seed": 0, "max_len": 64, "method": "full", "rank": 8, "alpha": None,
            "lora_dropout": 0.0, "targets": ",".join(DEFAULT_TARGETS), "bottleneck": 64, "virtual_tokens": 20,
            "no_progress": False, "json": False}
RUN_DEFAULTS = {"max_steps": 300, "batch_size": 16, "lr": None, "warmup": 30, "weight_decay": 0.01,
                "eval_interval": 100, "eval_batches": 20, "log_interval": 10, "ckpt_interval": 100}
LR = {"full": 5e-5, "prompt": 1e-2, "prefix": 1e-2}  # every other method: 1e-3
# TrainArgs fields this command does not offer: an LM's label smoothing and chunked loss, samples, and the multi-process
# switches.
NOT_OFFERED = ("out", "label_smoothing", "loss_chunk", "sample_interval", "compile", "activation_checkpointing", "fsdp")
RESULT_FILE = "finetune.json"
ADAPTER_DIR = "adapter"  # adapter_config.json + adapter_model.safetensors of what trained (not for --method full)


def add_arguments(p) -> None:
    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.train.loop import TrainArgs
    from tformer.train.setup import RESUME_MAY_CHANGE

    m = p.add_argument_group("model")
    m.add_argument("--from", dest="from_", metavar="MODEL", help="all-minilm-l6-v2 (default; packaged real weights) | a preset | a "
                                                "tformer run folder | a Hugging Face model folder | a GGUF file "
                                                "or smollm2-135m-instruct (dequantized to fp32)")
    m.add_argument("--gguf", metavar="FILE|NAME", help="the same as --from with a GGUF file or packaged GGUF name")
    m.add_argument("--task", help="sequence-classification (default)")
    m.add_argument("--pooling", help="cls | mean | last (default: mean for all-minilm-l6-v2, as sentence-transformers "
                                     "pools it; else cls for encoders, last for decoders)")
    m.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config field")
    d = p.add_argument_group("data")
    d.add_argument("--data", help="authorship (default: Shakespeare vs Milton lines, split by passage) | a CSV or JSONL "
                                  "file with text and label columns")
    d.add_argument("--data-seed", type=int, help="the seed of the data's split and balancing (default 0)")
    d.add_argument("--max-len", type=int, help="tokens per text, [CLS] and [SEP] included (default 64)")
    f = p.add_argument_group("method")
    f.add_argument("--method", help=f"{' | '.join(METHODS)} (default full)")
    f.add_argument("--rank", type=int, help="LoRA rank r (default 8)")
    f.add_argument("--alpha", type=float, help="LoRA alpha: the update is scaled by alpha / r (default: r)")
    f.add_argument("--lora-dropout", type=float, help="dropout on LoRA's input (default 0)")
    f.add_argument("--targets", help=f"LoRA's target modules, comma-separated (default {','.join(DEFAULT_TARGETS)})")
    f.add_argument("--bottleneck", type=int, help="adapter bottleneck width (default 64)")
    f.add_argument("--virtual-tokens", type=int, help="prompt / prefix tuning: learned positions (default 20)")
    r = p.add_argument_group("run")
    r.add_argument("--out", default="runs/finetune", help="output directory (checkpoints, metrics, final weights)")
    r.add_argument("--resume", action="store_true",
                   help="continue the run in --out exactly where it stopped; only "
                        + ", ".join("--" + f.replace("_", "-") for f in RESUME_MAY_CHANGE if f not in NOT_OFFERED)
                        + " may change")
    for field in fields(TrainArgs):
        if field.name not in NOT_OFFERED:
            default = RUN_DEFAULTS.get(field.name, field.default)
            kind = float if field.default is None else type(field.default)  # None: an optional number of seconds
            flag = "--" + field.name.replace("_", "-")
            r.add_argument(flag, type=kind, help=f"default {_shown(field.name, default)}")
    r.add_argument("--no-progress", action="store_true", help="plain log lines even on a terminal")
    r.add_argument("--json", action="store_true", help="print the result (test accuracy, ...) as JSON on stdout")


def _shown(name: str, default) -> str:
    if name == "lr":
        return f"{LR['full']:g} for full, {LR['prompt']:g} for prompt and prefix, else 1e-3"
    return str(default)


def run(args) -> int:
    if args.gguf:
        if args.from_ and args.from_ != args.gguf:
            raise TformerError(f"--gguf {args.gguf} and --from {args.from_} name two models; pass one")
        args.from_ = args.gguf
    check_output(args, args.out, flags=("--from", "--data"))  # inputs are never written
    check_output_dir(args.out)  # refuse an unwritable --out in the first second, not after the work

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    import torch

    from tformer.train.progress import TrainProgress
    from tformer.train.run_lock import run_lock

    out = Path(args.out)
    flags = _resolve_flags(args, out)
    spec = peft_spec(flags)  # a bad method or size is refused before anything loads
    torch.set_flush_denormal(True)  # as `tformer train`: Adam's decaying moments are slow as denormals on x86
    progress = TrainProgress(enabled=False if flags.no_progress or flags.json else None)
    log = progress.print if not flags.json else _stderr
    with run_lock(out, note=log):
        return _finetune(flags, spec, out, log, progress)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)  # --json keeps stdout for the result


def peft_spec(flags) -> PeftSpec:
    targets = tuple(t.strip() for t in str(flags.targets).split(",") if t.strip())
    alpha = flags.alpha if flags.alpha is not None else float(flags.rank)
    return PeftSpec(method=flags.method, rank=flags.rank, alpha=alpha, dropout=flags.lora_dropout, targets=targets,
                    bottleneck=flags.bottleneck, virtual_tokens=flags.virtual_tokens)


def _resolve_flags(args, out: Path) -> SimpleNamespace:
    """Defaults, then (with --resume) the run's saved flags, then the flags typed now (a contradiction is refused)."""

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.train.loop import TrainArgs
    from tformer.train.setup import RUN_ARGS, resume_args, saved_run_args

    defaults = {**{k: v for k, v in asdict(TrainArgs()).items() if k not in NOT_OFFERED}, **RUN_DEFAULTS, **DEFAULTS}
    given = {k: v for k, v in vars(args).items() if k in defaults and v is not None and v is not False and v != []}
    saved = saved_run_args(out) if args.resume else None
    merged = {**defaults, **(resume_args(saved, given, out / RUN_ARGS) if saved is not None else given)}
    if merged["lr"] is None:
        merged["lr"] = LR.get(merged["method"], 1e-3)
    return SimpleNamespace(**{k: merged[k] for k in defaults}, out=args.out, resume=args.resume)


def _finetune(flags, spec: PeftSpec, out: Path, log, progress) -> int:
    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.adapt import save_adapter, trainable_parameters
    from tformer.adapt.peft import merged_weights
    from tformer.interop.checkpoint import save_model
    from tformer.measure.bench import torch_device
    from tformer.train.finetune import build_finetune, held_out_scores
    from tformer.train.interrupt import exit_code, stop_on_signals, stopped_line
    from tformer.train.loop import TrainArgs, Trainer, find_checkpoint
    from tformer.train.metrics import MetricsLog
    from tformer.train.setup import save_run_files

    torch_device(flags.device)
    targs = TrainArgs(**{k: getattr(flags, k) for k in asdict(TrainArgs()) if k not in NOT_OFFERED}, out=str(out))
    targs.validate()
    if flags.resume:
        find_checkpoint(out)
    elif (out / "checkpoint").exists():
        raise TformerError(f"{out} already holds a run; pass --resume to continue it or choose another --out")
    run_ = build_finetune(flags.from_, flags.data, flags.task, flags.pooling, spec, flags.max_len, flags.seed,
                          flags.set, flags.data_seed)
    trainer = Trainer(run_.model, run_.source, targs, log=log, progress=progress)
    if flags.resume:
        trainer.resume()
    save_run_files(out, run_, {"command": NAME, **vars(flags), "train_args": asdict(targs)})
    counts = run_.data.counts()
    trainable, total = trainable_parameters(run_.model), run_.model.num_parameters()
    head = "a new head (random init)" if run_.new_head else "its own head"
    log(f"fine-tuning {flags.from_} ({total:,} parameters, {trainable:,} trainable: {spec.method}) with {head} on "
        f"{run_.data.name}: classes {', '.join(run_.data.classes)}; train/validation/test rows "
        f"{sum(counts['train']):,}/{sum(counts['validation']):,}/{sum(counts['test']):,}; split {run_.data.note}")
    with stop_on_signals(trainer):
        result = trainer.run()
    if "stopped_by" in result:
        log(stopped_line(result, out, f"tformer {NAME}"))
        return exit_code(result["stopped_by"])
    test = held_out_scores(run_.model, run_.source, "test", rows=max(targs.batch_size, 64))
    MetricsLog(out).write({"step": trainer.step, "test_loss": test["loss"], "test_accuracy": test["accuracy"]})
    summary = {"from": flags.from_, "data": run_.data.name, "classes": list(run_.data.classes), "split": run_.data.note,
               "peft": spec.to_dict(), "trainable_parameters": trainable, "parameters": total,
               "step": trainer.step, "val_accuracy": result.get("val_accuracy"), "val_loss": result.get("val_loss"),
               "test_accuracy": test["accuracy"], "test_loss": test["loss"], "test_rows": test["rows"]}
    if spec.method != "full":  # the part that trained, alone: peft's folder (LoRA, prompt, prefix) or tformer's
        summary["adapter"] = str(save_adapter(run_.model, spec, out / ADAPTER_DIR))
    if spec.method == "lora":  # the run's model as a plain checkpoint (W + B A folded in) that every command reads
        save_model(run_.model, out, weights=merged_weights(run_.model))
    atomic_write_text(out / RESULT_FILE, json.dumps(summary, indent=1) + "\n")
    log(f"done: step {trainer.step}, held-out test accuracy {test['accuracy']:.1%} ({test['rows']:,} lines from "
        f"passages never seen in training), test loss {test['loss']:.4f}; weights in {out / 'model.safetensors'}"
        if run_.data.name == "authorship" else
        f"done: step {trainer.step}, test accuracy {test['accuracy']:.1%} ({test['rows']:,} rows), test loss "
        f"{test['loss']:.4f}; weights in {out / 'model.safetensors'}")
    if "adapter" in summary:
        log(f"the trained part alone (peft's format where peft has one): {summary['adapter']}")
    if flags.json:
        print(json.dumps(summary))
    return 0
