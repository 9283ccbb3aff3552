"""nn.Linear, with a faster CPU path for the few-row products of decoding.

Decoding one token multiplies a handful of rows by every weight matrix: a matrix-vector product
(GEMV) whose time is the time to stream the weight from memory. On CPU, PyTorch hands it to the
BLAS, which on the 2-core EPYC this project is developed on runs it on one thread and reads the
weight at about half the memory bandwidth both cores reach together (about 9 vs 18 GB/s).

The fast path cuts the weight's output rows into one slice per thread and runs the slices as
one batched product (``bmm`` parallelises over the batch), so every core streams its own share.
It is a view, never a copy: ``W (out, in)`` read as ``(parts, out/parts, in)``. Measured here on
GPT-2's 12 layers of weights (340 MB, fp32): 1 row 37 -> 24 ms, 4 rows 84 -> 32 ms, 32 rows
103 -> 76 ms. For many rows (prefill, training) the BLAS's own GEMM is faster, and under
autograd the plain path keeps the backward as PyTorch writes it; both stay on ``F.linear``.

``F.linear`` is the teaching path and the reference; ``split_rows_linear`` computes the same
sums in another order, so results agree to float rounding (~1e-6 relative), not bit for bit.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

# At most this many rows (tokens x batch) take the split path. Measured: the split beats the
# BLAS from 1 row to 512 on the machine above, by 1.5-2.7x up to 32 rows and 1.2x beyond; 32
# keeps the path to decoding, where the difference is large.
MAX_ROWS = 32
# The weight's output dimension must give every slice at least this many rows to be worth it.
MIN_ROWS_PER_PART = 128
# Where the split does not pay (measured one row at a time, weights streamed from memory): a weight
# under 512 KiB (256 x 256: 0.91x, the bmm's fixed cost exceeds the read) and rows of 2048 inputs
# or more, which the BLAS GEMV already streams at full speed (768 x 3072: 0.98x; 1024 x 256: 1.94x,
# 3072 x 768: 1.60x, 768 x 768: 1.28x).
MIN_WEIGHT_ELEMENTS = 128 * 1024
MAX_IN_FEATURES = 2047
enabled = True  # False: every call takes the plain F.linear path (to compare the two)


def split_parts(device: torch.device, dtype: torch.dtype) -> int:
    """Slices to cut a weight into: one per intra-op thread on CPU fp32; 1 (no split) elsewhere."""
    if not enabled or device.type != "cpu" or dtype != torch.float32:
        return 1
    return torch.get_num_threads()


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


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear, through the split path when it pays: the call every Linear makes (and bench times)."""
    out_features, in_features = weight.shape
    if x.numel() <= MAX_ROWS * in_features and not (torch.is_grad_enabled() and
                                                    (x.requires_grad or weight.requires_grad)):
        parts = split_parts(x.device, x.dtype)
        if parts > 1 and out_features >= parts * MIN_ROWS_PER_PART and in_features <= MAX_IN_FEATURES \
                and out_features * in_features >= MIN_WEIGHT_ELEMENTS and weight.dtype == x.dtype \
                and weight.is_contiguous():
            return split_rows_linear(x, weight, bias, parts)
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """nn.Linear (same parameters, same state-dict keys) that takes the split path when it pays."""

    @classmethod
    def described(cls, spec) -> "Linear":
        """The Linear an architecture description (tformer.cost.architecture.Linear) names."""
        return cls(spec.d_in, spec.d_out, bias=spec.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias)
