"""Linears that read the same input, run as one product on the block kernel: attention's q, k and v, a gated
MLP's gate and up.

Why: a block-kernel product costs a fixed amount beside the bytes it reads (waking the kernel's threads, rounding
the activations to 8 bits, the Python around the call): on SmolLM2's Q4_1 shapes on a 2-core EPYC, q, k and v as
three products took 25 us and as one product of their 960 stacked rows 15 us; gate and up 29 us less as one.
Over 30 layers that is about 1.5 ms of a 17 ms eager decode step, and 90 of a compiled graph's 211 kernel calls.

What it computes: the kernel works out every output (row m, weight row n) with the same instructions whatever
weight rows sit beside n, so each Linear's slice of the stacked product is bit for bit what it computes alone
(tests/model/test_stacked_products.py holds them equal). The stacked operand is prepared with the paths
(choose_paths) and used only while it still stands for the Linears the module holds: the same objects, each on
the blocks path, their stored tensors unchanged; otherwise each Linear runs alone, as before.

    stack = stack_linears([q_proj, k_proj, v_proj])        # None where they cannot be one product
    q, k, v = run_linears(x, [q_proj, k_proj, v_proj], stack)
"""

from __future__ import annotations

import torch
from torch import nn

from tformer.model import ggml_kernel
from tformer.model.quantized import QuantizedLinear


class StackedBlocks:
    """The repacked blocks of several block-kernel Linears one below another: (sum of out rows, row bytes)."""

    def __init__(self, linears: list[QuantizedLinear]):
        self.linears = tuple(linears)
        self.fmt = ggml_kernel.FORMATS[linears[0].ggml_type]
        self.in_features = linears[0].in_features
        self.sizes = [m.out_features for m in linears]
        self.blocks = torch.cat([m.kernel_blocks() for m in linears])
        biases = [m.bias for m in linears]
        self.bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
        self.key = self._key()

    def _key(self) -> tuple:
        return tuple(m._stored_key() for m in self.linears) + tuple(
            None if m.bias is None else (m.bias.data_ptr(), m.bias._version) for m in self.linears)

    def stands_for(self, linears) -> bool:
        """Whether this operand is still those Linears' product: the same modules, on the blocks path, unchanged."""
        return (all(a is b and a.path == "blocks" for a, b in zip(linears, self.linears))
                and (torch.compiler.is_compiling() or self._key() == self.key))

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x (..., in) -> each Linear's output (..., out_i): slices of one (rows, sum out) product."""
        rows = x.reshape(-1, self.in_features)
        y = ggml_kernel.product(rows if rows.dtype == torch.float32 else rows.float(), self.blocks, self.fmt)
        if self.bias is not None:
            y += self.bias
        if x.dtype != torch.float32:
            y = y.to(x.dtype)
        return [part.view(*x.shape[:-1], part.shape[-1]) for part in y.split(self.sizes, dim=-1)]


def stack_linears(linears: list[nn.Module], current: StackedBlocks | None = None) -> StackedBlocks | None:
    """One stacked operand for ``linears`` when they can be one product: each a GGUF-block Linear on the blocks path
    (tformer.model.quantized), of one format the kernel repacks, one input width, all with a bias or none, on the
    CPU. ``current``, the module's stack so far, is kept while it still stands for them (every generate() chooses
    the paths again: rebuilding meant repacking and copying most of the weights each call, ~100 ms on SmolLM2)."""
    if current is not None and current.stands_for(linears):
        return current
    first = linears[0]
    if not all(isinstance(m, QuantizedLinear) and m.path == "blocks" for m in linears):
        return None
    # Only the formats the kernel repacks: their Linears keep a repacked copy, which the stack replaces (each then
    # holds its rows of the stack: one copy). A K-quant runs on its stored bytes, which a stack would copy.
    if first.ggml_type not in ggml_kernel.PACKED:
        return None
    if any(m.ggml_type != first.ggml_type or m.in_features != first.in_features
           or (m.bias is None) != (first.bias is None) for m in linears):
        return None
    if any(b.device.type != "cpu" for m in linears for b in m.buffers(recurse=False)):
        return None
    stack = StackedBlocks(linears)
    for m, rows in zip(linears, stack.blocks.split(stack.sizes)):
        m.share_repacked(rows)
    return stack


def run_linears(x: torch.Tensor, linears, stack: StackedBlocks | None) -> list[torch.Tensor]:
    """Each of ``linears`` applied to ``x``: as one stacked product where ``stack`` still stands for them."""
    if stack is not None and stack.stands_for(linears):
        return stack(x)
    return [m(x) for m in linears]


__all__ = ["StackedBlocks", "run_linears", "stack_linears"]
