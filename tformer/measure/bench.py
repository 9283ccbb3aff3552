"""What this machine really does: matmul FLOP/s over a sweep of sizes, and STREAM bandwidth.

Method (stated in every result):
- A matmul of n x n by n x n counts 2 n^3 FLOPs (int8: operations, OPS).
- Each point: warm-up calls first (excluded: they pay for allocation, JIT and thread start-up),
  then several repetitions, each timing enough back-to-back calls to last a few milliseconds;
  on a GPU the device is synchronised before and after each timed region. We report the median
  and the spread (min, max, quartiles) of the per-call time.
- Bandwidth: the four STREAM kernels on fp32 arrays at least 4x the last-level cache, bytes
  counted by the STREAM convention: copy and scale 2 arrays per element, add and triad 3. Stores
  that first read the line (write-allocate) are real traffic STREAM does not count.
- GEMV: y = x @ W.T + b for one or a few rows, through the same call the model's Linear layers make
  (tformer.model.linear.Linear, its path chosen first), with W well beyond the last-level cache; bytes counted = the bytes
  of W only (x, b and y are a rounding error). Batch-1 decode is a chain of these, and they read
  weights at their own rate, not at the STREAM rate.

The records a run returns (points, comparisons, BenchResult) live in tformer.machine.bench_records.
"""

from __future__ import annotations

import datetime
import math
import os
import statistics
import time

import torch

from tformer.core import fmt
from tformer.core.errors import TformerError
from tformer.core.quant_formats import GGML_BLOCKS, KEPT_BLOCKS
from tformer.machine import profile_store
from tformer.machine.bench_records import (
    MATMUL_DTYPES,
    STREAM_ARRAYS,
    STREAM_KERNELS,
    BenchResult,
    Comparison,
    DeviceBench,
    ElementwisePoint,
    GemvPoint,
    MatmulPoint,
    StreamPoint,
)
from tformer.machine.specs import last_level_cache_bytes
from tformer.measure.bench_compare import compare
from tformer.measure.probe import detect_machine
from tformer.model import ggml_kernel
from tformer.model.ggml_encode import random_blocks
from tformer.model.linear import Linear
from tformer.model.path_choice import choose_paths

# Size sweeps. bf16/fp16 on CPUs without native support run ~100x slower than fp32, so their sweep
# starts small and the per-call time budget below stops it before it eats the run.
CPU_SIZES = {
    True: {"fp32": [64, 128, 256, 512, 1024, 2048], "bf16": [64, 128, 256, 512, 1024], "fp16": [32, 64, 128],
           "int8": [64, 128, 256, 512], "fp64": [128, 512]},
    False: {"fp32": [32, 64, 128, 256, 512, 1024, 2048], "bf16": [32, 64, 128, 256, 512, 1024, 2048],
            "fp16": [32, 64, 128, 256, 512], "int8": [64, 128, 256, 512, 1024, 2048],
            "fp64": [64, 128, 256, 512, 1024]},
}
GPU_SIZES = {
    True: {d: [256, 1024, 2048, 4096, 8192] for d in ("fp32", "tf32", "bf16", "fp16", "int8", "fp64")},
    False: {d: [128, 256, 512, 1024, 2048, 4096, 8192, 16384] for d in ("fp32", "tf32", "bf16", "fp16", "int8", "fp64")},
}
DEFAULT_DTYPES = {"cpu": ("fp32", "bf16", "fp16", "int8"), "cuda": ("fp32", "tf32", "bf16", "fp16", "int8")}


# --------------------------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------------------------

def _summary(times: list[float]) -> dict:
    ordered = sorted(times)
    if len(ordered) >= 4:
        q = statistics.quantiles(ordered, n=4)
        q1, q3 = q[0], q[2]
    else:
        q1, q3 = ordered[0], ordered[-1]
    return {"median_s": statistics.median(ordered), "min_s": ordered[0], "max_s": ordered[-1], "q1_s": q1, "q3_s": q3}


