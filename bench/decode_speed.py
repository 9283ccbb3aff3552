"""Decode speed: tformer's generate vs transformers' generate on the same weights, the KV cache's
speed-up as the context grows, and each decode step against its memory-bandwidth roofline.

    python bench/decode_speed.py                 # char-small and gpt2 (random weights), ~2-3 minutes
    python bench/decode_speed.py --models gpt2 --batches 1 --json decode.json
    python bench/decode_speed.py --models gpt2 --device cuda --contexts 1024    # on a GPU: CUDA graphs

What is measured (CPU, fp32, random weights: speed does not depend on the values):
  1. decode tokens/s at batch 1 and 8, with and without the cache, ours (eager, and compiled: a
     torch.compile'd step over a preallocated cache) and transformers' (its dynamic cache, its static
     cache, and its static cache with the forward compiled). All are timed the same way: wall
     clock of generate(N+1 new tokens) minus generate(1 new token), so the prefill and per-call
     set-up cancel and what is left is N decode steps; compilation happens in an untimed warm-up.
     The columns alternate within each repeat, so machine noise hits all; the best repeat is kept.
     The compiled step is set against the read roofline: batch x read-only stream rate / weight
     bytes (target: at least 75% of it at batch 1 on a CPU).
  2. cached vs uncached time per decode step at contexts 128, 512, 1024 (gpt2; char-small stops
     at its 128-token window): with the cache (static layout, generate's default) a step reads n
     cached keys; without it the model reruns all n tokens.
  3. the roofline bound of a cached decode step: a step must read every weight once plus the KV
     cache, so time >= (weight bytes + KV bytes) / memory bandwidth. The bandwidth is this
     machine's measured profile (`tformer bench`) if one is saved, else a copy measured here.
  4. the budget of the 2x target at batch 1: half of transformers' time per token, set against
     the two parts any step has on a CPU: reading the weights (at best at the read-only stream
     rate measured here, a plain sum, which no matrix-vector product beats) and the glue around
     the products (norms, attention, residuals, sampling, Python), timed on the model's skeleton
     (same layers, 8-wide heads: the products cost nothing there).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import torch

import tformer
from tformer.core.config import preset
from tformer.cost.ledger import Workload
from tformer.generate import generate
from tformer.machine.path_choices import MIN_GAIN
from tformer.measure.step import time_skeleton
from tformer.model import build, linear, runner_for
from tformer.model.path_choice import choose_paths

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402  (bench/_results.py: the machine header and bench/results/ files)


# Machine ------------------------------------------------------------------------------------
def measured_bandwidth() -> tuple[float, str]:
    """Bytes/s to main memory: the saved bench profile if there is one, else a copy measured now."""
    try:
        from tformer.machine import resolve_hardware

        device = resolve_hardware("measured")
        if device.bandwidth:
            return float(device.bandwidth), f"saved profile ({device.source})"
    except Exception:  # no profile saved (or the measure package is not there): measure below
        pass
    # STREAM-style copy of 512 MiB, far beyond any cache: bytes read + bytes written per second.
    n = 512 * 2**20 // 4
    src, dst = torch.ones(n), torch.empty(n)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return 2 * n * 4 / best, "copy of 512 MiB measured now (read + write bytes)"


# Models -------------------------------------------------------------------------------------
def make_pair(name: str, device: str = "cpu"):
    """Our model with random weights and transformers' GPT2LMHeadModel holding the same weights, on ``device``."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    config = preset(name, dropout=0.0, attention_dropout=0.0)
    torch.manual_seed(0)
    ours = build(config).eval()
    with tempfile.TemporaryDirectory() as d:
        tformer.save_hf(ours, d)
        theirs = transformers.AutoModelForCausalLM.from_pretrained(d).eval()
    return ours.to(device), theirs.to(device)


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())  # tied tensors once


