"""Serving under load: `tformer serve` with continuous batching against one-request-at-a-time serving of the
same model in the same run, driven over loopback by bounded concurrent streaming clients.

    python bench/serve_load.py                       # random-weight GPT-like model, 1/8/32/128 clients, ~2-4 minutes
    python bench/serve_load.py --quick               # tiny model, 1 and 4 clients: a smoke test
    python bench/serve_load.py --ckpt runs/x --levels 1,8,32 --max-tokens 64
    python bench/serve_load.py --gguf smollm2-135m-instruct  # tformer serve beside llama.cpp's llama-server, same file

What is measured: the server is started twice as a subprocess (`python -m tformer serve` on 127.0.0.1 at a
free port), first with --max-batch N (continuous batching), then with --max-batch 1. At each concurrency
level c, c asyncio clients (httpx) send a fixed number of requests (default max(2c, 16)), each greedy, with a
fixed max_tokens and stream=true, and stop after --time-limit seconds, saying so; each level is run --runs times
(default 5) and its figures are the medians over the runs, every run kept in the record. Client-side: requests/s
and tokens/s over the level's wall clock, time to first token (request sent -> first token chunk) and per-token
latency (the gaps between a request's token chunks) at p50/p95/p99. A request fails on any non-200 answer
(429 included), a broken stream or a missing [DONE]. Then the ratio continuous / one-at-a-time tokens/s at
each level (target: >= 4x at 32 clients, zero failures), beside the ledger's predicted decode speed-up at
that batch size (tformer.cost.batching: a decode step at batch b reads the weights once for b tokens).
The measured ratio includes what the prediction leaves out (prefill, HTTP and streaming per token).

With --gguf, the peer is llama.cpp's own server on the same file (`llama-server`, built by bench/build_llamacpp.sh,
--parallel N slots, continuous batching, -c N x --slot-positions, all cores): both get the same chat-shaped
prompts (the model's template and default system prompt around a varied question, as token ids), greedy,
the same max tokens with the end token ignored (every request generates exactly max_tokens on both), and the
ratio is tformer / llama.cpp at each level (the issue's targets: >= 2x tokens/s at 32 clients at no worse p95
TTFT; >= 1x at 1 client). That record is filed as "serve_llamacpp", apart from the batching record the report reads.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import httpx
import torch

from tformer.core.config import ModelConfig
from tformer.cost.batching import decode_speedups
from tformer.generate.batching_report import prediction_device
from tformer.interop import load_config
from tformer.interop.checkpoint import save_model
from tformer.model import build

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402  (bench/_results.py: the machine header, the table and bench/results/ files)

REPO = Path(__file__).resolve().parents[1]
# One decode step of this model takes a few ms on a 2-core CPU at batch 1, so one-at-a-time serving is
# bound by the per-step cost (weights read once per token, ~13 MB, plus Python and HTTP per token) and
# a batch of 32 costs little more per step than a batch of 1: what continuous batching buys is visible
# without the run taking many minutes. 256 positions hold a 16-token prompt and 32 new tokens easily.
DEFAULT_MODEL = dict(arch="decoder", n_layers=4, d_model=256, n_heads=4, d_ff=1024, vocab_size=512,
                     max_positions=256)
QUICK_MODEL = dict(arch="decoder", n_layers=2, d_model=64, n_heads=2, d_ff=128, vocab_size=128, max_positions=64)
PROMPT_TOKENS = 16
HEALTH_TIMEOUT_S = 120.0
LLAMA_SERVER = Path.home() / ".cache/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin/llama-server"


# The server ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m tformer serve` as a child process; always ended on exit (SIGTERM, then kill)."""

    def __init__(self, model_args: list[str], max_batch: int, max_queue: int, request_timeout: float, log_dir: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_dir) / f"serve-batch{max_batch}.log"
        self.argv = [sys.executable, "-m", "tformer", "serve", *model_args, "--host", "127.0.0.1",
                     "--port", str(self.port), "--max-batch", str(max_batch), "--max-queue", str(max_queue),
                     "--request-timeout", str(request_timeout)]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Server":
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_healthy(self) -> None:
        wait = HEALTH_TIMEOUT_S * (8 if "--compile" in self.argv else 1)  # compiling SmolLM2's step: ~2 min here
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the server was not healthy after {wait:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)  # drains in-flight requests, then exits
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class LlamaServer(Server):
    """llama.cpp's `llama-server` on a GGUF file, with ``slots`` parallel slots of ``slot_positions`` each."""

    def __init__(self, binary: Path, gguf: Path, slots: int, slot_positions: int, log_dir: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_dir) / f"llama-server-{slots}.log"
        self.argv = [str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
                     "--parallel", str(slots), "-c", str(slots * slot_positions), "-t", str(os.cpu_count() or 1),
                     "--no-webui"]
        self.proc = None