def time_calls(fn, sync, reps: int, min_rep_s: float, warmup: int = 2) -> tuple[list[float], int, float]:
    """Per-call seconds for ``reps`` repetitions; also the calls per repetition and one warm call's time.

    Warm-up calls are excluded. Each repetition runs enough calls to last ``min_rep_s`` so the timer's
    resolution and the Python loop do not dominate small kernels.
    """
    # Warm up by count and by time: the first calls pay for thread-pool start-up, kernel selection and
    # page faults, and a clock may need a few ms to ramp. The per-call estimate comes from the later
    # warm-up calls only.
    for _ in range(max(1, warmup)):
        fn()
    sync()
    calls, t0 = 0, time.perf_counter()
    while True:
        fn()
        calls += 1
        sync()
        elapsed = time.perf_counter() - t0
        if calls >= 2 and elapsed >= min(min_rep_s, 0.05) or elapsed >= 0.5:
            break
    one = max(elapsed / calls, 1e-9)
    calls = max(1, min(100_000, math.ceil(min_rep_s / one)))
    times = []
    for _ in range(reps):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        times.append((time.perf_counter() - t0) / calls)
    return times, calls, one


def _torch_dtype(dtype: str):
    return {"fp32": torch.float32, "tf32": torch.float32, "fp64": torch.float64, "bf16": torch.bfloat16,
            "fp16": torch.float16, "int8": torch.int8}[dtype]


def _sync_for(device: str):
    if device.startswith("cuda"):
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def bench_matmul(device: str, dtype: str, n: int, reps: int = 5, min_rep_s: float = 0.02,
                 warmup: int = 2) -> tuple[MatmulPoint, float]:
    """One point of the curve; also returns the time of one warm call (used to stop slow sweeps)."""
    gen = torch.Generator(device="cpu").manual_seed(n)
    if dtype == "int8":
        a = torch.randint(-8, 8, (n, n), dtype=torch.int8, generator=gen).to(device)
        b = torch.randint(-8, 8, (n, n), dtype=torch.int8, generator=gen).to(device)
        if not hasattr(torch, "_int_mm"):
            raise RuntimeError("this PyTorch has no int8 matmul (torch._int_mm)")
        fn = lambda: torch._int_mm(a, b)  # noqa: E731 - int8 x int8 -> int32, the integer GEMM
    else:
        tdt = _torch_dtype(dtype)
        a = torch.randn(n, n, generator=gen).to(device=device, dtype=tdt)
        b = torch.randn(n, n, generator=gen).to(device=device, dtype=tdt)
        out = torch.empty(n, n, device=device, dtype=tdt)
        fn = lambda: torch.mm(a, b, out=out)  # noqa: E731 - out= keeps the allocator out of the timing
    sync = _sync_for(device)
    times, calls, one = time_calls(fn, sync, reps, min_rep_s, warmup)
    s = _summary(times)
    flops = 2 * n**3
    point = MatmulPoint(device=device, dtype=dtype, n=n, flops=flops, reps=reps, calls_per_rep=calls,
                        flops_per_s=flops / s["median_s"], flops_per_s_best=flops / s["min_s"], **s)
    return point, one


def bench_stream(device: str, elements: int, reps: int = 5, min_rep_s: float = 0.02,
                 kernels=STREAM_KERNELS) -> list[StreamPoint]:
    """STREAM copy/scale/add/triad on fp32 arrays of ``elements`` each."""
    a = torch.ones(elements, device=device)
    b = torch.full((elements,), 2.0, device=device)
    c = torch.zeros(elements, device=device)
    q = 3.0
    fns = {
        "copy": lambda: c.copy_(a),
        "scale": lambda: torch.mul(c, q, out=b),
        "add": lambda: torch.add(a, b, out=c),
        "triad": lambda: torch.add(b, c, alpha=q, out=a),
    }
    sync = _sync_for(device)
    out = []
    for kernel in kernels:
        times, calls, _ = time_calls(fns[kernel], sync, reps, min_rep_s, warmup=1)
        s = _summary(times)
        nbytes = STREAM_ARRAYS[kernel] * elements * 4
        out.append(StreamPoint(device=device, kernel=kernel, elements=elements, element_bytes=4, bytes=nbytes,
                               reps=reps, calls_per_rep=calls, bytes_per_s=nbytes / s["median_s"],
                               bytes_per_s_best=nbytes / s["min_s"], **s))
    return out


