"""tformer against llama.cpp on the same GGUF file (SmolLM2-135M-Instruct, Q4_1 layers and a Q8_0 token table; or
Gemma 3 270M, Q4_K_M), beside the read-bandwidth roofline and the ledger's prediction, all measured in one run.

    bash bench/build_llamacpp.sh                # once: llama.cpp's tools from the llama-cpp-python sdist (~6 min)
    python bench/llamacpp.py                    # speed, perplexity (20 chunks), llama.cpp reading tformer's GGUF
    python bench/llamacpp.py --ppl-chunks 0     # the whole WikiText-2 test split (592 chunks: about an hour)
    python bench/llamacpp.py --gguf gemma3-270m --skip export   # Gemma 3: its Q4_K_M mix kept matrix by matrix

What is measured (batch 1, threads = physical cores, the machine otherwise quiet):
  1. llama-bench's protocol: pp512 (tokens/s of a 512-token prompt in one pass) and tg128 (tokens/s of 128
     tokens generated one at a time from an empty context), llama-bench on the file; tformer on the same file,
     eager and compiled (generate's compiled step), its weights dequantized to fp32, kept in their blocks (widened
     exactly at each product: fp32's numbers), kept on torch's bf16 int4 kernel (--bf16-kernel), and kept on
     tformer's block kernel (--gguf-weights kernel: 8-bit activations as llama.cpp; its pool on the threads,
     torch on one).
     tformer's pp512 is generate's prefill of a 512-token prompt; its tg128 the decode steps of generate(129 new
     tokens) from a one-token prompt (the first token comes from the prefill). Both sides: the median of --repeats
     (>= 5) repetitions, with their range and every repetition in the record (llama-bench's own, from its JSON).
  2. tg128's ceiling: the read-only stream rate (a sum over 512 MiB, measured now) over the bytes a decode step
     must read (the ledger's weight and KV bytes of a step at context 64, the middle of tg128); and the ledger's
     predicted decode step against the step measured, per row: its measured roofline on this machine's saved
     `tformer bench` profile (weight products at the measured GEMV rate, a kept layout at the block kernel's
     measured rate) plus a fixed cost per ledger op, named beside the ratio: compiled, the profile's per-call
     cost; eager, the framework's glue per op measured now on the model's skeleton.
  3. Perplexity, llama.cpp's protocol (chunks of 512 tokens, the second half of each scored) on WikiText-2's
     test raw text: llama-perplexity on the file beside tformer (fp32; kept blocks, widened exactly; kept on
     the bf16 int4 kernel; and on the block kernel, llama.cpp's own arithmetic).
  4. llama.cpp reading a file tformer wrote: the model exported by `tformer export --format gguf --type f32`
     (dequantized weights, the file's tokenizer and chat template carried), scored by llama-perplexity beside
     tformer's fp32 figure; and, with that f32 file as the base, llama.cpp's own top-1 agreement of its Q4_1 run
     (llama-perplexity --kl-divergence: "Same top p"), the peer of tformer's kept-blocks agreement.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from tformer.core.errors import TformerError
from tformer.data.corpora import get_corpus
from tformer.generate import generate
from tformer.interop.gguf_config import resolve_gguf
from tformer.interop.gguf_model import load_gguf
from tformer.machine import cpu_info
from tformer.measure.perplexity import perplexity
from tformer.measure.step_prediction import predict_decode_step
from tformer.model import ggml_kernel
from tformer.model.quantized import QuantizedLinear, use_path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _results  # noqa: E402  (bench/_results.py: the machine header and bench/results/ files)

DEFAULT_BIN = Path.home() / ".cache/llamacpp/llama_cpp_python-0.3.36/vendor/llama.cpp/build/bin"
MODES = ("fp32 eager", "kept eager", "bf16-kernel eager", "block-kernel eager", "fp32 compiled", "kept compiled",
         "bf16-kernel compiled", "block-kernel compiled")


@contextlib.contextmanager
def threads_for(fmt: str, threads: int):
    """The block kernel runs its own pool on the threads and leaves torch one (ggml_kernel.take_threads: the two
    pools spinning side by side halve both); every other mode runs torch on the threads."""
    ggml_kernel._THREADS = threads if fmt == "block-kernel" else 0
    torch.set_num_threads(1 if fmt == "block-kernel" else threads)
    try:
        yield
    finally:
        ggml_kernel._THREADS = 0
        torch.set_num_threads(threads)


# llama.cpp ------------------------------------------------------------------------------------------------
def tool(bin_dir: Path, name: str) -> str:
    path = bin_dir / name
    if not path.is_file():
        raise TformerError(f"{path} not found; build llama.cpp's tools with `bash bench/build_llamacpp.sh` or pass "
                           "--llama-cpp DIR")
    return str(path)


def llama_bench(bin_dir: Path, gguf: Path, threads: int, repeats: int) -> dict:
    """llama-bench's pp512 and tg128: the median of its ``repeats`` repetitions, read from each repetition's own
    tokens/s in its JSON (samples_ts), the statistic tformer's side quotes too."""
    out = subprocess.run([tool(bin_dir, "llama-bench"), "-m", str(gguf), "-p", "512", "-n", "128", "-t",
                          str(threads), "-r", str(repeats), "-o", "json"], capture_output=True, text=True, check=True)
    rows = json.loads(out.stdout)
    found = {}
    for r in rows:
        key = "pp512" if r["n_prompt"] == 512 and r["n_gen"] == 0 else "tg128" if r["n_gen"] == 128 else None
        if key:
            found[key] = _results.spread(r["samples_ts"])["median"]
            found[f"{key}_spread"] = _results.spread(r["samples_ts"])
    found["build"] = f"{rows[0].get('build_commit', '?')} ({rows[0].get('cpu_info', '?')})"
    return found


