"""`tformer serve`: an OpenAI-compatible HTTP server with continuous batching (docs/SERVE.md).

    tformer serve --ckpt runs/char/final                      # http://127.0.0.1:8000/v1/completions
    tformer serve --hf all-minilm-l6-v2 --port 8001           # /v1/embeddings for an encoder
    tformer serve --ckpt runs/x --host 0.0.0.0 --api-key "$KEY"
"""

from __future__ import annotations

import sys

from tformer.cli._source import add_source_arguments, load_model
from tformer.core.errors import TformerError
from tformer.core.inputs import Bounds

NAME = "serve"
HELP = ("Serve a model over HTTP: /v1/completions (continuous batching, streaming), /v1/embeddings (encoders), "
        "/health, /metrics.")


def add_arguments(parser) -> None:
    add_source_arguments(parser, runs=True)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default loopback only)")
    parser.add_argument("--port", type=int, default=8000, help="TCP port (0 = any free port)")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on every request")
    parser.add_argument("--max-batch", type=int, default=32, help="sequences decoded together (1 = one at a time)")
    parser.add_argument("--max-queue", type=int, default=256, help="requests that may wait; beyond: 429")
    parser.add_argument("--slot-positions", type=int, default=None,
                        help="positions (prompt + reply) each of the --max-batch rows of the KV pool holds, allocated "
                             "at start (default: the context window, at most 1024); a longer request gets 400")
    parser.add_argument("--compile", action="store_true",
                        help="decode through torch.compile'd steps (decoder-only attention models; one row, any rows), compiled "
                             "before the server answers: minutes on a small CPU, then no Python per layer")
    parser.add_argument("--max-body-bytes", type=int, default=1 << 20, help="largest request body; beyond: 413")
    parser.add_argument("--request-timeout", type=float, default=60.0,
                        help="seconds a completion may take; then it ends with finish_reason 'timeout'")
    parser.add_argument("--batch-window-ms", type=float, default=5.0,
                        help="embeddings: how long the first request waits for others to share its batch")
    parser.add_argument("--no-normalize", action="store_true", help="embeddings: mean pooling without L2 norm")
    parser.add_argument("--report", action="store_true",
                        help="on exit, print decode tokens/s by batch size, measured beside the ledger's prediction")


# Timeouts far past 1e6 s (11 days, already no limit) overflow the event loop's clock arithmetic.
NUMBERS = {"max_batch": Bounds(1, 65536, integer=True), "max_queue": Bounds(1, 10 ** 6, integer=True),
           "slot_positions": Bounds(2, 10 ** 7, integer=True),
           "max_body_bytes": Bounds(1, 1 << 40, integer=True), "port": Bounds(0, 65535, integer=True),
           "request_timeout": Bounds(0, 1e6, lo_open=True, note="seconds"),
           "batch_window_ms": Bounds(0, 10_000, note="milliseconds")}


def _check(args) -> None:
    for dest, bounds in NUMBERS.items():  # main checks them too; run may be called on its own
        if getattr(args, dest) is not None:  # None: the flag's default is the model's
            bounds.check(getattr(args, dest), "--" + dest.replace("_", "-"))
    if args.api_key is not None and not args.api_key.strip():
        raise TformerError("--api-key is empty; pass a key or leave the flag out")


def run(args) -> int:
    _check(args)
    # deferred: torch, FastAPI and uvicorn load only when this command runs, so `tformer --help` stays fast
    from tformer.serve import ServeSettings, bind, create_app, is_loopback, make_server
    from tformer.serve import run as serve_until_signal

    sock = bind(args.host, args.port)  # before loading the model: a port in use fails at once
    model, tokenizer, label = load_model(args)
    settings = ServeSettings(max_batch=args.max_batch, max_queue=args.max_queue, slot_positions=args.slot_positions,
                             compile=args.compile,
                             max_body_bytes=args.max_body_bytes,
                             request_timeout=args.request_timeout, batch_window_ms=args.batch_window_ms,
                             api_key=args.api_key, normalize=not args.no_normalize)
    app = create_app(model, tokenizer, name=label, settings=settings)
    if not is_loopback(args.host) and args.api_key is None:
        print(f"tformer serve: warning: listening on {args.host} without --api-key: anyone who can reach it can use it",
              file=sys.stderr)
    host, port = sock.getsockname()[:2]
    print(f"tformer serve: {label} ({model.config.traits.label}) on http://{host}:{port} "
          f"(max batch {args.max_batch}, queue {args.max_queue}); Ctrl-C or SIGTERM drains and stops", flush=True)
    serve_until_signal(make_server(app), sock)
    if args.report:
        _print_report(app)
    return 0


def _print_report(app) -> None:
    """What this server did: requests by how they ended, and what batching bought at each batch size."""
    # deferred: loaded with the server above, never for `tformer --help`
    from tformer.generate.batching_report import batching_rows, format_batching_table, prediction_device

    engine = app.state.engine
    stats = getattr(engine, "stats", None)
    if stats is None:
        print("tformer serve: no decode steps to report (an encoder model serves embeddings)")
        return
    ended = ", ".join(f"{reason} {n}" for reason, n in stats.finished.items() if n) or "none"
    device = app.state.settings.prediction_device or prediction_device()
    print(f"tformer serve report: sequences ended: {ended}; {stats.tokens} tokens generated; "
          f"prefill {stats.prefill_tokens} tokens in {stats.prefill_seconds:.2f} s; predictions for {device.name}")
    if stats.steps:
        print(format_batching_table(batching_rows(stats, engine.config, device)))
