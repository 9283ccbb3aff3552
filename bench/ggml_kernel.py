"""The block-quantized kernel (tformer.model.ggml_kernel) against its two floors: at one row, the read-only
stream (a decode step can read weights no faster); at 32 rows, fp32 GEMM on the same weights dequantized (what
a model widened to fp32 runs).

    python bench/ggml_kernel.py                  # every format, ~1-2 minutes on 2 cores
    python bench/ggml_kernel.py --formats Q4_1,Q8_0 --reps 9

Weights stream from memory as decoding meets them: each format's matrices (the shapes of SmolLM2-135M and
Gemma 3 270M that the format's block fits) are repeated into a stack of at least 256 MB of blocks, and one
repetition is one pass over the whole stack, every matrix called once. Random blocks (finite scales): speed does
not depend on the values. The kernel and its peer alternate inside every repetition; the median of the
repetitions is the figure, every repetition is kept in the record. Targets (issue #48): at one row >= 70% of the
read stream; at 32 rows not slower than fp32 F.linear on the dequantized weights.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _results  # noqa: E402

from tformer.core.quant_formats import GGML_BLOCKS  # noqa: E402
from tformer.model import ggml_kernel  # noqa: E402
from tformer.model.ggml_blocks import decode  # noqa: E402
from tformer.model.ggml_encode import random_blocks  # noqa: E402

# (out, in): SmolLM2-135M's q/o, k/v, gate/up and down; Gemma 3 270M's q, o, gate/up, down.
SHAPES = [(576, 576), (192, 576), (1536, 576), (576, 1536), (1024, 640), (640, 1024), (2048, 640), (640, 2048)]
STACK_BYTES = 256 << 20


def stack(ggml_type: str, generator: torch.Generator) -> list[torch.Tensor]:
    per_block = GGML_BLOCKS[ggml_type][0]
    shapes = [(n, k) for n, k in SHAPES if k % per_block == 0]
    distinct = [random_blocks(n, k, ggml_type, generator) for n, k in shapes]
    size = sum(b.numel() for b in distinct)
    return [b.clone() for _ in range(max(1, -(-STACK_BYTES // size))) for b in distinct]


def in_width(blocks: torch.Tensor, ggml_type: str) -> int:
    per_block, block_bytes = GGML_BLOCKS[ggml_type]
    return blocks.shape[1] // block_bytes * per_block


def timed_pass(calls) -> float:
    t = time.perf_counter()
    for call in calls:
        call()
    return time.perf_counter() - t


def measure(ggml_type: str, rows: int, reps: int, generator: torch.Generator, with_fp32: bool) -> dict:
    blocks = stack(ggml_type, generator)
    xs = {k: torch.randn(rows, k, generator=generator) for k in {in_width(b, ggml_type) for b in blocks}}
    fmt = ggml_kernel.FORMATS[ggml_type]
    # Repacked once, as a Linear does at load; product() is the call a Linear makes (matmul() repacks every call).
    packed = [ggml_kernel.repack(b, ggml_type) for b in blocks]
    kernel = [lambda b=b, p=p: ggml_kernel.product(xs[in_width(b, ggml_type)], p, fmt) for b, p in zip(blocks, packed)]
    nbytes = sum(b.numel() for b in blocks)
    out = {"rows": rows, "weight_bytes": nbytes, "matrices": len(blocks)}
    fp32 = []
    if with_fp32:
        block_bytes = GGML_BLOCKS[ggml_type][1]
        # Dequantized once, outside the timing: the fp32 model's weights, 32 / bits times the bytes.
        weights = [decode(b.reshape(-1, block_bytes), ggml_type).view(b.shape[0], -1) for b in blocks]
        fp32 = [lambda w=w: F.linear(xs[w.shape[1]], w) for w in weights]
        out["fp32_weight_bytes"] = sum(w.numel() * 4 for w in weights)
    with torch.no_grad():
        timed_pass(kernel), fp32 and timed_pass(fp32)  # warm: page the stacks in, start the pool
        k_times, f_times = [], []
        for _ in range(reps):
            k_times.append(timed_pass(kernel))
            if fp32:
                f_times.append(timed_pass(fp32))
    out["kernel_s"] = _results.spread(k_times)
    out["kernel_gb_s"] = nbytes / statistics.median(k_times) / 1e9
    if fp32:
        out["fp32_s"] = _results.spread(f_times)
        out["kernel_over_fp32"] = statistics.median(f_times) / statistics.median(k_times)  # > 1: the kernel is faster
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--formats", default=",".join(ggml_kernel.FORMATS), help="comma-separated (default: all)")
    p.add_argument("--reps", type=int, default=7, help="repetitions per figure (median quoted; at least 5)")
    _results.add_run_args(p)
    args = p.parse_args(argv)
    if not ggml_kernel.available():
        print(ggml_kernel.unavailable_reason())
        return 2
    if args.threads:
        torch.set_num_threads(args.threads)
    m = _results.machine()
    print(_results.header(m))
    stream = _results.read_stream()
    print(f"kernel: {ggml_kernel.simd()}; read-only stream {stream / 1e9:.1f} GB/s; {args.reps} repetitions, median")
    g = torch.Generator().manual_seed(0)
    record = {"simd": ggml_kernel.simd(), "read_stream_gb_s": stream / 1e9, "formats": {}}
    rows_out = []
    for ggml_type in args.formats.split(","):
        one = measure(ggml_type, 1, args.reps, g, with_fp32=False)
        many = measure(ggml_type, 32, args.reps, g, with_fp32=True)
        one["of_stream"] = one["kernel_gb_s"] * 1e9 / stream
        record["formats"][ggml_type] = {"rows_1": one, "rows_32": many}
        rows_out.append([ggml_type, f"{one['kernel_gb_s']:.1f}", f"{100 * one['of_stream']:.0f}%",
                         f"{1e3 * many['kernel_s']['median']:.1f}", f"{1e3 * many['fp32_s']['median']:.1f}",
                         f"{many['kernel_over_fp32']:.2f}x"])
        print(_results.table(["format", "1 row GB/s", "of stream", "32 rows ms", "fp32 ms", "vs fp32"],
                             rows_out[-1:]).splitlines()[-1] if len(rows_out) > 1 else
              _results.table(["format", "1 row GB/s", "of stream", "32 rows ms", "fp32 ms", "vs fp32"], rows_out),
              flush=True)
    print("targets: one row >= 70% of the stream; 32 rows >= 1.00x fp32 F.linear on the dequantized weights")
    _results.write("ggml_kernel", record, m, args.json, not args.no_save)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