def llama_perplexity(bin_dir: Path, gguf: Path, text: Path, chunks: int, threads: int, extra=()) -> dict:
    cmd = [tool(bin_dir, "llama-perplexity"), "-m", str(gguf), "-f", str(text), "-c", "512", "-b", "512",
           "-t", str(threads), *(["--chunks", str(chunks)] if chunks else []), *extra]
    out = subprocess.run(cmd, capture_output=True, text=True)
    log = out.stdout + out.stderr
    if out.returncode:
        raise RuntimeError(f"llama-perplexity failed ({out.returncode}): {log[-2000:]}")
    found = {}
    if m := re.search(r"Final estimate: PPL = ([0-9.]+)", log):
        found["perplexity"] = float(m.group(1))
    if m := re.search(r"Same top p:\s*([0-9.]+)", log):
        found["same_top_percent"] = float(m.group(1))
    if m := re.search(r"Mean\s+KLD:\s*([0-9.eE+-]+)", log):
        found["mean_kld"] = float(m.group(1))
    return found


# tformer ------------------------------------------------------------------------------------------------
def tformer_speed(model, prompt: list[int], bos: int, compiled: bool, repeats: int) -> dict:
    """pp512 and tg128 as llama-bench takes them, ``repeats`` times after a warm-up: the median of the repetitions
    (and each one), as on llama.cpp's side."""
    kw = {"stop_tokens": [], "compile": compiled}
    generate(model, [prompt], max_new_tokens=2, **kw)  # warm-up: one-time set-up, path choices, compilation
    generate(model, [[bos]], max_new_tokens=8, **kw)
    pp, tg = [], []
    for _ in range(repeats):
        pp.append(generate(model, [prompt], max_new_tokens=1, **kw).prefill_tokens_per_s)
        tg.append(generate(model, [[bos]], max_new_tokens=129, **kw).decode_tokens_per_s)
    pp, tg = _results.spread(pp), _results.spread(tg)
    return {"pp512": pp["median"], "tg128": tg["median"], "pp512_spread": pp, "tg128_spread": tg}