# The clients --------------------------------------------------------------------------------
class Outcome(NamedTuple):  # a NamedTuple, not a dataclass: the bench tests load this file outside sys.modules
    ok: bool
    tokens: int = 0
    ttft: float | None = None  # seconds from sending to the first token chunk
    gaps: tuple[float, ...] = ()  # seconds per token between token chunks
    error: str = ""


def prompt_for(i: int, vocab: int) -> list[int]:
    """Request i's prompt: fixed length, different per request, the same in both modes."""
    return [(7 * i + 13 * j + 1) % vocab for j in range(PROMPT_TOKENS)]


class StreamError(Exception):
    """A server reported an error inside its stream."""


def openai_chunk(data: str) -> int | None:
    """tformer serve's /v1/completions SSE data -> the tokens it carries; None at [DONE]."""
    if data == "[DONE]":
        return None
    chunk = json.loads(data)
    if "error" in chunk:
        raise StreamError(f"stream error: {str(chunk['error'])[:120]}")
    return sum(len(c.get("token_ids") or []) for c in chunk.get("choices", []))


def llama_chunk(data: str) -> int | None:
    """llama-server's native /completion SSE data: one token per chunk; None at the one with "stop": true."""
    return None if json.loads(data).get("stop") else 1


async def stream_request(client: httpx.AsyncClient, url: str, body: dict, headers: dict, read=openai_chunk) -> Outcome:
    """One streamed request; ``read`` turns each SSE data line into its token count (None: the stream's end)."""
    start = time.perf_counter()
    last, tokens, ttft, gaps, done = start, 0, None, [], False
    try:
        async with client.stream("POST", url, json=body, headers=headers) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                return Outcome(False, error=f"HTTP {r.status_code}: {text[:120]}")
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                n = read(line[5:].strip())
                if n is None:
                    done = True
                    break
                if not n:
                    continue
                now = time.perf_counter()
                if ttft is None:
                    ttft = now - start
                else:
                    gaps.extend([(now - last) / n] * n)
                last, tokens = now, tokens + n
    except StreamError as exc:
        return Outcome(False, tokens, ttft, tuple(gaps), str(exc))
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return Outcome(False, tokens, ttft, tuple(gaps), f"{type(exc).__name__}: {str(exc)[:120]}")
    return Outcome(done, tokens, ttft, tuple(gaps), "" if done else "stream ended before its last chunk")


async def one_request(client: httpx.AsyncClient, url: str, body: dict, headers: dict) -> Outcome:
    return await stream_request(client, f"{url}/v1/completions", body, headers)


async def one_llama_request(client: httpx.AsyncClient, url: str, body: dict, headers: dict) -> Outcome:
    """The same request through llama-server's native /completion (greedy, max_tokens with the end token ignored)."""
    native = {"prompt": body["prompt"], "n_predict": body["max_tokens"], "temperature": 0, "stream": True,
              "ignore_eos": True, "cache_prompt": True}
    return await stream_request(client, f"{url}/completion", native, headers, llama_chunk)


