"""Row-exact attention: the exact kinds' softmax(Q K^T * scale + bias) V, each query computed on its own, in key
order, by the C routine beside the block kernel (tformer/model/csrc/attend_rows.h states the arithmetic).

A model on the block kernel rounds its activations to 8 bits, so an fp32 ulp of difference before a Linear can
cross a rounding step and change a near-tie token. The Linears compute every row the same whatever its batch; a
fused attention does not (torch's flash path and GEMMs sum in an order set by the number of queries, the padded
columns of a serving pool and the prompt chunk), so the same prompt came out a token apart in `tformer generate`
and `tformer serve`. Here a query's output depends only on its own vector and the keys and values it may see:
generate's prefill, the pool's padded chunks, the prefix cache and a decode step give the same numbers for the
same position. use_path(model, "blocks") turns it on for a model's exact-attention layers (MultiHeadAttention
.row_exact); it runs only where no gradient is wanted, and the ledger counts the same FLOPs as for sdpa.

    out, _ = row_exact(q, k, v, mask, scale)   # q (B, H, Tq, D); k, v (B, H_kv, Tk, D) -> (B, H, Tq, D)
"""

from __future__ import annotations

import torch

from tformer.model import ggml_kernel
from tformer.model.masks import AttentionMask


def row_exact(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, scale: float,
              dropout_p: float = 0.0):
    """The registry's signature (no dropout: inference only). Reads the mask as the C routine takes it: plain
    causal as a key limit per query (no tensor built), anything else as its additive bias (-inf = hidden)."""
    if dropout_p:
        raise ValueError("row-exact attention runs inference only (dropout_p must be 0)")
    B, H, Tq, _ = q.shape
    if mask.is_causal:
        bias, causal = None, k.shape[-2] - Tq
    else:
        bias, causal = mask.bias, -1
        if bias is not None:
            bias = bias.to(torch.float32).expand(B, H, Tq, k.shape[-2])
    out = ggml_kernel.attend(q, k, v, bias, causal, scale)
    if mask.dead_rows is not None:
        out = out.masked_fill(mask.dead_rows, 0.0)
    return out, None


__all__ = ["row_exact"]