def products_time(model) -> tuple[float, int]:
    """(seconds, weight bytes) of one decode step's weight products alone, at one row: each Linear's bare op
    (an fp32 Linear as the model calls it, split rows where choose_paths chose them; F.linear on the widened blocks;
    the int4 kernel on the packed blocks where the model is on its bf16 kernel path; the block kernel) called in turn, the whole pass timed (median of 7): the part of a
    step no glue can remove."""
    import statistics

    import torch.nn.functional as F

    calls, nbytes = [], 0
    for m in model.modules():
        if isinstance(m, QuantizedLinear) and m.path == "blocks":
            m.prepare()
            x = torch.randn(1, m.in_features)
            calls.append(lambda m=m, x=x: m._run_blocks(x))
            nbytes += m.kernel_blocks().numel() + (m.bias.numel() * 4 if m.bias is not None else 0)
            continue
        if isinstance(m, QuantizedLinear):
            kernel = m.path == "kernel"
            m.prepare()
            x = torch.randn(1, m.in_features).to(torch.bfloat16)
            calls.append((lambda m=m, x=x: m._kernel(x)) if kernel else
                         (lambda m=m, x=x: F.linear(x.float(), m.dequantized())))
        elif isinstance(m, torch.nn.Linear):
            x = torch.randn(1, m.in_features)
            calls.append(lambda m=m, x=x: m(x))  # as decode calls it: the split-rows path where chosen
        else:
            continue
        nbytes += sum(b.numel() * b.element_size() for b in (*m.buffers(recurse=False), *m.parameters()))
    times = []
    with torch.no_grad():
        for _ in range(8):
            t = time.perf_counter()
            for call in calls:
                call()
            times.append(time.perf_counter() - t)
    return statistics.median(times[1:]), nbytes


def measured_device():
    from tformer.measure.optime import call_overhead
    from tformer.measure.probe import detect_machine
    from tformer.report.context import machine_profile

    bench, note = machine_profile("cpu", detect_machine(), print)
    device = bench.to_device("cpu")
    if device.call_overhead_s is None:
        device = replace(device, call_overhead_s=call_overhead())
    return device, note


# The parts of the record each --skip name leaves out; a later run that skips them keeps the filed ones (dated).
PARTS = {"speed": ("llama.cpp", "read_bandwidth", "profile", "tformer"), "ppl": ("perplexity",),
         "export": ("tformer_gguf_in_llama_cpp",)}


def _carry_skipped(record: dict, m: dict, skip: set, section: str) -> None:
    path = _results.RESULTS / _results.bench_results_name(m["cpu"], m["physical_cores"] or m["logical_cpus"])
    if not path.is_file():
        return
    before = json.loads(path.read_text()).get(section) or {}
    for part, keys in PARTS.items():
        if part in skip and all(k in before for k in keys):
            record.update({k: before[k] for k in keys})
            record[f"{part}_date"] = before.get(f"{part}_date", before.get("date"))


