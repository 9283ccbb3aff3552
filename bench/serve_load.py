"""Serving under load: `tformer serve` with continuous batching against one-request-at-a-time serving of the
same model in the same run, driven over loopback by bounded concurrent streaming clients.

    python bench/serve_load.py                       # random-weight GPT-like model, 1/8/32/128 clients, ~2-4 minutes
    python bench/serve_load.py --quick               # tiny model, 1 and 4 clients: a smoke test
    python bench/serve_load.py --ckpt runs/x --levels 1,8,32 --max-tokens 64

What is measured: the server is started twice as a subprocess (`python -m tformer serve` on 127.0.0.1 at a
free port), first with --max-batch N (continuous batching), then with --max-batch 1. At each concurrency
level c, c asyncio clients (httpx) send a fixed number of requests (default max(2c, 16)), each greedy, with a
fixed max_tokens and stream=true, and stop after --time-limit seconds, saying so. Client-side: requests/s and
tokens/s over the level's wall clock, time to first token (request sent -> first token chunk) and per-token
latency (the gaps between a request's token chunks) at p50/p95/p99. A request fails on any non-200 answer
(429 included), a broken stream or a missing [DONE]. Then the ratio continuous / one-at-a-time tokens/s at
each level (target: >= 4x at 32 clients, zero failures), beside the ledger's predicted decode speed-up at
that batch size (tformer.cost.batching: a decode step at batch b reads the weights once for b tokens).
The measured ratio includes what the prediction leaves out (prefill, HTTP and streaming per token).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple
from pathlib import Path

import httpx
import torch

from tformer.core.config import ModelConfig
from tformer.cost.batching import decode_speedups
from tformer.interop import load_config
from tformer.interop.checkpoint import save_model
from tformer.generate.batching_report import prediction_device
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
        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {self.proc.returncode}:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the server was not healthy after {HEALTH_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

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


async def one_request(client: httpx.AsyncClient, url: str, body: dict, headers: dict) -> Outcome:
    start = time.perf_counter()
    last, tokens, ttft, gaps, done = start, 0, None, [], False
    try:
        async with client.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                return Outcome(False, error=f"HTTP {r.status_code}: {text[:120]}")
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    return Outcome(False, tokens, ttft, tuple(gaps), f"stream error: {str(chunk['error'])[:120]}")
                n = sum(len(c.get("token_ids") or []) for c in chunk.get("choices", []))
                if not n:
                    continue
                now = time.perf_counter()
                if ttft is None:
                    ttft = now - start
                else:
                    gaps.extend([(now - last) / n] * n)
                last, tokens = now, tokens + n
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return Outcome(False, tokens, ttft, tuple(gaps), f"{type(exc).__name__}: {str(exc)[:120]}")
    return Outcome(done, tokens, ttft, tuple(gaps), "" if done else "stream ended without [DONE]")


async def drive(url: str, clients: int, requests: int, body_for, time_limit: float, headers: dict) -> dict:
    """``clients`` workers share ``requests`` requests; whatever is unfinished at ``time_limit`` is cancelled."""
    outcomes: list[Outcome] = []
    todo = iter(range(requests))
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=httpx.Timeout(time_limit + 30.0), limits=limits) as client:
        async def worker():
            for i in todo:
                outcomes.append(await one_request(client, url, body_for(i), headers))

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
def run_mode(label: str, model_args: list[str], max_batch: int, args, vocab: int, tmp: str) -> dict:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}

    def body_for(i: int) -> dict:
        return {"prompt": prompt_for(i, vocab), "max_tokens": args.max_tokens, "temperature": 0, "stream": True}

    out = {}
    queue = 2 * max(args.levels)  # every client's request waits rather than meeting 429
    with Server(model_args, max_batch, queue, args.time_limit + 60, tmp) as server:
        print(f"{label}: serving at {server.url} (--max-batch {max_batch})", flush=True)
        asyncio.run(drive(server.url, 1, 2, body_for, args.time_limit, headers))  # warm-up, not counted
        for c in args.levels:
            n = args.requests or max(2 * c, 4 if args.quick else 16)
            r = asyncio.run(drive(server.url, c, n, body_for, args.time_limit, headers))
            out[c] = r
            stop = f"; stopped at the {args.time_limit:g} s time limit" if r["stopped_at_time_limit"] else ""
            print(f"  {c:4d} clients: {r['ok']}/{n} ok, {r['failed']} failed, {r['tokens_per_s']:.1f} tokens/s"
                  f"{stop}" + (f"; errors: {r['errors']}" if r["errors"] else ""), flush=True)
    return out


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
    p.add_argument("--levels", default=None, help="client counts (default 1,8,32,128; --quick: 1,4)")
    p.add_argument("--requests", type=int, default=None, help="requests per level (default max(2 x clients, 16))")
    p.add_argument("--max-tokens", type=int, default=None, help="new tokens per request (default 32; --quick 8)")
    p.add_argument("--max-batch", type=int, default=128, help="continuous batching's --max-batch")
    p.add_argument("--time-limit", type=float, default=180.0, help="seconds per level before it stops")
    p.add_argument("--api-key", default=None, help="the key a --ckpt/--hf server of yours expects")
    p.add_argument("--quick", action="store_true", help="tiny model, levels 1,4: a smoke test (not filed)")
    p.add_argument("--json", default=None, help="also write the record here")
    p.add_argument("--no-save", action="store_true", help="do not file the record under bench/results/")
    args = p.parse_args(argv)
    args.levels = parse_levels(args.levels or ("1,4" if args.quick else "1,8,32,128"))
    args.max_tokens = args.max_tokens or (8 if args.quick else 32)
    m = _results.machine()
    print(_results.header(m))
    with tempfile.TemporaryDirectory(prefix="serve_load-") as tmp:
        model_args, config = model_source(args, tmp)
        print(f"model: {config.n_layers} layers, d_model {config.d_model}, vocab {config.vocab_size}; prompts of "
              f"{PROMPT_TOKENS} tokens, {args.max_tokens} new tokens each, greedy, streamed")
        vocab = config.vocab_size
        results = {"continuous": run_mode("continuous batching", model_args, args.max_batch, args, vocab, tmp),
                   "one-at-a-time": run_mode("one at a time", model_args, 1, args, vocab, tmp)}
    predicted = predicted_speedups(config, args.levels, args.max_batch, PROMPT_TOKENS + args.max_tokens // 2)
    print()
    print(level_table(results))
    print()
    print(ratio_table(results, predicted))
    device = next(iter(predicted.values()))["device"]
    print(f"predicted: the ledger's decode tokens/s at that batch over batch 1 (tformer.cost.batching) on {device}: "
          "'profile' reads its measured curves, 'peak' the single-peak roofline")
    failures = sum(r["failed"] for levels in results.values() for r in levels.values())
    verdicts = []
    if 32 in results["continuous"] and 32 in results["one-at-a-time"]:
        ratio = results["continuous"][32]["tokens_per_s"] / max(results["one-at-a-time"][32]["tokens_per_s"], 1e-12)
        verdicts.append(f"32 clients: {ratio:.2f}x one-at-a-time tokens/s ({'meets' if ratio >= 4 else 'below'} "
                        "the 4x target)")
    verdicts.append(f"failed requests: {failures} ({'meets' if failures == 0 else 'misses'} the zero-failure target)")
    print("; ".join(verdicts))
    record = {"model": {k: getattr(config, k) for k in ("arch", "n_layers", "d_model", "vocab_size", "max_positions")},
              "source": "ckpt" if args.ckpt else "hf" if args.hf else "random", "prompt_tokens": PROMPT_TOKENS,
              "max_tokens": args.max_tokens, "max_batch": args.max_batch, "levels": args.levels,
              "results": {mode: {str(c): r for c, r in levels.items()} for mode, levels in results.items()},
              "predicted_speedup": {str(c): v for c, v in predicted.items()}}
    _results.write("serve_load", record, m, args.json, file_it=not (args.no_save or args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
