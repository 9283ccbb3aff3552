"""`tformer translate`: run an encoder-decoder checkpoint (e.g. the en->es model) on source sentences.

    tformer translate --ckpt runs/en-es "The cat sleeps." "Where is the station?" --num-beams 4
    echo "Good morning." | tformer translate --ckpt runs/en-es
"""

from __future__ import annotations

import sys
from pathlib import Path

from tformer.cli.generate import DECODING_NUMBERS
from tformer.core.errors import TformerError
from tformer.core.inputs import read_stream

NAME = "translate"
HELP = "Translate source sentences with an encoder-decoder checkpoint (greedy, sampling or beam search)."
NUMBERS = DECODING_NUMBERS


def add_arguments(parser) -> None:
    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.cli._source import add_source_arguments
    from tformer.cli.generate import add_decoding_arguments

    add_source_arguments(parser, seed=False, runs=True)
    parser.add_argument("sentences", nargs="*", help="source sentences (default: one per line of stdin)")
    parser.add_argument("--source-ids", action="append", default=None, metavar="IDS",
                        help="a source as comma-separated token ids (repeat for a batch)")
    add_decoding_arguments(parser, default_max=128)


def run(args) -> int:
    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.cli._source import load_model
    from tformer.cli.generate import generation_config, parse_ids, report, warm_up

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.generate import generate

    # Translation wants the most likely output: greedy unless sampling is asked for explicitly.
    sampling_asked = args.temperature != 1.0 or args.top_k or args.top_p != 1.0 or args.min_p
    if not sampling_asked:
        args.greedy = True
    cfg = generation_config(args)
    model, tokenizer, label = load_model(args)
    traits = model.config.traits
    if not traits.seq2seq:
        raise TformerError(f"{label} is {traits.label}; translate needs an encoder-decoder checkpoint"
                           + (" (use `tformer generate` for it)" if traits.decoder else ""))
    src_tok, tgt_tok = _pair_tokenizers(args, tokenizer)
    if args.source_ids:
        rows = [parse_ids(t, "--source-ids") for t in args.source_ids]
    else:
        texts = args.sentences or [line for line in read_stream(
            sys.stdin, instead="give the sentences as arguments, or pipe them in one a line").splitlines() if line.strip()]
        if not texts:
            raise TformerError("no source sentences: pass them as arguments or one per line on stdin")
        if src_tok is None:
            raise TformerError("this checkpoint has no tokenizer, so text cannot be encoded; "
                               "pass token ids with --source-ids 1,2,3")
        rows = [src_tok.encode(t) for t in texts]
        eos = _special(src_tok, "eos", model.config.eos_token_id)
        if eos is not None:  # training sources end with EOS (tformer.data.seq2seq.collate); so must these
            rows = [r + [eos] if r and r[-1] != eos else r for r in rows]
    if any(len(r) == 0 for r in rows):
        raise TformerError("empty source sentence: give at least one token")
    if args.batch > 1:
        if len(rows) > 1:
            raise TformerError("--batch repeats a single source; with several sources the batch is already set")
        rows = rows * args.batch
    # The decoder starts from the config's start token, else the target tokenizer's BOS (what
    # training put in front of every target), and stops at the target EOS.
    start = model.config.decoder_start_token_id
    if start is None:
        start = _special(tgt_tok, "bos", None)
    if start is None:
        raise TformerError("the checkpoint sets no decoder_start_token_id and has no target BOS token; "
                           "set decoder_start_token_id in its config.json")
    if cfg.stop_tokens is None:
        eos = model.config.eos_token_id if model.config.eos_token_id is not None else _special(tgt_tok, "eos", None)
        cfg.stop_tokens = [] if eos is None else [eos]
    warm_up(model)
    out = generate(model, rows, config=cfg, decoder_input_ids=[[start]] * len(rows))
    if tgt_tok is not None and not args.json:
        stops = set(cfg.stop_tokens)  # the stop token ends the text; it stays in the JSON ids
        for i, seq in enumerate(out.sequences):
            print((f"[{i}] " if len(rows) > 1 else "") + tgt_tok.decode([t for t in seq if t not in stops]))
        report(out, rows, tgt_tok, cfg, False, label, streamed=True)
        return 0
    report(out, rows, tgt_tok, cfg, args.json, label)
    return 0


def _special(tok, role: str, default):
    value = getattr(tok, f"{role}_id", None) if tok is not None else None
    return default if value is None else value


def _pair_tokenizers(args, shared):
    """(source, target) tokenizers. A translation checkpoint may keep one per side in
    source-tokenizer/ and target-tokenizer/ subfolders (tformer.data.seq2seq trains a pair);
    otherwise the one shared tokenizer serves both."""
    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.interop.checkpoint import find_tokenizer

    if args.ckpt:
        root = Path(args.ckpt)
        src = find_tokenizer(root / "source-tokenizer", root / "final" / "source-tokenizer")
        tgt = find_tokenizer(root / "target-tokenizer", root / "final" / "target-tokenizer")
        if src is not None and tgt is not None:
            return src, tgt
    return shared, shared
