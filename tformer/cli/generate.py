"""`tformer generate`: continue a prompt with a trained or Hugging Face checkpoint.

    tformer generate --ckpt runs/char/final --prompt "ROMEO:" --max-new-tokens 200 --top-p 0.9 --seed 0
    tformer generate --hf ./gpt2 --prompt "Hello" --greedy --no-cache      # the lecture's comparison
    tformer generate --ckpt runs/x --prompt-ids 1,2,3 --num-beams 4 --json
"""

from __future__ import annotations

import json
import sys

from tformer.cli._source import add_source_arguments, load_model
from tformer.core.errors import TformerError
from tformer.core.inputs import Bounds, read_stream

NAME = "generate"
HELP = ("Generate text with the KV cache (greedy, sampling or beam search; --compile for a compiled step); prints "
        "prefill and decode tokens/s.")
MAX_BATCH = 65536  # copies of one prompt; more is a typo, not a workload
# The decoding flags' ranges (generate and translate). The sampler copes with any finite temperature and
# penalty, but past these ends every setting acts as its limit (argmax, uniform), and a length penalty beyond
# ±10 makes length ** penalty overflow float64 for a long enough output.
DECODING_NUMBERS = {
    "max_new_tokens": Bounds(1, 10 ** 9, integer=True),
    "temperature": Bounds(0, 1e6, note="0 is greedy; below 1 sharpens, above 1 flattens"),
    "top_p": Bounds(0, 1, lo_open=True, note="1 turns it off"),
    "min_p": Bounds(0, 1, note="0 turns it off"),
    "repetition_penalty": Bounds(0, 1e6, lo_open=True, note="1 turns it off"),
    "length_penalty": Bounds(-10, 10, note="beam score = log p / length ** this"),
    "batch": Bounds(1, MAX_BATCH, integer=True),
}
NUMBERS = DECODING_NUMBERS


def add_decoding_arguments(parser, default_max: int) -> None:
    parser.add_argument("--max-new-tokens", type=int, default=default_max, metavar="N")
    parser.add_argument("--greedy", action="store_true", help="always take the most likely token")
    parser.add_argument("--temperature", type=float, default=1.0, help="> 0; below 1 sharpens, above 1 flattens")
    parser.add_argument("--top-k", type=int, default=0, help="sample among the k most likely tokens (0 = off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling, in (0, 1] (1 = off)")
    parser.add_argument("--min-p", type=float, default=0.0, help="drop tokens below min_p x the top probability")
    parser.add_argument("--repetition-penalty", type=float, default=1.0, help="> 1 discourages repeats (1 = off)")
    parser.add_argument("--num-beams", type=int, default=1, help="beam search width (1 = no beam search)")
    parser.add_argument("--length-penalty", type=float, default=1.0,
                        help="beam score = log p / length**this (> 0 favours longer outputs)")
    parser.add_argument("--early-stopping", choices=["false", "true", "never"], default="false",
                        help="beam search: stop when K hypotheses are done (true), when none can improve (false), "
                             "or only on the exact bound (never)")
    parser.add_argument("--stop-ids", default=None, metavar="IDS",
                        help="comma-separated stop token ids (default: the model's EOS; '' = none; with --chat "
                             "and `tformer chat`, added to the template's end-of-turn tokens)")
    parser.add_argument("--seed", type=int, default=None, help="seed the sampler for reproducible output")
    parser.add_argument("--batch", type=int, default=1, metavar="N", help="repeat a single prompt N times")
    parser.add_argument("--no-cache", action="store_true", help="recompute the whole prefix at every step")
    layout = parser.add_mutually_exclusive_group()
    layout.add_argument("--reserve-cache", dest="reserve_cache", action="store_true", default=True,
                        help="reserve the KV cache's room for prompt + new tokens, written in place (the default)")
    layout.add_argument("--static-cache", dest="old_static_cache", action="store_true",
                        help="the old name of --reserve-cache (goes in the next release)")
    layout.add_argument("--growing-cache", dest="reserve_cache", action="store_false",
                        help="grow the KV cache by concatenation (copies it every step; to compare)")
    parser.add_argument("--compile", action="store_true",
                        help="decode through a torch.compile'd step over a preallocated cache (the first run of a "
                             "shape compiles; that time is reported apart from decode tokens/s)")
    parser.add_argument("--truncate", action="store_true", help="cut a prompt that exceeds the context window")
    parser.add_argument("--json", action="store_true", help="print one JSON object (ids, text, tokens/s)")