# Timing -------------------------------------------------------------------------------------
def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_call(fn, device="cpu") -> float:
    sync(device)
    t = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t


# tformer's own paths for nn.Linear: the default (chosen from this machine's timings) and each one forced.
PATHS = ("auto", "plain", "split")
# The columns of the tokens/s table: ours eager on each nn.Linear path, ours compiled, transformers with
# its dynamic cache (its default), its static cache, and its static cache with its forward compiled.
COLUMNS = {"auto": "default", "plain": "plain", "split": "split", "compiled": "compiled", "hf": "HF",
           "hf_static": "HF static", "hf_compiled": "HF st+comp"}


def ours_generate(model, ids, n, use_cache, path="auto", compiled=False):
    def call():
        with linear.use_paths(path):
            generate(model, ids, max_new_tokens=n, stop_tokens=[], use_cache=use_cache, compile=compiled)
    return call


def hf_generate(model, ids, n, use_cache, cache="dynamic", backend="inductor"):
    """transformers' generate: its dynamic cache, its static cache run eagerly, or its static cache with the
    forward compiled (what transformers does by itself on CUDA; asked for explicitly elsewhere)."""
    from transformers import CompileConfig

    mask = torch.ones_like(ids)
    extra = {}
    if cache != "dynamic":
        extra["cache_implementation"] = "static"
        if cache == "compiled":
            mode = "reduce-overhead" if ids.is_cuda and backend == "inductor" else "default"
            config = CompileConfig(fullgraph=True, backend=backend, mode=mode)
            config._compile_all_devices = True  # transformers compiles on CUDA only unless told
            extra["compile_config"] = config
        else:
            extra["disable_compile"] = True

    def call():
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False,
                           use_cache=use_cache, pad_token_id=0, eos_token_id=None, **extra)
    return call


def decode_rates(ours, theirs, batch, prompt, new, use_cache, repeats, compiled=False):
    """Best-of-repeats decode tokens/s of each column, measured alternately. compiled: the compiled columns'
    backend ("inductor", "eager"), or False for none."""
    device = next(ours.parameters()).device
    ids = torch.randint(0, ours.config.vocab_size, (batch, prompt), generator=torch.Generator().manual_seed(1))
    ids = ids.to(device)
    paths = PATHS if device.type == "cpu" else ("auto",)  # the split path is a CPU path
    calls = {path: (ours_generate(ours, ids, 1, use_cache, path), ours_generate(ours, ids, new + 1, use_cache, path))
             for path in paths}
    calls["hf"] = (hf_generate(theirs, ids, 1, use_cache), hf_generate(theirs, ids, new + 1, use_cache))
    if use_cache:
        calls["hf_static"] = (hf_generate(theirs, ids, 1, True, "static"), hf_generate(theirs, ids, new + 1, True, "static"))
    if use_cache and compiled:
        calls["compiled"] = (ours_generate(ours, ids, 1, True, compiled=compiled),
                             ours_generate(ours, ids, new + 1, True, compiled=compiled))
        calls["hf_compiled"] = (hf_generate(theirs, ids, 1, True, "compiled", compiled),
                                hf_generate(theirs, ids, new + 1, True, "compiled", compiled))
    for key, (short, long) in calls.items():  # warm-up: first calls pay one-time set-up (and compilation)
        t = time.perf_counter()
        short()
        long()
        short()
        if key in ("compiled", "hf_compiled"):
            print(f"  ({COLUMNS[key]} at batch {batch}: compiled and warmed in {time.perf_counter() - t:.0f} s)")
    best = {k: 0.0 for k in calls}
    for _ in range(repeats):
        for key, (short, long) in calls.items():
            dt = time_call(long, device) - time_call(short, device)
            if dt > 0:
                best[key] = max(best[key], batch * new / dt)
    return best


