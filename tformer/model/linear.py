"""nn.Linear, with a second CPU path for the few-row products of decoding, taken only where this
machine measured it faster.

``F.linear`` is the teaching path, the reference and the default. The alternative is
``split_rows_linear`` (tformer.model.split_linear): the same sums with the weight's output rows cut
into one slice per thread. Whether it pays depends on the CPU and its BLAS, so no threshold is
written here. The choice for a product of ``rows`` x ``k`` with an ``n`` x ``k`` weight is read off
timings taken on this machine (tformer.machine.path_choices): the ones `tformer bench` saved, or,
where none cover the current thread count, a micro-benchmark of about 100 ms run once, at the first
few-row product, and saved beside the machine's profile (tformer.model.linear_tuning). Nothing
measured near the shape means the plain path.

The split path is only ever a candidate without autograd (training keeps PyTorch's own backward),
on CPU, in fp32, with more than one thread and a contiguous weight of at least one row per slice.

``TFORMER_LINEAR_PATH`` overrides the choice for a process: ``plain`` (always F.linear), ``split``
(every candidate splits, to time that path), ``auto`` (the default: measured). ``use_paths(table)``
does the same in code, with a table of timings (tests, benches).
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
from tformer.machine.path_choices import PLAIN, PathTable, load_paths, record_paths
from tformer.model import linear_tuning
from tformer.model.block_quantized import LAYOUTS as BLOCK_LAYOUTS
from tformer.model.quantized import Int4Linear, Int8Linear, QuantizedLinear
from tformer.model.split_linear import split_rows_linear

MODES = ("auto", "plain", "split")
_state = {"table": None, "override": None}  # the loaded/tuned PathTable; a table or mode set in code
_choices: dict[tuple, str] = {}  # (rows, n, k, threads) -> path; cleared when use_paths() changes the source


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
        if torch.compiler.is_compiling():
            return table  # never time inside a trace: the compiled graph takes the plain path here
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
    """Within the block, choose from ``table`` (a PathTable) or by a mode ("plain", "split", "auto")."""
    if isinstance(table, str) and table not in MODES:
        raise TformerError(f"linear path mode {table!r} is unknown; use auto, plain or split")
    previous = _state["override"]
    _state["override"] = table
    _choices.clear()
    try:
        yield
    finally:
        _state["override"] = previous
        _choices.clear()


def choose(rows: int, n: int, k: int, threads: int) -> str:
    """'plain' or 'split' for a candidate product (see the module docstring for what is a candidate)."""
    how = mode()
    if how != "auto":
        return how
    if torch.compiler.is_compiling() and _state["table"] is None and not isinstance(_state["override"], PathTable):
        return PLAIN  # nothing loaded yet and no timing inside a trace; not cached, eager calls still tune
    key = (rows, n, k, threads)
    found = _choices.get(key)
    if found is None:
        found = _choices[key] = path_table(threads).choose("linear", rows, n, k, threads, "fp32")
    return found


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through the split path where this machine measured it faster: the call every Linear makes."""
    if torch.compiler.is_compiling():  # a compiled graph picks its own kernels; timings of eager calls do not apply
        return F.linear(x, weight, bias)
    if x.device.type != "cpu" or x.dtype != torch.float32 or weight.dtype != torch.float32 \
            or not weight.is_contiguous() or (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)):
        return F.linear(x, weight, bias)
    n, k = weight.shape
    rows = x.numel() // k if k else 0
    threads = torch.get_num_threads()
    if threads < 2 or rows < 1 or n < threads or choose(rows, n, k, threads) == PLAIN:
        return F.linear(x, weight, bias)
    return split_rows_linear(x, weight, bias, threads)


def quantized_linear(spec) -> QuantizedLinear:
    """The quantized module for a described Linear (tformer.cost.architecture.Linear with a ``layout``)."""
    if spec.layout == "int8":
        return Int8Linear(spec.d_in, spec.d_out, bias=spec.bias)
    if spec.layout == "int4":
        return Int4Linear(spec.d_in, spec.d_out, bias=spec.bias, group=spec.group)
    if spec.layout in BLOCK_LAYOUTS:
        return BLOCK_LAYOUTS[spec.layout](spec.d_in, spec.d_out, bias=spec.bias)
    raise TformerError(f"{spec.path}: weights in layout {spec.layout!r} are not supported; quantize to int8, int4, "
                       f"{' or '.join(BLOCK_LAYOUTS)}")


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state-dict keys) that takes the split path where it pays here."""

    @classmethod
    def described(cls, spec) -> "Linear":
        """The Linear an architecture description (tformer.cost.architecture.Linear) names: weight-only
        quantized (tformer.model.quantized) where the spec has ``bits``."""
        if spec.layout:
            return quantized_linear(spec)
        return cls(spec.d_in, spec.d_out, bias=spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)


__all__ = ["MODES", "Linear", "choose", "linear", "mode", "path_table", "quantized_linear", "split_rows_linear",
           "use_paths"]
