"""The split-rows form of a few-row product: y = x @ W.T + b with W's output rows cut into one slice per
thread and the slices run as one batched product (``bmm`` parallelises over the batch).

Why: a product of a handful of rows with a weight (decoding one token) is a matrix-vector product whose
time is the time to stream W from memory. Some BLAS libraries run it on one thread, which on some CPUs
reads memory at a fraction of the bandwidth all cores reach together; cutting W's rows gives every
core its own share to stream. Other BLAS libraries already stream a GEMV at full speed, and there the
extra batched call only costs time. Which holds is measured per machine (tformer.model.linear decides).

It is a view, never a copy: ``W (out, in)`` read as ``(parts, out/parts, in)``. The same sums in another
order: results agree with F.linear to float rounding (~1e-6 relative), not bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def split_rows_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, parts: int) -> torch.Tensor:
    """x (..., in) @ weight(out, in).T + bias, the output rows cut into ``parts`` slices run as one bmm."""
    out_features, in_features = weight.shape
    lead = x.shape[:-1]
    rows = x.reshape(-1, in_features).t()  # (in, M): every slice multiplies the same columns
    m = rows.shape[1]
    main = out_features - out_features % parts  # rows an even split covers; the rest go through F.linear
    w = weight[:main].view(parts, main // parts, in_features)
    cols = rows.expand(parts, in_features, m)
    if bias is None:
        y = torch.bmm(w, cols)
    else:
        y = torch.baddbmm(bias[:main].view(parts, main // parts, 1), w, cols)
    y = y.view(main, m).t()  # (M, main)
    if main < out_features:
        rest = F.linear(x.reshape(m, in_features), weight[main:], None if bias is None else bias[main:])
        y = torch.cat([y, rest], dim=1)
    return y.contiguous().view(*lead, out_features)


# The same function as one opaque op inside a compiled graph, so a compiled decode step streams its weights as the
# eager one does, with the eager one's numbers (SmolLM2 fp32 from its GGUF file, one row, 2-core EPYC: compiled
# 66.7 tok/s with it, 35.5 on F.linear, eager 48).
_LIBRARY = torch.library.Library("tformer", "FRAGMENT")
_LIBRARY.define("split_rows_linear(Tensor x, Tensor weight, Tensor? bias, int parts) -> Tensor")
_LIBRARY.impl("split_rows_linear", split_rows_linear, "CPU")


@torch.library.register_fake("tformer::split_rows_linear")
def _(x, weight, bias, parts: int):
    return x.new_empty(*x.shape[:-1], weight.shape[0])


split_rows_op = torch.ops.tformer.split_rows_linear.default

__all__ = ["split_rows_linear", "split_rows_op"]
