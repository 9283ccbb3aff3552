"""Grouped-query attention: key/value heads shared by groups of query heads."""

from __future__ import annotations

import torch


def expand_kv(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Repeat each key/value head for the query heads of its group: (B, H_kv, T, D) -> (B, H, T, D).

    Head j of H_kv serves query heads j·g .. (j+1)·g - 1, g = H / H_kv (the layout of Llama and HF).
    """
    groups = n_heads // x.shape[1]
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)
