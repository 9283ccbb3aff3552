"""`tformer chat`: talk with a chat model in the terminal, through its own chat template.

    tformer chat --gguf smollm2-135m-instruct
    tformer chat --gguf model.gguf --system "You answer in one sentence." --max-new-tokens 128 --greedy

Replies stream as they are generated. Commands: /reset (forget the conversation), /system TEXT (set the
system message and start over), /exit (or Ctrl-D). Ctrl-C stops the reply being written, not the session.
When the conversation outgrows the model's context window, the oldest turns are dropped, with a note.
"""

from __future__ import annotations

import signal
import sys

from tformer.cli._source import add_source_arguments, load_model
from tformer.cli.generate import add_decoding_arguments, generation_config
from tformer.core.errors import TformerError
from tformer.core.inputs import open_stream

NAME = "chat"
HELP = "Chat with a model in the terminal through its chat template (streamed replies, /reset, /system, /exit)."
HELP_LINE = "commands: /reset, /system TEXT, /exit (or Ctrl-D); Ctrl-C stops a reply"


def add_arguments(parser) -> None:
    add_source_arguments(parser, seed=False, runs=True)
    parser.add_argument("--system", default=None, help="the system message (default: the template's own, if any)")
    add_decoding_arguments(parser, default_max=256)


def run(args) -> int:
    # deferred: torch and the model load only when this command runs
    from tformer.generate.chat import Chat

    open_stream(sys.stdin, instead="chat reads your messages there: run it in a terminal, or pipe the messages in "
                "one a line (`tformer generate --chat TEXT` sends one)")
    settings = generation_config(args)
    if settings.num_beams > 1:
        raise TformerError("chat streams its replies; beam search picks its output at the end: use --num-beams 1")
    model, tokenizer, label = load_model(args)
    if not model.config.traits.decoder or model.config.traits.seq2seq:
        raise TformerError(f"{label} is {model.config.traits.label}; chat needs a decoder (a chat model)")
    chat = Chat(model, tokenizer, system=args.system, settings=settings)
    interactive = sys.stdin.isatty()

    def say(text: str) -> None:  # notes go to stderr: stdout holds only the replies
        print(text, file=sys.stderr, flush=True)

    say(f"chatting with {label} ({model.num_parameters():,} parameters, context {model.config.max_positions}); "
        + HELP_LINE)
    while True:
        try:
            line = input("> " if interactive else "")
        except EOFError:
            break
        except KeyboardInterrupt:  # at the prompt: a fresh line, as a shell does
            print(file=sys.stderr)
            continue
        text = line.strip()
        if not text:
            continue
        if text in ("/exit", "/quit"):
            break
        if text == "/reset":
            chat.reset()
            say("(conversation cleared)")
            continue
        if text.startswith("/system"):
            chat.system = text[len("/system"):].strip() or None
            chat.reset()
            say(f"(system message {'set' if chat.system else 'cleared'}; conversation cleared)")
            continue
        if text.startswith("/"):
            say(f"(unknown command {text.split()[0]}; {HELP_LINE})")
            continue
        _reply(chat, line, say)
    return 0


def _reply(chat, line: str, say) -> None:
    """One reply, streamed; Ctrl-C ends the reply and keeps the session."""
    stop = [False]

    def interrupted(*_):
        stop[0] = True

    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        turn = chat.send(line, on_text=lambda piece: print(piece, end="", flush=True), stop_requested=lambda: stop[0])
    except TformerError as exc:  # this message cannot be answered (too long for the window): the session goes on
        say(f"(not sent: {exc})")
        return
    finally:
        signal.signal(signal.SIGINT, previous)
    print(flush=True)
    if turn.dropped:
        say(f"(the conversation outgrew the context window: the {turn.dropped} oldest message(s) were dropped)")
    if turn.finish == "interrupted":
        say("(reply stopped)")
    elif turn.finish == "length":
        say(f"(reply cut at {len(turn.ids)} tokens: --max-new-tokens)")
    elif turn.finish == "context":
        say("(reply cut: the context window is full; /reset to start over)")