# Main -----------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gguf", default="smollm2-135m-instruct", help="a GGUF file or packaged name")
    p.add_argument("--llama-cpp", type=Path, default=DEFAULT_BIN, help="the folder of llama.cpp's built tools")
    p.add_argument("--threads", type=int, default=None, help="default: physical cores (llama-bench's protocol)")
    p.add_argument("--repeats", type=int, default=5, help="repetitions per figure, both sides (at least 5): the "
                   "median is quoted, every repetition kept in the record")
    p.add_argument("--ppl-chunks", type=int, default=20, help="WikiText-2 chunks of 512 to score (0: all)")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: speed,compiled,ppl,export")
    p.add_argument("--modes", default=",".join(MODES),
                   help="the speed rows to measure, comma-separated (default: all; kept eager widens every block at "
                        "every product and takes minutes on Gemma 3)")
    p.add_argument("--ppl-modes", default="fp32,kept,bf16-kernel,block-kernel",
                   help="tformer's weight modes that score perplexity (kept equals fp32 exactly: fp32 alone saves an "
                        "hour on the whole split)")
    p.add_argument("--json", default=None, help="also write the record here")
    p.add_argument("--no-save", action="store_true", help="do not file the figures under bench/results/")
    args = p.parse_args(argv)
    if args.repeats < 5:
        p.error("--repeats must be at least 5: a median of fewer says little on a noisy machine")
    skip = set(filter(None, args.skip.split(",")))
    threads = args.threads or cpu_info().physical_cores or os.cpu_count()
    torch.set_num_threads(threads)
    m = _results.machine()
    print(_results.header(m))
    path = resolve_gguf(args.gguf)
    record: dict = {"gguf": str(args.gguf), "threads": threads}

    models = {"fp32": load_gguf(path, tokenizer=True, weights="dequantize")}
    try:
        models["kept"] = (load_gguf(path, weights="keep"), None)
        models["bf16-kernel"] = (load_gguf(path, weights="keep"), None)
        use_path(models["bf16-kernel"][0], "kernel")
        if ggml_kernel.available():
            models["block-kernel"] = (load_gguf(path, weights="keep"), None)
            use_path(models["block-kernel"][0], "blocks")
        else:
            print(ggml_kernel.unavailable_reason())
    except TformerError as exc:  # a block type tformer does not keep (Q4_0, Q5_K): fp32 rows only
        record["kept"] = f"not measured: {exc}"
        print(f"kept blocks: {exc}")
    tok = models["fp32"][1]
    text = get_corpus("wikitext2").text("test")
    ids = tok.encode(text)
    # llama-perplexity's protocol where the file adds BOS (Gemma): the text starts with it and each chunk's first
    # token is replaced by it (`tformer perplexity` does the same).
    chunk_bos = tok.bos_id if getattr(tok, "add_bos", False) else None
    if chunk_bos is not None:
        ids = [chunk_bos, *ids]
    prompt = ids[:512]
    bos = tok.bos_id if tok.bos_id is not None else ids[0]

    if "speed" not in skip:
        print(f"llama-bench pp512 / tg128 on {path.name}, {threads} threads ...")
        record["llama.cpp"] = llama_bench(args.llama_cpp, path, threads, args.repeats)
        device, note = measured_device()
        bw = _results.read_stream()
        record["read_bandwidth"] = bw
        record["profile"] = note
        rows = {}
        for mode in args.modes.split(","):
            if mode not in MODES:
                p.error(f"--modes: {mode!r} is not one of {', '.join(MODES)}")
            fmt, how = mode.split()
            if (how == "compiled" and "compiled" in skip) or fmt not in models:
                continue
            model = models[fmt][0]
            print(f"tformer {mode} ...")
            try:
                with threads_for(fmt, threads):
                    rows[mode] = tformer_speed(model, prompt, bos, how == "compiled", args.repeats)
            except Exception as exc:  # a compile failure is a figure too: say it and go on
                rows[mode] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
                continue
            pred = predict_decode_step(model.config, device, compiled=how == "compiled",
                                       row_exact=fmt == "block-kernel").to_dict()
            with threads_for(fmt, threads):
                products, nbytes = products_time(model)
            rows[mode].update(pred, roofline_tg128=bw / pred["bytes_read"], products_s=products,
                              products_bytes_per_s=nbytes / products)
        record["tformer"] = rows
        lc = record["llama.cpp"]
        print(f"\n{'':16}{'pp512 tok/s':>12}{'tg128 tok/s':>12}{'x llama pp':>11}{'x llama tg':>11}"
              f"{'roofline tg':>12}{'ledger step':>12}{'measured':>10}")
        print(f"{'llama.cpp':16}{lc['pp512']:12.1f}{lc['tg128']:12.1f}{1:11.2f}{1:11.2f}")
        for mode, r in rows.items():
            if "error" in r:
                print(f"{'tformer ' + mode:16}  {r['error']}")
                continue
            print(f"{'tformer ' + mode:16}{r['pp512']:12.1f}{r['tg128']:12.1f}{r['pp512'] / lc['pp512']:11.2f}"
                  f"{r['tg128'] / lc['tg128']:11.2f}{r['roofline_tg128']:12.1f}{r['predicted_step_s'] * 1e3:10.1f}ms"
                  f"{1e3 / r['tg128']:8.1f}ms")
        print(f"(each figure the median of {args.repeats} repetitions, both sides; roofline tg: {bw / 1e9:.1f} GB/s "
              f"read-only stream over the bytes a step reads; ledger step: {note})")
        for name, r in (("llama.cpp", lc), *((f"tformer {k}", v) for k, v in rows.items() if "error" not in v)):
            print(f"  {name}: " + "; ".join(f"{key} {r[key + '_spread']['min']:.1f}-{r[key + '_spread']['max']:.1f}"
                                            for key in ("pp512", "tg128")) + " (range over the repetitions)")
        for mode, r in rows.items():
            if "error" not in r:
                print(f"  {mode}: ledger {r['predicted_step_s'] * 1e3:.1f} ms / measured {1e3 / r['tg128']:.1f} ms = "
                      f"{r['predicted_step_s'] * r['tg128']:.2f} (+ {r['per_op_s'] * 1e6:.1f} µs per ledger op: "
                      f"{'the framework glue measured on the skeleton' if 'eager' in mode else r['per_op_how']})")
        for mode, r in rows.items():
            if "error" not in r:
                print(f"  {mode}: a step of {1e3 / r['tg128']:.1f} ms holds {r['products_s'] * 1e3:.1f} ms of weight "
                      f"products alone (each Linear timed at one row: {r['products_bytes_per_s'] / 1e9:.1f} GB/s of "
                      f"weights), {1e3 / r['tg128'] - r['products_s'] * 1e3:.1f} ms of everything else")

    with tempfile.TemporaryDirectory() as tmp:
        text_file = Path(tmp) / "wiki.test.raw"
        text_file.write_text(text, encoding="utf-8")
        chunks = args.ppl_chunks or None
        if "ppl" not in skip:
            ppl = {"llama.cpp": llama_perplexity(args.llama_cpp, path, text_file, args.ppl_chunks, threads)}
            for fmt in args.ppl_modes.split(","):
                if fmt not in models:
                    continue
                label = f"tformer {fmt}"
                print(f"{label} perplexity ...")
                with threads_for(fmt, threads):
                    r = perplexity(models[fmt][0], ids, ctx=512, bos_id=chunk_bos, max_chunks=chunks)
                ppl[label] = {"perplexity": r.perplexity, "chunks": r.chunks, "text_tokens": r.text_tokens}
            record["perplexity"] = ppl
            base = ppl["llama.cpp"]["perplexity"]
            print(f"\nperplexity, WikiText-2 test, {next(v['chunks'] for k, v in ppl.items() if k != 'llama.cpp')} chunks of 512:")
            for k, v in ppl.items():
                print(f"  {k:16}{v['perplexity']:10.4f}  ({(v['perplexity'] / base - 1) * 100:+.2f}% vs llama.cpp)")
        if "export" not in skip:
            from tformer.cli import main as cli

            f32 = Path(tmp) / "smollm2-f32.gguf"
            assert cli(["export", "--gguf", str(path), "--format", "gguf", "--type", "f32", "--out", str(f32)]) == 0
            logits = Path(tmp) / "base.kld"
            n = min(args.ppl_chunks or 20, 20)
            theirs = llama_perplexity(args.llama_cpp, f32, text_file, n, threads,
                                      ["--kl-divergence-base", str(logits)])
            kld = llama_perplexity(args.llama_cpp, path, text_file, n, threads,
                                   ["--kl-divergence-base", str(logits), "--kl-divergence"])
            ours = perplexity(models["fp32"][0], ids, ctx=512, bos_id=chunk_bos, max_chunks=n).perplexity
            record["tformer_gguf_in_llama_cpp"] = {"chunks": n, "llama.cpp on tformer's f32 file": theirs,
                                                   "tformer fp32": ours, "llama.cpp Q4_1 vs f32": kld}
            print(f"\nllama.cpp reads tformer's f32 GGUF: perplexity {theirs.get('perplexity')} over {n} chunks "
                  f"(tformer fp32 {ours:.4f}); llama.cpp's Q4_1 run picks its f32 run's top token on "
                  f"{kld.get('same_top_percent')}% of positions (mean KLD {kld.get('mean_kld')})")
    # SmolLM2 keeps the section name its earlier records have; another model files beside it under its own.
    section = "llamacpp" if str(args.gguf) == "smollm2-135m-instruct" else f"llamacpp_{Path(str(args.gguf)).stem}"
    _carry_skipped(record, m, skip, section)
    _results.write(section, record, m, args.json, not args.no_save)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
