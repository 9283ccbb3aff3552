"""nn.Linear, with a second CPU path for the few-row products of decoding, taken only where this
machine measured it faster, and chosen once per layer: never inside forward.

``F.linear`` is the teaching path, the reference and the default. The alternative is
``split_rows_linear`` (tformer.model.split_linear): the same sums with the weight's output rows cut
into one slice per thread. Whether it pays depends on the CPU and its BLAS, so no threshold is
written here. The choice for a product of ``rows`` x ``k`` with an ``n`` x ``k`` weight is read off
timings taken on this machine (tformer.machine.path_choices): the ones `tformer bench` saved, or,
where none cover the current thread count, a micro-benchmark of about 100 ms (tformer.model.linear_tuning)
run once and saved beside the machine's profile. Nothing measured near the shape means the plain path.

The choice is made by an explicit pass, ``choose_paths(model)`` (tformer.model.path_choice), which the
entry points that decode run once (generate, the serving batcher, the measured step, a compiled step before
tracing): it sets each Linear's ``split_rows``, the row counts whose products split, at the thread count it
was made for. A forward reads that attribute and nothing else: no environment variable, no table, no timing.
A model no pass has visited (training, a plain ``model(ids)``) runs F.linear.

The split path is only ever a candidate without autograd (training keeps PyTorch's own backward),
on CPU, in fp32, with more than one thread and a contiguous weight of at least one row per slice.

``TFORMER_LINEAR_PATH`` overrides what the pass chooses, for a process: ``plain`` (always F.linear),
``split`` (every candidate splits, to time that path), ``auto`` (the default: measured). ``use_paths(table)``
does the same in code, with a table of timings (tests, benches), for the passes made inside the block.
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes

from tformer.core.errors import TformerError
from tformer.machine.path_choices import MAX_FACTOR, PLAIN, PathTable, load_paths, record_paths
from tformer.model import linear_tuning
from tformer.model.block_quantized import LAYOUTS as BLOCK_LAYOUTS
from tformer.model.kquant_linear import LAYOUTS as KQUANT_LAYOUTS
from tformer.model.quantized import Int4Linear, Int8Linear, QuantizedLinear
from tformer.model.split_linear import split_rows_linear, split_rows_op

MODES = ("auto", "plain", "split")
_state = {"table": None, "override": None}  # the loaded/tuned PathTable; a table or mode set in code


def mode() -> str:
    """The process's mode: a use_paths() override, else TFORMER_LINEAR_PATH, else auto."""
    override = _state["override"]
    if isinstance(override, str):
        return override
    if override is not None:
        return "auto"
    value = os.environ.get("TFORMER_LINEAR_PATH", "auto").strip().lower() or "auto"
    if value not in MODES:
        raise TformerError(f"TFORMER_LINEAR_PATH={value!r} is not a mode; use auto, plain or split")
    return value


def path_table(threads: int | None = None) -> PathTable:
    """The timings the choice reads: a use_paths() table, else the saved ones, tuned first where they do
    not cover ``threads`` (the first-use micro-benchmark, saved for the next process)."""
    override = _state["override"]
    if isinstance(override, PathTable):
        return override
    threads = threads or torch.get_num_threads()
    table = _state["table"]
    if table is None:
        table = load_paths(on_damage=_note)  # a damaged cache is measured again and replaced
    if threads > 1 and not table.covers("linear", threads, "fp32"):
        # Outside any active dispatch mode: a FlopCounterMode or a profiler's recorder around the first
        # product must not count the benchmark's own products as the model's.
        with _disable_current_modes():
            points = linear_tuning.first_use(threads)
        table = table.merged(points)
        try:
            record_paths(points, on_damage=_note)
        except TformerError as exc:  # a read-only cache costs a re-tune next time, not this run
            _note(f"note: linear path timings not saved ({exc})")
    _state["table"] = table
    return table


def _note(line: str) -> None:
    print(line, file=sys.stderr)


@contextlib.contextmanager
def use_paths(table: PathTable | str):
    """Within the block, choose_paths chooses from ``table`` (a PathTable) or by a mode ("plain", "split",
    "auto"); what it chose stays with the modules after the block."""
    if isinstance(table, str) and table not in MODES:
        raise TformerError(f"linear path mode {table!r} is unknown; use auto, plain or split")
    previous = _state["override"]
    _state["override"] = table
    try:
        yield
    finally:
        _state["override"] = previous


