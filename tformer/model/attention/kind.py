"""The base every attention kind's module shares, and the wrapper that makes a function one."""

from __future__ import annotations

import torch
from torch import nn

from tformer.core.attention_kinds import AttnOptions


class AttentionKind(nn.Module):
    """One layer's attention kind: ``forward(q, k, v, mask, scale, dropout_p) -> (out, weights | None)``,
    shapes as in tformer.model.attention.registry.

    A kind whose causal form can decode from a fixed-size summary of the past instead of every cached
    key (linear attention, Performer) also defines ``step(q, k, v, state, mask, scale) -> (out, state)`` (state None at the first call);
    the multi-head layer then keeps that state in the cache (KVCache.get_state / set_state) in place
    of keys and values.
    """

    def __init__(self, options: AttnOptions, n_heads: int, head_dim: int):
        super().__init__()
        self.options, self.n_heads, self.head_dim = options, n_heads, head_dim

    def forward(self, q, k, v, mask, scale: float, dropout_p: float = 0.0):
        raise NotImplementedError(f"{type(self).__name__} must define forward")


class FunctionKind(nn.Module):
    """A stateless kind's function as a module: it owns no parameters or buffers, so it adds nothing
    to the state dict."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask, scale: float, dropout_p: float = 0.0):
        return self.fn(q, k, v, mask, scale, dropout_p)

    def extra_repr(self) -> str:
        return self.fn.__name__