def step_times(model, batch, context, steps, repeats):
    """Seconds per decode step at ``context`` tokens: (cached, uncached, KV bytes), best of repeats."""
    device = next(model.parameters()).device
    ids = torch.randint(0, model.config.vocab_size, (batch, context), generator=torch.Generator().manual_seed(2))
    ids = ids.to(device)
    mask = torch.ones_like(ids)
    token = torch.zeros(batch, dtype=torch.long, device=device)
    best_cached = best_uncached = float("inf")
    kv_bytes = 0
    runner = runner_for(model)
    choose_paths(model)  # each Linear's path, as generate chooses it
    with torch.no_grad():
        for rep in range(repeats):
            # Cached: prefill context - steps tokens, then time the steps that bring it to context.
            cached = runner.new_cache(batch, context + 1)
            runner.prefill(cached, ids[:, : context - steps], mask[:, : context - steps])
            runner.step(cached, token)  # warm the step path

            def run_steps(cached=cached):
                for _ in range(steps - 1):
                    runner.step(cached, token)
            best_cached = min(best_cached, time_call(run_steps, device) / (steps - 1))
            kv_bytes = cached.nbytes
            # Uncached: a step at context n reruns the model over all n tokens (last logits only).
            # Seconds long at large n, so its noise is small: one timing is enough there.
            if rep == 0 or context <= 256:
                uncached = runner.new_cache(batch, kv=False)
                best_uncached = min(best_uncached, time_call(lambda c=uncached: runner.prefill(c, ids, mask), device))
    return best_cached, best_uncached, kv_bytes


def glue_seconds(config, prompt: int) -> float:
    """Seconds per cached decode step of the model's skeleton at batch 1: the step's fixed cost."""
    return time_skeleton(config, Workload(phase="decode", batch=1, seq=prompt + 1, context=prompt))[2]


def budget_lines(hf_tokens_per_s, ours_tokens_per_s, wbytes, read_bw, glue, target=2.0) -> list[str]:
    """Where the time of a batch-1 token must go for ours to reach ``target`` x transformers."""
    budget = 1 / (target * hf_tokens_per_s)
    weights = wbytes / read_bw
    ceiling = (1 / hf_tokens_per_s) / (weights + glue)
    return [f"{target:g}x transformers at batch 1 needs <= {budget * 1e3:.1f} ms per token "
            f"(transformers {1e3 / hf_tokens_per_s:.1f} ms, ours {1e3 / ours_tokens_per_s:.1f} ms). Of that:",
            f"  reading the {wbytes / 1e6:.0f} MB of weights once at the read-only stream rate "
            f"({read_bw / 1e9:.1f} GB/s) takes {weights * 1e3:.1f} ms, leaving {(budget - weights) * 1e3:.1f} ms",
            f"  the glue around the products (the model's skeleton, measured now) takes {glue * 1e3:.1f} ms",
            f"  best ratio with the products at the stream rate and this glue: {ceiling:.2f}x"
            f" ({'reachable' if ceiling >= target else 'below'} the {target:g}x target)"]