# (rows, k) points, W of transformer shape (4k x k, an MLP up-projection; at most one STREAM array).
# The weight-read rate depends on the row length k and on the row count. Measured on a 2-core EPYC
# through the model's Linear (rows cut across both cores): 1 row 17-18 GB/s, 8 rows 7-8 GB/s; through
# plain F.linear (BLAS, one thread for one row): 1 row 11 GB/s at k = 768 to 18 at k = 4096, 8 rows
# 3-6 GB/s. 8 rows is a common decode batch (bench/decode_speed.py runs batch 1 and 8).
GEMV_POINTS = tuple((rows, k) for rows in (1, 8) for k in (768, 2048, 4096))
# The block kernel also on a small W (256 x 256): its points fit a per-call cost beside a stream rate
# (Device.call_rate), and a small model's 576 x 192 projections sit near that end.
KERNEL_POINTS = tuple((rows, k) for rows in (1, 8) for k in (256, 768, 2048, 4096))
# bf16 GEMV on a CPU without native bf16 runs through a conversion path, compute-bound and slow:
# measured on GPUs only, where it is cheap and decode commonly runs in bf16.
GEMV_DTYPES = {"cpu": ("fp32",), "cuda": ("fp32", "bf16")}


def bench_gemv(device: str, dtype: str, n: int, k: int, rows: int = 1, reps: int = 5,
               min_rep_s: float = 0.02, count: int = 1) -> GemvPoint:
    """y = x @ W.T + b with x (rows, k) and ``count`` distinct W (n, k), called in turn through the
    model's own Linear call (so the prediction is for the kernel decode really runs), one layer's
    weights after another as in decode, so with enough bytes in all no call finds its W in the
    cache. Bytes and times are per call of one W."""

    tdt = _torch_dtype(dtype)
    gen = torch.Generator(device="cpu").manual_seed(k)
    layers = torch.nn.ModuleList()
    for _ in range(max(1, count)):
        layer = Linear(k, n, device=device, dtype=tdt)
        with torch.no_grad():
            layer.weight.copy_(torch.randn(n, k, generator=gen))
            layer.bias.zero_()
        layers.append(layer)
    x = torch.randn(rows, k, generator=gen).to(device=device, dtype=tdt)
    choose_paths(layers)  # the path decode takes for this product, chosen as the decoding entry points do

    def fn():
        with torch.no_grad():
            for layer in layers:
                layer(x)

    times, calls, _ = time_calls(fn, _sync_for(device), reps, min_rep_s, warmup=1)
    times = [t / len(layers) for t in times]
    s = _summary(times)
    nbytes = n * k * layers[0].weight.element_size()
    return GemvPoint(device=device, dtype=dtype, rows=rows, n=n, k=k, weight_bytes=nbytes, reps=reps,
                     calls_per_rep=calls * len(layers), bytes_per_s=nbytes / s["median_s"],
                     bytes_per_s_best=nbytes / s["min_s"], **s)


def bench_gemv_blocks(layout: str, n: int, k: int, rows: int = 1, reps: int = 5, min_rep_s: float = 0.02,
                      count: int = 1) -> GemvPoint:
    """The block kernel (tformer.model.ggml_kernel) on ``count`` distinct W (n, k) kept in ``layout``'s blocks
    (config.quantize's name: q4_1, ...), repacked once and called as a kept Linear calls it, one W after another
    as in decode: the rate at which a kept matrix's few-row product reads its blocks. Filed as a GemvPoint whose
    dtype is the layout's name; the roofline reads it for ops whose weights are kept in that layout."""
    ggml_type = layout.upper()
    fmt = ggml_kernel.FORMATS[ggml_type]
    gen = torch.Generator(device="cpu").manual_seed(k)
    first = ggml_kernel.repack(random_blocks(n, k, ggml_type, gen), ggml_type)
    weights = [first] + [first.clone() for _ in range(max(1, count) - 1)]  # distinct memory, same values
    x = torch.randn(rows, k, generator=gen)

    def fn():
        for w in weights:
            ggml_kernel.product(x, w, fmt)

    times, calls, _ = time_calls(fn, _sync_for("cpu"), reps, min_rep_s, warmup=1)
    times = [t / len(weights) for t in times]
    s = _summary(times)
    nbytes = first.numel()
    return GemvPoint(device="cpu", dtype=layout, rows=rows, n=n, k=k, weight_bytes=nbytes, reps=reps,
                     calls_per_rep=calls * len(weights), bytes_per_s=nbytes / s["median_s"],
                     bytes_per_s_best=nbytes / s["min_s"], **s)


