"""Attention rollout (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers"), written out.

One layer's attention says how much each token reads from each other token *at that layer*; a token's
state also flows on unchanged through the residual connection. Rollout folds that in and follows the
mixing through the stack:

    Â_l = rownorm(mean_heads(A_l) + I)          (the identity: the residual path)
    R   = Â_L · Â_(L-1) · ... · Â_1             (token i at the top <- token j at the input)

Row 0 of R (the [CLS] token, the one a ViT classifies from) over columns 1..n-1 (the patches), laid out
on the patch grid, is the picture: which patches the class decision was mixed from.

Shapes: each layer's weights (B, H, n, n) as ``ViTModel(..., output_attentions=True)`` returns them with
``attn_impl="reference"``; the rollout (B, n, n); the [CLS] map (B, rows, cols).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from tformer.core.errors import TformerError


def _layer_shape(attentions: Sequence[torch.Tensor]) -> tuple[int, int]:
    if not attentions:
        raise TformerError("attention rollout needs at least one layer's weights; run the model with "
                           "output_attentions=True and attn_impl='reference'")
    missing = [i + 1 for i, a in enumerate(attentions) if a is None]
    if missing:
        raise TformerError(f"layer {missing[0]} returned no attention weights; build the model with "
                           "attn_impl='reference' (the fused kinds never form the weights)")
    shape = tuple(attentions[0].shape)
    for i, a in enumerate(attentions):
        if a.dim() != 4 or a.shape[-1] != a.shape[-2] or tuple(a.shape) != shape:
            raise TformerError(f"layer {i + 1}'s weights are {tuple(a.shape)}; rollout needs (B, H, n, n) with "
                               f"the same shape in every layer (layer 1: {shape})")
    return shape[0], shape[-1]


def rollout(attentions: Sequence[torch.Tensor], residual: bool = True) -> torch.Tensor:
    """(B, n, n) in float64: row i = how much of token i's top-layer state came from each input token;
    every row sums to 1. ``residual=False`` multiplies the raw head-averaged maps (no identity added)."""
    batch, n = _layer_shape(attentions)
    eye = torch.eye(n, dtype=torch.float64, device=attentions[0].device)
    out = eye.expand(batch, n, n)
    for a in attentions:  # bottom layer first: R_l = Â_l R_(l-1)
        mixed = a.detach().to(torch.float64).mean(dim=1)
        if residual:
            mixed = mixed + eye
        mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        out = mixed @ out
    return out


def cls_map(attentions: Sequence[torch.Tensor], grid: tuple[int, int] | None = None,
            residual: bool = True) -> torch.Tensor:
    """The [CLS] row of the rollout over the patches, (B, rows, cols), patches in row-major order (the order
    the patch embedding flattens them). ``grid`` defaults to a square of n - 1 patches."""
    r = rollout(attentions, residual)
    patches = r.shape[-1] - 1
    if grid is None:
        side = math.isqrt(patches)
        if side * side != patches:
            raise TformerError(f"{patches} patches do not form a square grid; pass grid=(rows, cols)")
        grid = (side, side)
    rows, cols = grid
    if rows * cols != patches:
        raise TformerError(f"grid {rows}x{cols} holds {rows * cols} patches but the weights cover {patches} "
                           "(n - 1, after [CLS]); give the image's rows and columns of patches")
    return r[:, 0, 1:].reshape(-1, rows, cols)


__all__ = ["cls_map", "rollout"]