async def drive(url: str, clients: int, requests: int, body_for, time_limit: float, headers: dict,
                ask=None) -> dict:
    """``clients`` workers share ``requests`` requests; whatever is unfinished at ``time_limit`` is cancelled."""
    outcomes: list[Outcome] = []
    todo = iter(range(requests))
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=httpx.Timeout(time_limit + 30.0), limits=limits) as client:
        async def worker():
            for i in todo:
                outcomes.append(await (ask or one_request)(client, url, body_for(i), headers))

        start = time.perf_counter()
        tasks = [asyncio.create_task(worker()) for _ in range(clients)]
        _, pending = await asyncio.wait(tasks, timeout=time_limit)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall = time.perf_counter() - start
    return summarize(outcomes, wall, requests, stopped=bool(pending))


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def combine(runs: list[dict]) -> dict:
    """One level over several runs: each rate and percentile the median over the runs (and tokens/s's range),
    counts summed, every run kept ("runs"), so a short level is not one noisy draw."""
    def med(xs):
        xs = [x for x in xs if x is not None]
        return statistics.median(xs) if xs else None

    rates = [r["tokens_per_s"] for r in runs]
    return {**{k: sum(r[k] for r in runs) for k in ("requests", "ok", "failed", "unfinished", "tokens", "wall_s")},
            "stopped_at_time_limit": any(r["stopped_at_time_limit"] for r in runs),
            "requests_per_s": med([r["requests_per_s"] for r in runs]),
            "tokens_per_s": med(rates), "tokens_per_s_min": min(rates), "tokens_per_s_max": max(rates),
            **{key: {p: med([r[key][p] for r in runs]) for p in runs[0][key]} for key in ("ttft_s", "per_token_s")},
            "errors": sorted({e for r in runs for e in r["errors"]})[:5], "runs": runs}


def summarize(outcomes: list[Outcome], wall: float, requests: int, stopped: bool) -> dict:
    ok = [o for o in outcomes if o.ok]
    ttfts = [o.ttft for o in ok if o.ttft is not None]
    gaps = [g for o in ok for g in o.gaps]
    tokens = sum(o.tokens for o in outcomes)
    return {"requests": requests, "ok": len(ok), "failed": len(outcomes) - len(ok),
            "unfinished": requests - len(outcomes), "stopped_at_time_limit": stopped, "wall_s": wall,
            "requests_per_s": len(ok) / wall if wall > 0 else 0.0, "tokens": tokens,
            "tokens_per_s": tokens / wall if wall > 0 else 0.0,
            "ttft_s": {f"p{q}": percentile(ttfts, q) for q in (50, 95, 99)},
            "per_token_s": {f"p{q}": percentile(gaps, q) for q in (50, 95, 99)},
            "errors": sorted({o.error for o in outcomes if not o.ok})[:5]}