# The element-wise kernels a Transformer layer runs, as (inputs + outputs) arrays of the output's
# size, each timed at a few output sizes (rows x width): in the cache and beyond it, since a model's
# activations are both. Rates differ from STREAM where arithmetic (erf, exp) or a reduction over the
# row sets the pace.
ELEMENTWISE_ARRAYS = {"add": 3, "gelu": 2, "layer_norm": 2, "softmax": 2}
ELEMENTWISE_SHAPES = {True: ((256, 256), (2048, 256), (2048, 1024)),
                      False: ((256, 256), (2048, 256), (2048, 1024), (8192, 1024), (16384, 2048))}


def bench_elementwise(device: str, rows: int, width: int, reps: int = 5, min_rep_s: float = 0.02) -> list:
    """add, gelu, layer_norm and softmax on fp32 (rows, width) tensors, as the model calls them."""
    gen = torch.Generator(device="cpu").manual_seed(rows + width)
    x = torch.randn(rows, width, generator=gen).to(device)
    y = torch.randn(rows, width, generator=gen).to(device)
    w, b = torch.ones(width, device=device), torch.zeros(width, device=device)
    fns = {"add": lambda: x + y, "gelu": lambda: torch.nn.functional.gelu(x),
           "layer_norm": lambda: torch.nn.functional.layer_norm(x, (width,), w, b),
           "softmax": lambda: torch.softmax(x, dim=-1)}
    sync = _sync_for(device)
    out = []
    with torch.no_grad():
        for kernel, fn in fns.items():
            times, calls, _ = time_calls(fn, sync, reps, min_rep_s, warmup=2)
            s = _summary(times)
            nbytes = ELEMENTWISE_ARRAYS[kernel] * rows * width * 4
            out.append(ElementwisePoint(device=device, kernel=kernel, elements=rows * width, width=width,
                                        bytes=nbytes, reps=reps, calls_per_rep=calls,
                                        bytes_per_s=nbytes / s["median_s"], bytes_per_s_best=nbytes / s["min_s"],
                                        **s))
    return out


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------