def read_bandwidth(device="cpu") -> float:
    """Bytes/s of a read-only stream (a sum over 512 MiB): what a decode step's weight reads can hope for."""
    x = torch.ones(512 * 2**20 // 4, device=device)
    best = float("inf")
    for _ in range(5):
        best = min(best, time_call(x.sum, device))
    return x.numel() * 4 / best


# Main -------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="char-small,gpt2")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompt", type=int, default=16, help="prompt tokens for the tokens/s comparison")
    p.add_argument("--new", type=int, default=16, help="decode steps timed per generate call")
    p.add_argument("--contexts", default="128,512,1024")
    p.add_argument("--context-batches", default="1", help="batches for the context sweep (e.g. 1,8)")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--no-uncached-hf", action="store_true", help="skip transformers without its cache")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads (default: torch's choice). On a shared machine use 1: with every core "
                        "threaded, one busy core stalls every op at its barrier and timings fall apart")
    p.add_argument("--device", default="cpu", help="cpu or cuda (on CUDA, compiled steps replay as CUDA graphs)")
    p.add_argument("--compile", default="inductor", choices=["inductor", "eager", "none"],
                   help="the compiled columns' backend: inductor (generated kernels; the real thing), eager "
                        "(traced only: a quick check that the columns run), none (skip them)")
    p.add_argument("--json", default=None, metavar="FILE")
    p.add_argument("--no-save", action="store_true", help="do not file the figures under bench/results/")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    models = [m for m in args.models.split(",") if m]
    batches = [int(b) for b in args.batches.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]

    import transformers

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: this PyTorch sees no CUDA device")
    compiled = args.compile if args.compile != "none" else False  # the backend, or False
    if device.type == "cuda":
        bandwidth, bw_source = read_bandwidth(device), "device read stream measured now"
    else:
        bandwidth, bw_source = measured_bandwidth()
    machine = _results.machine()
    print(f"{_results.header(machine)}, transformers {transformers.__version__}, python {sys.version.split()[0]}")
    table = linear.path_table()  # this machine's timings (tuned now if none are saved): what "default" follows
    print(f"nn.Linear path timings: {len(table.points)} points ({linear.mode()} mode); the split path is chosen "
          f"at {sum(p.gain >= MIN_GAIN for p in table.points)} of them")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"load average before the run: {load:.2f} (other processes share these cores; compare ratios)")
    read_bw = read_bandwidth(device)
    print(f"memory bandwidth: {bandwidth / 1e9:.1f} GB/s ({bw_source}); read-only stream "
          f"{read_bw / 1e9:.1f} GB/s (sum over 512 MiB). The bound below uses the first.")
    print(f"settings: fp32, random weights, greedy, prompt {args.prompt} tokens, {args.new} decode steps per call, "
          f"best of {args.repeats}; tokens/s = batch x steps / seconds (GB = 1e9 bytes)")
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}")
    results = {"machine": machine, "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
               "compile": args.compile, "bandwidth_bytes_per_s": bandwidth, "bandwidth_source": bw_source,
               "read_bandwidth_bytes_per_s": read_bw, "threads": torch.get_num_threads(),
               "decode": [], "context": [], "torch": torch.__version__, "transformers": transformers.__version__}

    for name in models:
        t0 = time.perf_counter()
        ours, theirs = make_pair(name, device)
        wbytes = weight_bytes(ours)
        print(f"\n== {name}: {ours.num_parameters() / 1e6:.1f}M parameters, {wbytes / 1e6:.0f} MB of fp32 weights")
        print("tok/s; default = tformer eager, on the nn.Linear path it chooses from this machine's timings; plain / "
              "split = each forced; compiled = tformer's compiled step; HF = transformers' dynamic cache, HF static = "
              "its static cache, HF st+comp = static cache with its forward compiled; roofline = batch x read "
              "bandwidth / weight bytes (cached rows)")
        keys = [k for k in COLUMNS if (k in PATHS and device.type == "cpu") or k == "auto" or k.startswith("hf")
                or (k == "compiled" and compiled)]
        keys = [k for k in keys if k != "hf_compiled" or compiled]
        print(f"{'batch':>5} {'cache':>6} " + " ".join(f"{COLUMNS[k]:>10}" for k in keys)
              + f" {'roofline':>9} {'default/HF':>10} {'default/best own':>16} {'compiled/roof':>13}")
        budget = []
        for batch in batches:
            for use_cache in (True, False):
                if not use_cache and args.no_uncached_hf:
                    continue
                r = decode_rates(ours, theirs, batch, args.prompt, args.new, use_cache, args.repeats, compiled)
                ratio = r["auto"] / r["hf"] if r["hf"] else float("nan")
                own = r["auto"] / max(r[p] for p in PATHS if p in r)
                roof = batch * read_bw / wbytes if use_cache else float("nan")
                of_roof = r.get("compiled", float("nan")) / roof if use_cache else float("nan")
                cells = " ".join(f"{r[k]:>10.1f}" if k in r else f"{'-':>10}" for k in keys)
                print(f"{batch:>5} {'yes' if use_cache else 'no':>6} {cells} {roof:>9.1f} {ratio:>9.2f}x "
                      f"{own:>15.2f}x {of_roof:>12.0%}")
                results["decode"].append({"model": name, "batch": batch, "cache": use_cache,
                                          "ours_tokens_per_s": r["auto"], "plain_tokens_per_s": r.get("plain"),
                                          "split_tokens_per_s": r.get("split"), "hf_tokens_per_s": r["hf"],
                                          "compiled_tokens_per_s": r.get("compiled"),
                                          "hf_static_tokens_per_s": r.get("hf_static"),
                                          "hf_static_compiled_tokens_per_s": r.get("hf_compiled"),
                                          "read_roofline_tokens_per_s": roof if use_cache else None,
                                          "compiled_over_read_roofline": of_roof if use_cache and compiled else None,
                                          "ratio": ratio, "default_over_best_own": own})
                if batch == 1 and use_cache and r["hf"] and r["auto"] and device.type == "cpu":
                    glue = glue_seconds(ours.config, args.prompt)
                    budget = budget_lines(r["hf"], r["auto"], wbytes, read_bw, glue)
                    results["decode"][-1].update(glue_s=glue, weights_at_read_bw_s=wbytes / read_bw)
        del theirs
        for line in budget:
            print(line)

        limit = ours.config.max_positions
        ctxs = [c for c in contexts if c <= limit] or [limit]
        print(f"{'context':>7} {'batch':>5} {'cached ms':>10} {'uncached ms':>12} {'speed-up':>9} "
              f"{'KV MB':>7} {'bound ms':>9} {'step/bound':>10} {'step/read-bound':>15}")
        for batch in [int(b) for b in args.context_batches.split(",")]:
            for ctx in ctxs:
                cached, uncached, kv = step_times(ours, batch, ctx, steps=6, repeats=args.repeats)
                bound = (wbytes + kv) / bandwidth
                print(f"{ctx:>7} {batch:>5} {cached * 1e3:>10.2f} {uncached * 1e3:>12.1f} {uncached / cached:>8.1f}x "
                      f"{kv / 1e6:>7.1f} {bound * 1e3:>9.2f} {cached / bound:>9.2f}x "
                      f"{cached / ((wbytes + kv) / read_bw):>14.2f}x")
                results["context"].append({"model": name, "batch": batch, "context": ctx, "cached_s": cached,
                                           "uncached_s": uncached, "speedup": uncached / cached, "kv_bytes": kv,
                                           "weight_bytes": wbytes, "bound_s": bound, "step_over_bound": cached / bound})
        print(f"({name} took {time.perf_counter() - t0:.0f} s)")

    first = next((r for r in results["decode"] if r["batch"] == 1 and r["cache"]), None)
    if first is not None:  # one line for records' headlines (bench/gpu_record.py, the report's GPU table)
        compiled_part = (f"compiled {first['compiled_tokens_per_s']:,.0f} tok/s "
                         f"({first['compiled_over_read_roofline']:.0%} of the read roofline), "
                         if first.get("compiled_tokens_per_s") else "")
        results["summary"] = (f"{first['model']} decode at batch 1: {compiled_part}eager {first['ours_tokens_per_s']:,.0f}, "
                              f"HF {first['hf_tokens_per_s']:,.0f}"
                              + (f", HF static+compiled {first['hf_static_compiled_tokens_per_s']:,.0f}"
                                 if first.get("hf_static_compiled_tokens_per_s") else "") + " tok/s")
        print(results["summary"])
    _results.write("decode_speed", results, machine, args.json, not args.no_save)
    return 0


if __name__ == "__main__":
    sys.exit(main())