# The model and the prediction ---------------------------------------------------------------
def model_source(args, tmp: str) -> tuple[list[str], ModelConfig]:
    """The server's model arguments and the config the ledger predicts for."""
    if args.gguf:
        from tformer.interop.gguf_config import config_from_gguf, resolve_gguf

        return ["--gguf", args.gguf], config_from_gguf(resolve_gguf(args.gguf))
    if args.ckpt:
        return ["--ckpt", args.ckpt], load_config(args.ckpt)
    if args.hf:
        return ["--hf", args.hf], load_config(args.hf)
    config = ModelConfig(**(QUICK_MODEL if args.quick else DEFAULT_MODEL), dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    path = Path(tmp) / "model"
    save_model(build(config).eval(), path)  # random weights: the speed does not depend on their values
    return ["--ckpt", str(path)], config


def predicted_speedups(config, levels: list[int], max_batch: int, context: int) -> dict[int, dict]:
    device = prediction_device()
    batches = sorted({min(c, max_batch) for c in levels})
    by_model = {model: {r["batch"]: r["speedup"]
                        for r in decode_speedups(config, device, batches, context, model=model)}
                for model in ("auto", "peak")}
    return {c: {"batch": min(c, max_batch), "device": device.name,
                "profile": by_model["auto"][min(c, max_batch)], "peak": by_model["peak"][min(c, max_batch)]}
            for c in levels}


# Printing -------------------------------------------------------------------------------------
def ms(x) -> str:
    return f"{x * 1e3:.1f}" if x is not None else "-"


def level_table(results: dict) -> str:
    headers = ["mode", "clients", "ok", "failed", "req/s", "tok/s", "TTFT p50", "p95", "p99",
               "per-token p50", "p95", "p99", "note"]
    rows = []
    for mode, levels in results.items():
        for c, r in levels.items():
            note = f"time limit: {r['unfinished']} unfinished" if r["stopped_at_time_limit"] else ""
            rows.append([mode, str(c), str(r["ok"]), str(r["failed"]), f"{r['requests_per_s']:.2f}",
                         f"{r['tokens_per_s']:.1f}", *(ms(r["ttft_s"][p]) for p in ("p50", "p95", "p99")),
                         *(ms(r["per_token_s"][p]) for p in ("p50", "p95", "p99")), note])
    return _results.table(headers, rows) + "\n(latencies in ms, measured by the clients)"


def ratio_table(results: dict, predicted: dict) -> str:
    cont, single = results.get("continuous", {}), results.get("one-at-a-time", {})
    rows = []
    for c in cont:
        if c not in single:
            continue
        ratio = cont[c]["tokens_per_s"] / single[c]["tokens_per_s"] if single[c]["tokens_per_s"] else float("nan")
        p = predicted[c]
        rows.append([str(c), f"{cont[c]['tokens_per_s']:.1f}", f"{single[c]['tokens_per_s']:.1f}", f"{ratio:.2f}x",
                     str(p["batch"]), f"{p['profile']:.2f}x" if p["profile"] else "-",
                     f"{p['peak']:.2f}x" if p["peak"] else "-"])
    headers = ["clients", "continuous tok/s", "one-at-a-time tok/s", "measured ratio", "batch",
               "predicted (profile)", "predicted (peak roofline)"]
    return _results.table(headers, rows)


# Main -------------------------------------------------------------------------------------------
QUESTIONS = ["What is the capital of France?", "Why is the sky blue?", "Name three prime numbers.",
             "How do plants make food?", "What does a compiler do?", "Why do we have seasons?",
             "What is a transformer in machine learning?", "How far is the Moon?"]


def chat_prompts(gguf: str, n: int) -> list[list[int]]:
    """n chat-shaped prompts as token ids: the file's template and default system prompt around a question
    (numbered, so no two are equal and no server answers from a cache of whole prompts)."""
    from tformer.generate.chat import chat_ids, template_for
    from tformer.interop.gguf_model import load_gguf

    _, tok = load_gguf(gguf, tokenizer=True)
    template = template_for(tok)
    return [chat_ids(template, tok, [{"role": "user", "content": f"Question {i + 1}: {QUESTIONS[i % len(QUESTIONS)]}"}])
            for i in range(n)]


def run_mode(label: str, server, args, prompt_of, ask=None) -> dict:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key and ask is None else {}

    def body_for(i: int) -> dict:
        body = {"prompt": prompt_of(i), "max_tokens": args.max_tokens, "temperature": 0, "stream": True}
        if args.gguf:
            body["ignore_eos"] = True  # exactly max_tokens from each, as llama-server is asked
        return body

    out = {}
    with server:
        print(f"{label}: serving at {server.url}", flush=True)
        asyncio.run(drive(server.url, 1, 2, body_for, args.time_limit, headers, ask))  # warm-up, not counted
        for c in args.levels:
            n = args.requests or max(2 * c, 4 if args.quick else 16)
            r = combine([asyncio.run(drive(server.url, c, n, body_for, args.time_limit, headers, ask))
                         for _ in range(args.runs)])
            out[c] = r
            stop = f"; stopped at the {args.time_limit:g} s time limit" if r["stopped_at_time_limit"] else ""
            print(f"  {c:4d} clients: {r['ok']}/{r['requests']} ok over {args.runs} runs, {r['failed']} failed, "
                  f"{r['tokens_per_s']:.1f} tokens/s (median; {r['tokens_per_s_min']:.1f}-{r['tokens_per_s_max']:.1f})"
                  f"{stop}" + (f"; errors: {r['errors']}" if r["errors"] else ""), flush=True)
    return out


def peer_table(results: dict) -> str:
    """tformer serve against llama-server at each level: tokens/s and p95 TTFT, and their ratios."""
    ours, peer = results.get("tformer", {}), results.get("llama-server", {})
    rows = []
    for c in ours:
        if c not in peer:
            continue
        a, b = ours[c], peer[c]
        ratio = a["tokens_per_s"] / b["tokens_per_s"] if b["tokens_per_s"] else float("nan")
        ta, tb = a["ttft_s"]["p95"], b["ttft_s"]["p95"]
        rows.append([str(c), f"{a['tokens_per_s']:.1f}", f"{b['tokens_per_s']:.1f}", f"{ratio:.2f}x", ms(ta), ms(tb),
                     f"{ta / tb:.2f}x" if ta and tb else "-"])
    headers = ["clients", "tformer tok/s", "llama-server tok/s", "tformer / llama", "tformer TTFT p95",
               "llama TTFT p95", "TTFT ratio"]
    return _results.table(headers, rows)


def parse_levels(text: str) -> list[int]:
    levels = [int(x) for x in text.split(",") if x.strip()]
    if not levels or min(levels) < 1:
        raise SystemExit("--levels takes whole numbers >= 1, e.g. 1,8,32,128")
    return levels


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group()
    src.add_argument("--ckpt", help="serve this tformer checkpoint (default: a random-weight model built here)")
    src.add_argument("--hf", help="serve this Hugging Face model folder")
    src.add_argument("--gguf", help="serve this GGUF file (or packaged name) with tformer and with llama-server")
    p.add_argument("--llama-server", default=str(LLAMA_SERVER), help="llama.cpp's server binary (with --gguf)")
    p.add_argument("--slot-positions", type=int, default=256, help="KV positions per slot, both servers (with --gguf)")
    p.add_argument("--compile", action="store_true", help="tformer serve --compile (one compiled decode step)")
    p.add_argument("--gguf-weights", choices=("auto", "kernel", "keep", "dequantize"), default="auto",
                   help="how tformer holds the file's weights (with --gguf): auto (the server's default: the block "
                        "kernel where built), kernel, keep (blocks widened exactly) or dequantize (fp32)")
    p.add_argument("--bf16-kernel", action="store_true",
                   help="tformer serve --bf16-kernel: kept blocks on torch's bf16 int4 kernel (with --gguf-weights keep)")
    p.add_argument("--levels", default=None, help="client counts (default 1,8,32,128; --quick: 1,4)")
    p.add_argument("--requests", type=int, default=None, help="requests per level (default max(2 x clients, 16))")
    p.add_argument("--max-tokens", type=int, default=None, help="new tokens per request (default 32; --quick 8)")
    p.add_argument("--max-batch", type=int, default=128, help="continuous batching's --max-batch")
    p.add_argument("--time-limit", type=float, default=180.0, help="seconds per run of a level before it stops")
    p.add_argument("--runs", type=int, default=None,
                   help="runs of each level; its figures are their medians (default 5; --quick 1)")
    p.add_argument("--api-key", default=None, help="the key a --ckpt/--hf server of yours expects")
    p.add_argument("--quick", action="store_true", help="tiny model, levels 1,4: a smoke test (not filed)")
    p.add_argument("--json", default=None, help="also write the record here")
    p.add_argument("--no-save", action="store_true", help="do not file the record under bench/results/")
    args = p.parse_args(argv)
    args.levels = parse_levels(args.levels or ("1,4" if args.quick else "1,8,32,128"))
    args.max_tokens = args.max_tokens or (8 if args.quick else 32)
    args.runs = args.runs or (1 if args.quick else 5)
    if args.runs < 1:
        raise SystemExit("--runs takes a whole number >= 1")
    m = _results.machine()
    print(_results.header(m))
    with tempfile.TemporaryDirectory(prefix="serve_load-") as tmp:
        model_args, config = model_source(args, tmp)
        vocab = config.vocab_size
        queue = 2 * max(args.levels)  # every client's request waits rather than meeting 429
        timeout = args.time_limit + 60

        def ours(max_batch):
            extra = ["--slot-positions", str(args.slot_positions), "--gguf-weights", args.gguf_weights] if args.gguf else []
            extra += ["--compile"] if args.compile else []
            extra += ["--bf16-kernel"] if args.bf16_kernel else []
            return Server([*model_args, *extra], max_batch, queue, timeout, tmp)

        if args.gguf:
            from tformer.interop.gguf_config import resolve_gguf

            prompts = chat_prompts(args.gguf, max(max(2 * c, 16) for c in args.levels) + 2)
            print(f"model: {args.gguf}; chat prompts of {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
                  f"{args.max_tokens} new tokens each (end token ignored), greedy, streamed")
            results = {"tformer": run_mode(f"tformer serve --max-batch {args.max_batch} --gguf-weights {args.gguf_weights}"
                                           + (" --compile" if args.compile else "")
                                           + (" --bf16-kernel" if args.bf16_kernel else ""),
                                           ours(args.max_batch), args,
                                           lambda i: prompts[i % len(prompts)]),
                       "llama-server": run_mode(f"llama-server --parallel {args.max_batch}",
                                                LlamaServer(Path(args.llama_server), resolve_gguf(args.gguf),
                                                            args.max_batch, args.slot_positions, tmp),
                                                args, lambda i: prompts[i % len(prompts)], one_llama_request)}
        else:
            print(f"model: {config.n_layers} layers, d_model {config.d_model}, vocab {config.vocab_size}; prompts of "
                  f"{PROMPT_TOKENS} tokens, {args.max_tokens} new tokens each, greedy, streamed")
            results = {"continuous": run_mode(f"continuous batching (--max-batch {args.max_batch})",
                                              ours(args.max_batch), args, lambda i: prompt_for(i, vocab)),
                       "one-at-a-time": run_mode("one at a time (--max-batch 1)", ours(1), args,
                                                 lambda i: prompt_for(i, vocab))}
    print()
    print(level_table(results))
    print()
    verdicts = []
    if args.gguf:
        print(peer_table(results))
        ours_, peer = results["tformer"], results["llama-server"]
        if 32 in ours_ and 32 in peer:
            ratio = ours_[32]["tokens_per_s"] / max(peer[32]["tokens_per_s"], 1e-12)
            ttft = (ours_[32]["ttft_s"]["p95"] or 0) <= (peer[32]["ttft_s"]["p95"] or float("inf"))
            verdicts.append(f"32 clients: {ratio:.2f}x llama-server's tokens/s, p95 TTFT "
                            f"{'no worse' if ttft else 'worse'} ({'meets' if ratio >= 2 and ttft else 'misses'} "
                            "the 2x target)")
        if 1 in ours_ and 1 in peer:
            ratio = ours_[1]["tokens_per_s"] / max(peer[1]["tokens_per_s"], 1e-12)
            verdicts.append(f"1 client: {ratio:.2f}x ({'meets' if ratio >= 1 else 'misses'} the 1x target)")
        predicted = {}
    else:
        predicted = predicted_speedups(config, args.levels, args.max_batch, PROMPT_TOKENS + args.max_tokens // 2)
        print(ratio_table(results, predicted))
        device = next(iter(predicted.values()))["device"]
        print(f"predicted: the ledger's decode tokens/s at that batch over batch 1 (tformer.cost.batching) on {device}: "
              "'profile' reads its measured curves, 'peak' the single-peak roofline")
        if 32 in results["continuous"] and 32 in results["one-at-a-time"]:
            ratio = results["continuous"][32]["tokens_per_s"] / max(results["one-at-a-time"][32]["tokens_per_s"], 1e-12)
            verdicts.append(f"32 clients: {ratio:.2f}x one-at-a-time tokens/s ({'meets' if ratio >= 4 else 'below'} "
                            "the 4x target)")
    failures = sum(r["failed"] for levels in results.values() for r in levels.values())
    verdicts.append(f"failed requests: {failures} ({'meets' if failures == 0 else 'misses'} the zero-failure target)")
    print("; ".join(verdicts))
    record = {"model": {k: getattr(config, k) for k in ("arch", "n_layers", "d_model", "vocab_size", "max_positions")},
              "source": "gguf" if args.gguf else "ckpt" if args.ckpt else "hf" if args.hf else "random",
              "gguf": args.gguf, "gguf_weights": args.gguf_weights if args.gguf else None, "compile": args.compile, "bf16_kernel": args.bf16_kernel,
              "slot_positions": args.slot_positions if args.gguf else None, "prompt_tokens": PROMPT_TOKENS,
              "max_tokens": args.max_tokens, "max_batch": args.max_batch, "levels": args.levels, "runs": args.runs,
              "results": {mode: {str(c): r for c, r in levels.items()} for mode, levels in results.items()},
              "predicted_speedup": {str(c): v for c, v in predicted.items()}}
    # beside llama-server: its own record, so the report's serving section keeps reading continuous vs one-at-a-time
    _results.write("serve_llamacpp" if args.gguf else "serve_load", record, m, args.json,
                   file_it=not (args.no_save or args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
