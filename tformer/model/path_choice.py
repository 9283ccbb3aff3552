"""The one pass that chooses how each Linear of a model computes its products on this machine.

Two layer kinds have a choice: a float ``Linear`` (F.linear, or the split-rows form for few-row products:
tformer.model.linear) and a weight-only ``QuantizedLinear`` (dequantise then F.linear, or torch's CPU kernel:
tformer.model.quantized). Both choices come from timings on this machine, and both are made here, before the
model decodes, by the entry points that decode (generate, the serving batcher, the measured step, a compiled
step before it is traced). A forward only reads what was chosen: no environment variable, no saved table,
no first-call micro-benchmark inside it, so a decode step costs the same from the first call, and a compiled
graph sees constants.

``rows``: the row counts of the products the caller will run (decode's batch, a prefill's batch x tokens).
The float choice covers every row count at once; the quantized one is timed per bucket of rows
(tformer.model.quantized.ROW_BUCKETS), once per layer shape and thread count in a process.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

from tformer.model.linear import Linear, split_rows_for
from tformer.model.quantized import QuantizedLinear


def choose_paths(model: nn.Module, rows: Iterable[int] = (1,), dtype: torch.dtype = torch.float32) -> None:
    """Set every Linear's path in ``model`` for products of ``rows`` rows at the current thread count."""
    threads = torch.get_num_threads()
    rows = sorted({max(1, int(r)) for r in rows})
    split: dict[tuple[int, int], frozenset[int] | range] = {}  # (n, k) -> row counts: one lookup per shape
    # Outside any active dispatch mode: a FlopCounterMode or a profiler around the caller must not count the
    # timings' own products as the model's.
    with torch.no_grad(), _disable_current_modes():
        for module in model.modules():
            if isinstance(module, QuantizedLinear):
                for r in rows:
                    module.choose(r, dtype)
            elif isinstance(module, Linear):
                w = module.weight
                if w.device.type != "cpu" or w.dtype != torch.float32 or not w.is_contiguous():
                    module.split_rows, module.split_threads = frozenset(), 0
                    continue
                shape = tuple(w.shape)
                if shape not in split:
                    split[shape] = split_rows_for(*shape, threads)
                module.split_rows, module.split_threads = split[shape], threads


__all__ = ["choose_paths"]
