"""Timing nn.Linear's two paths on this machine: the plain BLAS call and the split-rows form.

Two sweeps of the same measurement. ``FIRST_USE`` is small enough to run inside the first few-row
product a process makes when no timings are saved (at most about 100 ms); ``BENCH`` is what
`tformer bench` adds to the machine's profile. Each point times both paths on weights streamed from
memory, as decoding meets them: the weights rotate through a pool of twice the last-level cache
(capped: 64 MB at first use, 256 MB in the bench), so few calls find their weight in cache. The two
paths alternate inside every repetition so a noisy neighbour slows both alike; the median is kept.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.nn.functional as F

from tformer.machine import last_level_cache_bytes
from tformer.machine.path_choices import PathPoint
from tformer.model.split_linear import split_rows_linear

# (rows, n, k): decode's row counts (a batch, beams) and weights from 1 MB to 16 MB in both aspects.
FIRST_USE = [(rows, n, k) for rows in (1, 8) for n, k in ((512, 512), (1024, 1024), (4096, 1024), (1024, 4096))]
BENCH = [(rows, n, k) for rows in (1, 4, 16) for n, k in ((512, 512), (1024, 1024), (4096, 1024), (1024, 4096),
                                                         (2048, 2048), (8192, 2048), (2048, 8192))]
FIRST_USE_BUDGET_S = 0.1


def pool_bytes(cap: int) -> int:
    """Twice the last-level cache, at most ``cap`` (filling memory takes time too) and at least 16 MB."""
    llc = last_level_cache_bytes() or 32 << 20
    return max(16 << 20, min(2 * llc, cap))


def _weights(buffer: torch.Tensor, n: int, k: int) -> list[torch.Tensor]:
    """Consecutive (n, k) views of ``buffer``: at least two, as many as fit."""
    count = max(2, buffer.numel() // (n * k))
    if count * n * k > buffer.numel():
        buffer = torch.full((count * n * k,), 1e-3)
    return [buffer[i * n * k:(i + 1) * n * k].view(n, k) for i in range(count)]


def time_point(buffer: torch.Tensor, rows: int, n: int, k: int, threads: int, reps: int,
               source: str) -> PathPoint:
    """Median seconds per call of F.linear and split_rows_linear for x (rows, k) @ W (n, k).T, fp32."""
    pool = _weights(buffer, n, k)
    x = torch.full((rows, k), 1e-3)
    times: dict[str, list[float]] = {"plain": [], "split": []}
    paths = {"plain": lambda w: F.linear(x, w), "split": lambda w: split_rows_linear(x, w, None, threads)}
    with torch.no_grad():
        for fn in paths.values():  # first-call set-up (thread pool start, BLAS dispatch) is not the path's
            fn(pool[0])
        i = 0
        for _ in range(reps):
            for name, fn in paths.items():
                w = pool[i % len(pool)]
                i += 1
                t0 = time.perf_counter()
                fn(w)
                times[name].append(time.perf_counter() - t0)
    return PathPoint("linear", "split", rows, n, k, threads, "fp32", statistics.median(times["plain"]),
                     statistics.median(times["split"]), source)


def measure(shapes, threads: int, budget_s: float | None = None, source: str = "bench",
            pool_cap: int = 256 << 20) -> list[PathPoint]:
    """One point per (rows, n, k) shape at ``threads`` threads; stops early when ``budget_s`` is spent
    (the points measured so far are kept, the first always: nearer shapes then answer, and the rest fall
    to plain)."""
    buffer = torch.empty(pool_bytes(pool_cap) // 4)
    buffer.fill_(1e-3)  # any finite value: uninitialised memory may hold denormals, which are slow
    start = time.perf_counter()  # the budget is for timing; filling the pool is paid once whatever it is
    points = []
    for rows, n, k in shapes:
        # At least one point whatever the budget: a slow or loaded machine that measured nothing would
        # find its timings missing again at every new shape, and tune again each time.
        if points and budget_s is not None and time.perf_counter() - start > budget_s:
            break
        points.append(time_point(buffer, rows, n, k, threads, reps=5 if budget_s else 9, source=source))
    return points


def first_use(threads: int) -> list[PathPoint]:
    """The quick sweep, with its time budget (about 100 ms)."""
    return measure(FIRST_USE, threads, FIRST_USE_BUDGET_S, source="first use", pool_cap=64 << 20)


__all__ = ["BENCH", "FIRST_USE", "FIRST_USE_BUDGET_S", "first_use", "measure", "time_point"]
