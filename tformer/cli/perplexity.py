"""`tformer perplexity`: a model's perplexity on a text with llama.cpp's protocol (`llama-perplexity -c 512`), so
the figure compares with llama.cpp's on the same model file and text.

    tformer perplexity --gguf smollm2-135m-instruct                  # WikiText-2 test, chunks of 512
    tformer perplexity --gguf model.gguf --data notes.txt --ctx 256 --chunks 20 --json
    tformer perplexity --ckpt runs/char --data shakespeare

The text is tokenized whole, cut into chunks of --ctx tokens, and the second half of each chunk is scored
(tformer.measure.perplexity has the protocol).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tformer.cli._source import add_source_arguments, load_model
from tformer.core.errors import TformerError
from tformer.core.files import read_text

MAX_TEXT_BYTES = 1 << 30  # a text file to score; WikiText-2's test split is 1.3 MB

NAME = "perplexity"
HELP = "Perplexity on a text with llama.cpp's protocol (chunks of --ctx tokens, the second half of each scored)."


def add_arguments(parser) -> None:
    # fp32 by default: the file's exact values, and scoring reads 512-token rows, which are GEMM-bound rather than
    # read-bound (on a 2-core EPYC fp32 scored SmolLM2 Q4_1 at 636 tokens/s, the block kernel at 336);
    # --gguf-weights kernel scores it llama.cpp's way
    add_source_arguments(parser, runs=True, gguf_weights="dequantize")
    parser.add_argument("--data", default="wikitext2",
                        help="wikitext2 (default: its test split, the raw text llama-perplexity is run on) | "
                             "shakespeare | a text file (scored whole)")
    parser.add_argument("--split", default="test", help="a named corpus's split (default test)")
    parser.add_argument("--ctx", type=int, default=512, metavar="N", help="tokens per chunk (default 512)")
    parser.add_argument("--chunks", type=int, default=None, metavar="N", help="score only the first N chunks")
    parser.add_argument("--batch", type=int, default=1, metavar="N", help="chunks per forward pass (default 1)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args) -> int:
    if args.chunks is not None and args.chunks < 1:
        raise TformerError(f"--chunks must be >= 1, got {args.chunks}")
    if not 1 <= args.batch <= 1024:
        raise TformerError(f"--batch must be in [1, 1024], got {args.batch}")
    # deferred: torch, the model and the corpus load only when this command runs
    from tformer.data.corpora import get_corpus
    from tformer.measure.perplexity import chunk_ids, perplexity

    if Path(args.data).expanduser().is_file():  # a file the user gives is scored whole, not split
        text = read_text(Path(args.data).expanduser(), "text file", max_bytes=MAX_TEXT_BYTES,
                         fix="give a UTF-8 text file")
    else:
        text = get_corpus(args.data).text(args.split)
    model, tokenizer, label = load_model(args)
    if tokenizer is None:
        raise TformerError(f"{label} has no tokenizer, so the text cannot be encoded; give a model that has one")
    ids = tokenizer.encode(text)
    add_bos = bool(getattr(tokenizer, "add_bos", False))
    bos = getattr(tokenizer, "bos_id", None) if add_bos else None
    if add_bos and bos is not None:
        ids = [bos, *ids]
    chunk_ids(ids, args.ctx, bos, args.chunks)  # a text too short or a bad --ctx fails before the first pass
    show = not (args.json or args.no_progress) and sys.stderr.isatty()
    with _Bar(show) as bar:
        result = perplexity(model, ids, ctx=args.ctx, bos_id=bos, batch=args.batch, max_chunks=args.chunks,
                            progress=bar.update)
    row = {"model": label, "data": f"{args.data}:{args.split}", "ctx": result.ctx, "chunks": result.chunks,
           "scored_tokens": result.scored_tokens, "text_tokens": result.text_tokens, "perplexity": result.perplexity,
           "nll": result.nll, "seconds": result.seconds, "tokens_per_s": result.tokens_per_s}
    if args.json:
        print(json.dumps(row, indent=1))
        return 0
    print(f"{label} on {row['data']}: perplexity {result.perplexity:.4f} (mean NLL {result.nll:.4f} nats) over "
          f"{result.scored_tokens:,} scored tokens in {result.chunks} chunks of {result.ctx} "
          f"({result.text_tokens:,} tokens in the text); {result.seconds:.1f} s, {result.tokens_per_s:,.0f} tokens/s")
    return 0


class _Bar:
    """A rich progress bar over chunks on a terminal, else nothing."""

    def __init__(self, enabled: bool):
        self.progress = None
        if enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(TextColumn("chunk"), MofNCompleteColumn(), BarColumn(),
                                     TextColumn("ppl {task.fields[ppl]}"), TimeRemainingColumn(), transient=True)
            self.task = None

    def __enter__(self):
        if self.progress is not None:
            self.progress.__enter__()
        return self

    def __exit__(self, *exc):
        if self.progress is not None:
            self.progress.__exit__(*exc)

    def update(self, done: int, total: int, ppl: float) -> None:
        if self.progress is None:
            return
        if self.task is None:
            self.task = self.progress.add_task("ppl", total=total, ppl="")
        self.progress.update(self.task, completed=done, ppl=f"{ppl:.3f}")
