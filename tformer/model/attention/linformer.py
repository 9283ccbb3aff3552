"""Linformer (Wang et al. 2020): attention through a low-rank bottleneck along the sequence. Learned
E, F (k, n_max) mix the n keys and values into k rows each, so the scores are n x k, not n x n:

    K' = E[:, :n] K,   V' = F[:, :n] V,   out = softmax(Q K'^T · scale) V'

E and F are shared by every head of the layer (the paper's headwise sharing); each input length n
uses the first n columns. Every projected row mixes keys from the whole sequence, so Linformer is
bidirectional only (the config refuses it in a decoder). Padding keys and values are zeroed before
the projection, so they add nothing to K' or V'; a query whose keys are all padding then sees k zero
keys and zero values, and its output is 0.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tformer.core.attention_kinds import AttnOptions
from tformer.core.errors import TformerError
from tformer.model.attention.groups import expand_kv
from tformer.model.attention.kernelized import key_keep
from tformer.model.attention.kind import AttentionKind


class Linformer(AttentionKind):
    """E, F: (options.proj, options.max_positions) parameters, named ``E`` and ``F``."""

    def __init__(self, options: AttnOptions, n_heads: int, head_dim: int):
        super().__init__(options, n_heads, head_dim)
        self.E = nn.Parameter(torch.empty(options.proj, options.max_positions))
        self.F = nn.Parameter(torch.empty(options.proj, options.max_positions))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """As the paper's nn.Linear(n_max, k) starts: uniform within ±1/sqrt(n_max), so a full-length
        input's projected keys keep the keys' scale."""
        if self.E.is_meta:
            return
        bound = 1 / math.sqrt(self.options.max_positions)
        nn.init.uniform_(self.E, -bound, bound)
        nn.init.uniform_(self.F, -bound, bound)

    def forward(self, q, k, v, mask, scale: float, dropout_p: float = 0.0):
        """q (B, H, Tq, D); k, v (B, H_kv, n, D) -> (out (B, H, Tq, D), None)."""
        n = k.shape[-2]
        if mask.causal:
            raise TformerError("linformer mixes every key into each projected row, so it cannot be causal; "
                               "use it in an encoder")
        if n > self.options.max_positions:
            raise TformerError(f"linformer projects at most max_positions={self.options.max_positions} keys, got {n}; "
                               "shorten the input or build the model with a larger max_positions")
        keep = key_keep(mask, n)
        if keep is not None:
            k, v = k.masked_fill(~keep, 0.0), v.masked_fill(~keep, 0.0)
        # (k, n) @ (B, H_kv, n, D): projected before the heads are expanded (GQA shares them).
        k_proj = self.E[:, :n].to(k.dtype) @ k
        v_proj = self.F[:, :n].to(v.dtype) @ v
        H = q.shape[1]
        k_proj, v_proj = expand_kv(k_proj, H), expand_kv(v_proj, H)
        weights = torch.softmax((q @ k_proj.transpose(-2, -1)) * scale, dim=-1)  # (B, H, Tq, k)
        if dropout_p > 0.0:
            weights = nn.functional.dropout(weights, p=dropout_p)
        return weights @ v_proj, None

    def extra_repr(self) -> str:
        return f"proj={self.options.proj}, max_positions={self.options.max_positions}"
