"""Which computational path is faster on this machine, as measured here: the data behind every choice
between two ways of computing the same thing (today: nn.Linear's plain BLAS call or its split-rows
form for few-row products, tformer.model.linear).

A choice is never a constant tuned on some other CPU. It is read off timings taken on this machine:
by `tformer bench` (a sweep of shapes), or, where no bench has run, by a micro-benchmark of at most
100 ms the first time a choice is made (tformer.model.path_choice, before a model decodes). Either way the timings are saved beside the machine's
profile ($XDG_CACHE_HOME/tformer/profiles/<key>.paths.json), per thread count, and reused. When no
timing covers a case the answer is the plain path: the safe default is PyTorch's own.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass

from tformer.core.atomic import atomic_write_text
from tformer.core.errors import TformerError
from tformer.core.files import read_json
from tformer.machine.profile_store import machine_key, profile_path

PATHS_VERSION = 1
PLAIN = "plain"
# A path replaces the plain one only when it measured at least this much faster: timings of a few
# milliseconds on a shared machine swing by several percent, and a wrong "faster" costs more than a
# missed one (the plain path is what PyTorch users get anyway).
MIN_GAIN = 1.10
# A timing speaks for shapes within this factor of its own in rows, weight size and input width
# (log distance); beyond it nothing was measured and the plain path stands.
MAX_FACTOR = 4.0


@dataclass(frozen=True)
class PathPoint:
    """Seconds per call of two paths for one product shape: x (rows, k) @ W (n, k).T, fp32, W streamed
    from memory (beyond the last-level cache), at ``threads`` intra-op threads."""

    op: str  # "linear"
    path: str  # the alternative to the plain path: "split"
    rows: int
    n: int
    k: int
    threads: int
    dtype: str
    plain_s: float
    path_s: float
    source: str  # "bench" | "first use"

    @property
    def gain(self) -> float:
        return self.plain_s / self.path_s if self.path_s > 0 else 0.0


class PathTable:
    """The measured points of one op on this machine; ``choose`` answers from the nearest one."""

    def __init__(self, points: list[PathPoint] | tuple = ()):
        self.points = list(points)

    def covers(self, op: str, threads: int, dtype: str) -> bool:
        return any(p.op == op and p.threads == threads and p.dtype == dtype for p in self.points)

    def nearest(self, op: str, rows: int, n: int, k: int, threads: int, dtype: str) -> PathPoint | None:
        """The point closest to (rows, n x k, k) in log space, if it is within MAX_FACTOR in rows and k and
        not MAX_FACTOR smaller in weight size. A larger weight may be any size: the points' weights are
        already streamed from memory, and streaming more of them behaves alike; a much smaller one may
        sit in cache, where a fixed per-call cost decides instead."""
        limit = math.log(MAX_FACTOR)
        best, best_d = None, math.inf
        for p in self.points:
            if p.op != op or p.threads != threads or p.dtype != dtype:
                continue
            size = math.log(n * k / (p.n * p.k))
            gaps = (abs(math.log(rows / p.rows)), abs(size), abs(math.log(k / p.k)))
            if gaps[0] > limit or gaps[2] > limit or -size > limit:
                continue
            d = sum(gaps)
            if d < best_d:
                best, best_d = p, d
        return best

    def choose(self, op: str, rows: int, n: int, k: int, threads: int, dtype: str) -> str:
        """The path to take: the measured alternative when the nearest timing shows it MIN_GAIN faster,
        else the plain path (also when nothing near was measured)."""
        p = self.nearest(op, rows, n, k, threads, dtype) if min(rows, n, k) > 0 else None
        return p.path if p is not None and p.gain >= MIN_GAIN else PLAIN

    def merged(self, points: list[PathPoint]) -> PathTable:
        """This table with ``points`` added, replacing points of the same op, path, shape, threads and dtype."""
        def key(p):
            return (p.op, p.path, p.rows, p.n, p.k, p.threads, p.dtype)
        new = {key(p) for p in points}
        return PathTable([p for p in self.points if key(p) not in new] + list(points))


def paths_path(key: str | None = None) -> str:
    """Beside the profile: profiles/<key>.paths.json."""
    return profile_path(key or machine_key())[: -len(".json")] + ".paths.json"


def load_paths(key: str | None = None, on_damage: Callable[[str], None] | None = None) -> PathTable:
    """The saved timings for this machine (an empty table when none are saved). A damaged file raises
    a TformerError; with ``on_damage``, it is reported there instead and counts as empty (it is a
    cache: the timings are taken again and the file replaced)."""
    path = paths_path(key)
    if not os.path.isfile(path):
        return PathTable()
    fix = "delete it (the timings are taken again at first use) or rerun `tformer bench`"
    try:
        data = read_json(path, "the saved path timings", max_bytes=4 << 20, fix=fix)
        if data.get("version") != PATHS_VERSION:
            raise ValueError(f"version {data.get('version')!r}")
        return PathTable([PathPoint(**p) for p in data["points"]])
    except TformerError as exc:
        error = exc
    except (ValueError, KeyError, TypeError) as exc:
        error = TformerError(f"the saved path timings {path} are unreadable ({type(exc).__name__}: {exc}); {fix}")
    if on_damage is None:
        raise error
    on_damage(f"note: {error}")
    return PathTable()


def save_paths(table: PathTable, key: str | None = None) -> str:
    """Write the table atomically beside the profile; returns the path."""
    path = paths_path(key)
    atomic_write_text(path, json.dumps({"version": PATHS_VERSION, "points": [asdict(p) for p in table.points]},
                                       indent=1))
    return path


def record_paths(points: list[PathPoint], key: str | None = None,
                 on_damage: Callable[[str], None] | None = None) -> PathTable:
    """Add ``points`` to the saved timings (replacing the same shapes) and save; returns the table."""
    table = load_paths(key, on_damage).merged(points)
    save_paths(table, key)
    return table


__all__ = ["MAX_FACTOR", "MIN_GAIN", "PLAIN", "PathPoint", "PathTable", "load_paths", "paths_path", "record_paths",
           "save_paths"]