def add_arguments(parser) -> None:
    add_source_arguments(parser, seed=False, runs=True)  # --seed seeds the sampler, and a --preset's initialisation
    parser.add_argument("--chat", default=None, metavar="MESSAGE",
                        help="a user message, sent through the model's chat template (the reply ends at its "
                             "end-of-turn token); see also `tformer chat`")
    parser.add_argument("--system", default=None, help="(--chat) the system message")
    parser.add_argument("--prompt", action="append", default=None,
                        help="prompt text (repeat for a batch); default: read stdin")
    parser.add_argument("--prompt-ids", action="append", default=None, metavar="IDS",
                        help="prompt as comma-separated token ids, e.g. 1,2,3 (repeat for a batch)")
    add_decoding_arguments(parser, default_max=64)


# Settings -----------------------------------------------------------------------------------
def parse_ids(text: str, what: str) -> list[int]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise TformerError(f"{what} must be comma-separated whole numbers, got {text!r}") from None


def generation_config(args):
    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.generate import GenerationConfig

    if not 1 <= args.batch <= MAX_BATCH:  # beyond, a tensor index overflows before memory runs out
        raise TformerError(f"--batch must be between 1 and {MAX_BATCH}, got {args.batch}")
    early = {"false": False, "true": True, "never": "never"}[args.early_stopping]
    beams = args.num_beams > 1
    sampling_flags = args.temperature != 1.0 or args.top_k or args.top_p != 1.0 or args.min_p
    if beams and sampling_flags:
        raise TformerError("beam search does not sample; drop --temperature/--top-k/--top-p/--min-p or use --num-beams 1")
    stop = None if args.stop_ids is None else parse_ids(args.stop_ids, "--stop-ids")
    if getattr(args, "old_static_cache", False):
        print("note: --static-cache is now --reserve-cache (the same: room for prompt + new tokens, written in place); "
              "the old name goes in the next release", file=sys.stderr)
    return GenerationConfig(
        max_new_tokens=args.max_new_tokens, do_sample=not (args.greedy or beams), temperature=args.temperature,
        top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, repetition_penalty=args.repetition_penalty,
        num_beams=args.num_beams, length_penalty=args.length_penalty, early_stopping=early, stop_tokens=stop,
        use_cache=not args.no_cache, reserve_cache=args.reserve_cache, seed=args.seed, truncate=args.truncate,
        compile=args.compile,
    ).validate()


def prompt_rows(args, tokenizer, what="prompt") -> tuple[list[list[int]], list[str] | None]:

    texts = None
    if getattr(args, "prompt_ids", None):
        rows = [parse_ids(t, "--prompt-ids") for t in args.prompt_ids]
    else:
        texts = args.prompt if args.prompt is not None else [
            read_stream(sys.stdin, instead="give --prompt TEXT (or --prompt-ids), or pipe the prompt in")]
        if tokenizer is None:
            raise TformerError(f"this checkpoint has no tokenizer, so a text {what} cannot be encoded; "
                               "pass token ids with --prompt-ids 1,2,3")
        from tformer.generate.inputs import prompt_ids  # deferred: torch loads only when a model runs

        rows = [prompt_ids(tokenizer, t) for t in texts]
    if any(len(r) == 0 for r in rows):
        raise TformerError(f"empty {what}: give at least one token (text that encodes to no tokens counts as empty)")
    if args.batch > 1:
        if len(rows) > 1:
            raise TformerError("--batch repeats a single prompt; with several prompts the batch is already set")
        rows, texts = rows * args.batch, (texts * args.batch if texts else None)
    return rows, texts