def _stream_elements(device: str, specs, quick: bool) -> tuple[int, str]:
    """fp32 elements per array: 4x the last-level cache (STREAM's rule), within a share of memory."""
    if device.startswith("cuda"):
        l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0
        target = max(4 * l2, (256 if quick else 1024) * 2**20)
        free, _ = torch.cuda.mem_get_info(device)
        target = min(target, free // 8)
        return target // 4, f"4x L2 ({fmt.in_unit(l2, 'MiB', 0)}) or at least {(256 if quick else 1024)} MiB per array"
    llc = last_level_cache_bytes(specs) or 32 * 2**20
    target = max(4 * llc, 64 * 2**20)
    total = specs.memory.total_bytes if specs else None
    if total:
        target = min(target, total // 12)  # three arrays must fit comfortably
    return target // 4, f"4x the last-level cache ({fmt.in_unit(llc, 'MiB', 0)}) per array"


def torch_device(name: str | None) -> str:
    """The one device a measurement runs on, as "cpu" or "cuda:N": ``name`` checked against what this
    machine has (None: the first GPU, else the CPU). torch's own parser would raise a RuntimeError for
    a name like "tpu", and only once a tensor is made."""
    if name is None:
        return "cuda:0" if torch.cuda.is_available() else "cpu"
    if name in ("cuda", "gpu"):
        name = "cuda:0"
    if name != "cpu" and not (name.startswith("cuda:") and name[5:].isdigit()):
        raise TformerError(f"unknown device {name!r}; use cpu, cuda or cuda:N")
    if name == "cpu" or name in _devices("all"):
        return name
    if not torch.cuda.is_available():
        raise TformerError(f"--device {name} asked for, but no CUDA device is available here; use --device cpu")
    raise TformerError(f"device {name!r} is not available; available: {', '.join(_devices('all'))}")


def _devices(devices) -> list[str]:
    cuda = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    if devices is None or devices == "all":
        return ["cpu"] + cuda
    if isinstance(devices, str):
        devices = [d.strip() for d in devices.split(",") if d.strip()]
    out = []
    for d in devices:
        if d == "cpu":
            out.append("cpu")
        elif d == "cuda" or d == "gpu":
            if not cuda:
                raise TformerError("no CUDA GPU is available here; use --device cpu")
            out.extend(cuda)
        elif d.startswith("cuda:"):
            if d not in cuda:
                raise TformerError(f"device {d!r} is not available; available: {', '.join(['cpu'] + cuda)}")
            out.append(d)
        else:
            raise TformerError(f"unknown device {d!r}; use cpu, cuda, cuda:N or all")
    return list(dict.fromkeys(out))


def _load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def run_bench(quick: bool = True, devices=None, dtypes=None, sizes: list[int] | None = None,
              reps: int | None = None, stream: bool = True, specs=None, progress=None,
              threads: int | None = None) -> BenchResult:
    """Measure matmul curves and STREAM bandwidth on each device, and compare with the theoretical peaks.

    ``devices``: None/"all" (CPU and every GPU), "cpu", "cuda", "cuda:N" or a list. ``dtypes``: subset
    of MATMUL_DTYPES (default per device kind). ``sizes``: override the sweep (same for every dtype).
    ``progress``: optional callable(str) for a line per step. ``threads``: CPU threads for the run
    (default: PyTorch's current setting), restored afterwards.
    """

    started = time.perf_counter()
    load_before = _load_average()
    say = progress or (lambda _msg: None)
    if threads is not None and threads < 1:
        raise TformerError("--threads must be at least 1")
    if dtypes is not None:
        if isinstance(dtypes, str):
            dtypes = [d.strip() for d in dtypes.split(",") if d.strip()]
        bad = [d for d in dtypes if d not in MATMUL_DTYPES]
        if bad:
            raise TformerError(f"unknown matmul dtype {bad[0]!r}; choose from {', '.join(MATMUL_DTYPES)}")
    if sizes is not None and (not sizes or any(int(n) < 1 for n in sizes)):
        raise TformerError("sizes must be positive integers, e.g. --sizes 128,256,512")
    if reps is not None and reps < 1:
        raise TformerError("--reps must be at least 1")
    device_list = _devices(devices)  # bad names fail here, before the slow detection
    if specs is None:
        specs = detect_machine()
    n_reps = reps or (5 if quick else 10)
    min_rep_s = 0.02 if quick else 0.05
    # A dtype's sweep stops when one call takes longer than this (slow emulated dtypes).
    max_call_s = 0.15 if quick else 2.0
    # --quick promises under 30 s even on a busy 2-core machine: past this many seconds of matmul the
    # remaining points are skipped (and listed), leaving time for the bandwidth kernels.
    deadline = started + (15.0 if quick else 600.0)
    results = []
    prev_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        results = _run_devices(device_list, quick, dtypes, sizes, n_reps, min_rep_s, max_call_s, stream,
                               specs, say, deadline, load_before)
    finally:
        torch.set_num_threads(prev_threads)
    conventions = [
        "matmul FLOPs = 2 x n^3 for an n x n by n x n product (int8: operations, OPS)",
        "per point: warm-up excluded, median and spread (min, max, quartiles) over repetitions; GPU "
        "synchronised around every timed region",
        "peak = best median over the size sweep",
        "STREAM bytes: copy and scale count 2 arrays, add and triad 3 (write-allocate traffic not counted)",
        "GEMV bytes: the weight matrix W only, read once per y = x @ W.T + b call (x with 1 or 8 rows)",
        "1 GB/s = 1e9 B/s",
    ]
    return BenchResult(machine_key=profile_store.machine_key(specs), quick=quick,
                       created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                       torch_version=torch.__version__, wall_s=time.perf_counter() - started, devices=results,
                       conventions=conventions, load_before=load_before, logical_cpus=os.cpu_count())


def _run_devices(devs, quick, dtypes, sizes, n_reps, min_rep_s, max_call_s, stream, specs, say, deadline,
                 load_before=None):
    results = []
    for dev in devs:
        is_gpu = dev.startswith("cuda")
        if is_gpu:
            idx = int(dev.split(":")[1])
            props = torch.cuda.get_device_properties(idx)
            db = DeviceBench(device=dev, name=props.name, memory_bytes=int(props.total_memory))
        else:
            db = DeviceBench(device="cpu", name=specs.cpu.model, threads=torch.get_num_threads(),
                             memory_bytes=specs.memory.total_bytes)
        kind = "cuda" if is_gpu else "cpu"
        for dtype in (dtypes or DEFAULT_DTYPES[kind]):
            if dtype == "tf32" and not is_gpu:
                db.skipped.append("tf32: a GPU tensor-core mode; CPUs compute fp32")
                continue
            sweep = sorted(int(n) for n in sizes) if sizes else (GPU_SIZES if is_gpu else CPU_SIZES)[quick].get(dtype, [])
            prev_tf32 = torch.backends.cuda.matmul.allow_tf32 if is_gpu else None
            try:
                if is_gpu:  # fp32 means true fp32 (CUDA cores); tf32 is the tensor-core mode
                    torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
                for n in sweep:
                    if time.perf_counter() > deadline:
                        db.skipped.append(f"{dtype}: sizes from n={n} skipped, the run's time budget was spent")
                        break
                    say(f"{dev} matmul {dtype} n={n}")
                    try:
                        point, one = bench_matmul(dev, dtype, n, reps=n_reps, min_rep_s=min_rep_s)
                    except (RuntimeError, TypeError, NotImplementedError) as exc:
                        db.skipped.append(f"{dtype} n={n}: not supported here ({str(exc).splitlines()[0][:120]})")
                        break
                    db.matmul.append(point)
                    if one > max_call_s and n != sweep[-1]:
                        db.skipped.append(f"{dtype}: sizes above n={n} skipped, one call took {one:.2f} s "
                                          f"(budget {max_call_s} s per call)")
                        break
            finally:
                if is_gpu:
                    torch.backends.cuda.matmul.allow_tf32 = prev_tf32
        if stream:
            elements, why = _stream_elements(dev, specs, quick)
            say(f"{dev} STREAM on {fmt.in_unit(elements * 4, 'MiB', 0)} arrays")
            db.stream = bench_stream(dev, elements, reps=n_reps, min_rep_s=min_rep_s)
            # GEMV: W of 4k x k (capped at one STREAM array), repeated in distinct copies up to one
            # STREAM array in all (4x the last-level cache): every call reads its W from memory, as
            # decode does once its weights exceed the cache.
            total = elements * 4
            for dtype in GEMV_DTYPES["cuda" if is_gpu else "cpu"]:
                for rows, k in GEMV_POINTS:
                    esize = 2 if dtype == "bf16" else 4
                    n = max(1, min(4 * k, total // (k * esize)))
                    count = max(1, math.ceil(total / (n * k * esize)))
                    say(f"{dev} GEMV {dtype} rows={rows} {count} x W {n}x{k}")
                    try:
                        db.gemv.append(bench_gemv(dev, dtype, n, k, rows, reps=n_reps, min_rep_s=min_rep_s,
                                                  count=count))
                    except (RuntimeError, TypeError, NotImplementedError) as exc:
                        db.skipped.append(f"GEMV {dtype}: not supported here ({str(exc).splitlines()[0][:120]})")
                        break
            if not is_gpu and ggml_kernel.available():
                # The block kernel on each kept layout, the same shapes and bytes: a GGUF model's kept matrices
                # run there (--gguf-weights auto), at a rate neither GEMV nor STREAM gives.
                # Square W (n = k), not GEMV's 4k x k: a kernel call's fixed cost (the dispatch, rounding the
                # activations, waking the pool) counts as it does on a small model's q/k/v/o products.
                for layout in KEPT_BLOCKS:
                    per_block, block_bytes = GGML_BLOCKS[layout.upper()]
                    for rows, k in KERNEL_POINTS:
                        row_bytes = k // per_block * block_bytes
                        n = max(1, min(k, total // row_bytes))
                        count = max(1, math.ceil(total / (n * row_bytes)))
                        say(f"{dev} block kernel {layout} rows={rows} {count} x W {n}x{k}")
                        db.gemv.append(bench_gemv_blocks(layout, n, k, rows, reps=n_reps, min_rep_s=min_rep_s,
                                                         count=count))
            for rows, width in ELEMENTWISE_SHAPES[quick]:
                say(f"{dev} element-wise kernels on {rows} x {width}")
                db.elementwise.extend(bench_elementwise(dev, rows, width, reps=n_reps, min_rep_s=min_rep_s))
        db.comparisons = compare(db, specs, load_before)
        results.append(db)
        if is_gpu:
            torch.cuda.empty_cache()
    return results


# The records are re-exported: callers that measure and read results import from one place.
__all__ = ["STREAM_ARRAYS", "BenchResult", "Comparison", "DeviceBench", "ElementwisePoint", "GemvPoint", "MatmulPoint",
           "StreamPoint", "bench_elementwise",
           "bench_gemv", "bench_matmul", "bench_stream", "compare", "run_bench", "time_calls", "torch_device"]
