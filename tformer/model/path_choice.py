"""The one pass that chooses how each Linear of a model computes its products on this machine.

A float ``Linear`` has a choice (F.linear, or the split-rows form for few-row products: tformer.model.linear),
read off timings on this machine; both forms are fp32 products of the same weight, so the choice moves the
result by fp32 rounding only. A weight-only ``QuantizedLinear`` has no timed choice: its path (the exact
widening, or torch's bf16 kernel when asked for) changes the arithmetic, and a speed choice must never change
an answer (tformer.model.quantized); here it is only prepared (the kernel's operands packed). The pass runs
before the model decodes, in the entry points that decode (generate, the serving batcher, the measured step, a
compiled step before it is traced). A forward only reads what was set: no environment variable, no saved table,
no first-call micro-benchmark inside it, so a decode step costs the same from the first call, and a compiled
graph sees constants.

The float choice covers every row count at once (a Linear's ``split_rows``), so the pass needs no rows.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

from tformer.model.linear import Linear, split_rows_for
from tformer.model.quantized import QuantizedLinear


def choose_paths(model: nn.Module) -> None:
    """Set every float Linear's path in ``model`` at the current thread count, and prepare every quantized Linear's
    own path."""
    threads = torch.get_num_threads()
    split: dict[tuple[int, int], frozenset[int] | range] = {}  # (n, k) -> row counts: one lookup per shape
    # Outside any active dispatch mode: a FlopCounterMode or a profiler around the caller must not count the
    # timings' own products as the model's.
    with torch.no_grad(), _disable_current_modes():
        for module in model.modules():
            if isinstance(module, QuantizedLinear):
                module.prepare()
            elif isinstance(module, Linear):
                w = module.weight
                if w.device.type != "cpu" or w.dtype != torch.float32 or not w.is_contiguous():
                    module.split_rows, module.split_threads = frozenset(), 0
                    continue
                shape = tuple(w.shape)
                if shape not in split:
                    split[shape] = split_rows_for(*shape, threads)
                module.split_rows, module.split_threads = split[shape], threads
        # Then the Linears that read one input and can be one product (q, k, v; gate, up): on their chosen paths.
        for module in model.modules():
            if hasattr(module, "stack_products"):
                module.stack_products()


__all__ = ["choose_paths"]