# Output -------------------------------------------------------------------------------------
def report(out, rows, tokenizer, cfg, as_json: bool, label: str, streamed: bool = False) -> None:
    def text(ids):
        return tokenizer.decode(ids) if tokenizer is not None else None

    if as_json:
        print(json.dumps({
            "model": label,
            "sequences": [{"prompt_ids": p, "ids": s, "text": text(s)} for p, s in zip(rows, out.sequences)],
            "scores": out.scores.tolist() if out.scores is not None else None,
            "prefill_tokens": out.prefill_tokens, "prefill_seconds": out.prefill_seconds,
            "prefill_tokens_per_s": out.prefill_tokens_per_s,
            "decode_tokens": out.decode_tokens, "decode_seconds": out.decode_seconds,
            "decode_tokens_per_s": out.decode_tokens_per_s,
            "compiled": bool(cfg.compile), "compile_seconds": out.compile_seconds,
            "cache": "none" if not cfg.use_cache else ("reserved" if cfg.reserve_cache else "growing"),
            "cache_bytes": out.cache_bytes, "hit_context_limit": out.hit_context_limit, "truncated": out.truncated,
            "settings": {k: v for k, v in vars(cfg).items()},
        }, default=str))
        return
    if not streamed:
        for i, seq in enumerate(out.sequences):
            head = f"[{i}] " if len(out.sequences) > 1 else ""
            print(head + (text(seq) if tokenizer is not None else " ".join(map(str, seq))))
    cache = "no cache" if not cfg.use_cache else f"{'reserved' if cfg.reserve_cache else 'growing'} KV cache"
    if cfg.compile:
        cache += f", compiled step ({out.compile_seconds:.1f} s compiling, not in the rates)"
    print(f"prefill: {out.prefill_tokens} tokens in {out.prefill_seconds * 1e3:.1f} ms "
          f"({out.prefill_tokens_per_s:,.0f} tokens/s) | decode: {out.decode_tokens} tokens in "
          f"{out.decode_seconds * 1e3:.1f} ms ({out.decode_tokens_per_s:,.1f} tokens/s) | {cache}, "
          f"{out.cache_bytes:,} bytes (CPU clock; fp32)" if out.decode_tokens else
          f"prefill: {out.prefill_tokens} tokens in {out.prefill_seconds * 1e3:.1f} ms | decode: no steps | {cache}")
    if out.hit_context_limit:
        print(f"note: stopped at the model's context window ({len(out.sequences[0])} new tokens)")
    if out.truncated:
        print("note: the prompt was truncated to fit the context window")


def warm_up(model) -> None:
    """One tiny forward pass first, so one-time library set-up (kernel selection, thread pools,
    lazy allocations) is not billed to the prefill tokens/s that we print."""
    import torch  # deferred, with the runner: the CLI starts without torch

    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.data.batch import example_batch
    from tformer.model.runners import runner_for

    runner = runner_for(model)
    with torch.no_grad():
        ids = torch.zeros(1, 1, dtype=torch.long, device=runner.device)
        runner.forward(example_batch(model.config, ids, ids))


def run(args) -> int:
    # deferred: loaded only when this command runs, so `tformer --help` and the cost commands stay fast
    from tformer.generate import generate

    cfg = generation_config(args)
    model, tokenizer, label = load_model(args)
    traits = model.config.traits
    if not traits.decoder:
        raise TformerError(f"{label} is {traits.label}; it cannot generate text. "
                           "Use a decoder or encoder-decoder checkpoint")
    if traits.seq2seq:
        raise TformerError(f"{label} is {traits.label}; use `tformer translate` for it")
    if args.chat is not None:
        return _chat_once(args, model, tokenizer, cfg, label)
    if args.system is not None:
        raise TformerError("--system goes with --chat (a system message for the chat template)")
    rows, _ = prompt_rows(args, tokenizer)

    # One prompt, no beams, plain output: print tokens as they arrive.
    streamer = None
    if not args.json and len(rows) == 1 and cfg.num_beams == 1:
        produced: list[int] = []
        shown = [""]  # text printed so far; a token may change how earlier bytes decode

        def streamer(tokens):
            produced.append(int(tokens[0]))
            if tokenizer is not None:
                full = tokenizer.decode(produced)
                sys.stdout.write(full[len(shown[0]):])
                shown[0] = full
            else:
                sys.stdout.write(f"{produced[-1]} ")
            sys.stdout.flush()

    streamed = streamer is not None
    warm_up(model)
    out = generate(model, rows, config=cfg, streamer=streamer)
    if streamed:
        print()
    report(out, rows, tokenizer, cfg, args.json, label, streamed=streamed)
    return 0


def _chat_once(args, model, tokenizer, cfg, label) -> int:
    """--chat: one user message through the chat template, the reply streamed (or one JSON object)."""
    # deferred: the chat session loads with the model
    from tformer.generate.chat import Chat

    if args.prompt or args.prompt_ids or args.batch > 1 or cfg.num_beams > 1:
        raise TformerError("--chat sends one message: drop --prompt, --prompt-ids, --batch and --num-beams")
    chat = Chat(model, tokenizer, system=args.system, settings=cfg)
    stream = None if args.json else (lambda piece: print(piece, end="", flush=True))
    turn = chat.send(args.chat, on_text=stream)
    if args.json:
        print(json.dumps({"model": label, "reply": turn.text, "ids": turn.ids, "finish_reason": turn.finish,
                          "prompt_tokens": turn.prompt_tokens, "seconds": turn.seconds}))
    else:
        print()
        if turn.finish == "length":
            print(f"note: the reply was cut at {len(turn.ids)} tokens (--max-new-tokens)", file=sys.stderr)
    return 0