def split_rows_for(n: int, k: int, threads: int) -> frozenset[int] | range:
    """The row counts whose products with an (n, k) fp32 weight take the split path at ``threads`` threads:
    every count under ``split`` mode, the measured ones under ``auto``, none under ``plain``. Row counts
    beyond the table's reach (MAX_FACTOR past its largest measured rows) stay plain."""
    how = mode()
    if threads < 2 or n < threads or how == PLAIN:
        return frozenset()
    if how == "split":
        return range(1, 1 << 62)
    table = path_table(threads)
    measured = [p.rows for p in table.points if p.op == "linear" and p.threads == threads and p.dtype == "fp32"]
    top = int(max(measured, default=0) * MAX_FACTOR)
    return frozenset(r for r in range(1, top + 1) if table.choose("linear", r, n, k, threads, "fp32") != PLAIN)


def quantized_linear(spec) -> QuantizedLinear:
    """The quantized module for a described Linear (tformer.cost.architecture.Linear with a ``layout``)."""
    if spec.layout == "int8":
        return Int8Linear(spec.d_in, spec.d_out, bias=spec.bias)
    if spec.layout == "int4":
        return Int4Linear(spec.d_in, spec.d_out, bias=spec.bias, group=spec.group)
    blocks = {**BLOCK_LAYOUTS, **KQUANT_LAYOUTS}
    if spec.layout in blocks:
        return blocks[spec.layout](spec.d_in, spec.d_out, bias=spec.bias)
    raise TformerError(f"{spec.path}: weights in layout {spec.layout!r} are not supported; quantize to int8, int4, "
                       f"{' or '.join(BLOCK_LAYOUTS)}")


_FIXED_ROWS_GRAPH = False  # set while a compiled step of a fixed row count runs (tformer.model.compiled)


@contextlib.contextmanager
def fixed_rows_graph():
    """Around a call of a graph compiled for a fixed number of rows (generate's compiled step): its Linears take the
    split-rows choice inside the graph. The graph is traced and guarded with the flag as it is set here; serving's
    graph, whose rows are symbolic, is called without it."""
    global _FIXED_ROWS_GRAPH
    before, _FIXED_ROWS_GRAPH = _FIXED_ROWS_GRAPH, True
    try:
        yield
    finally:
        _FIXED_ROWS_GRAPH = before


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state-dict keys) that takes the split path where choose_paths found
    it pays here."""

    # Set by tformer.model.path_choice.choose_paths; the class defaults run F.linear for every product.
    split_rows: frozenset[int] | range = frozenset()  # row counts whose products split
    split_threads: int = 0  # the thread count the choice was made for (at another one, F.linear)

    @classmethod
    def described(cls, spec) -> "Linear":
        """The Linear an architecture description (tformer.cost.architecture.Linear) names: weight-only
        quantized (tformer.model.quantized) where the spec has ``bits``."""
        if spec.layout:
            return quantized_linear(spec)
        return cls(spec.d_in, spec.d_out, bias=spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # A graph of a fixed row count (generate's compiled step, run under fixed_rows_graph) takes the choice
        # choose_paths made just before tracing, as one op with eager's numbers; any other graph (serving's, whose
        # rows are symbolic; a compiled training step) never reads the choice, so it is neither specialized to a
        # row count nor invalidated by a choice made later.
        compiling = torch.compiler.is_compiling()
        if compiling and not _FIXED_ROWS_GRAPH:
            return F.linear(x, self.weight, self.bias)
        # All but the row count held when the choice was made; checked again because a module can be moved,
        # cast, compiled or trained after it (each check is cheap and none reads a tensor's values). The thread
        # count cannot be read while tracing.
        if self.split_rows and x.device.type == "cpu" and x.dtype == torch.float32 \
                and self.weight.dtype == torch.float32 \
                and not (torch.is_grad_enabled() and (x.requires_grad or self.weight.requires_grad)) \
                and x.numel() // self.in_features in self.split_rows:
            if compiling:
                return split_rows_op(x, self.weight, self.bias, self.split_threads)
            if torch.get_num_threads() == self.split_threads:
                return split_rows_linear(x, self.weight, self.bias, self.split_threads)
        return F.linear(x, self.weight, self.bias)


__all__ = ["MODES", "Linear", "fixed_rows_graph", "mode", "path_table", "quantized_linear", "split_rows_for",
           "split_rows_linear", "use_paths"]
