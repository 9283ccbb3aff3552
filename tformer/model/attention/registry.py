"""Every attention kind by name: the names ``ModelConfig.attn_impl`` accepts (core.attention_kinds.ATTN_KINDS).

Each kind is either a function or an ``AttentionKind`` module class, called with one signature,
    kind(q, k, v, mask: AttentionMask, scale: float, dropout_p: float) -> (out, weights or None)
    q (B, H, Tq, D); k, v (B, H_kv, Tk, D), H_kv dividing H; out (B, H, Tq, D); weights (B, H, Tq, Tk).
A function is stateless; a module class is built per layer, ``Kind(options, n_heads, head_dim)``,
for kinds that hold learned projections (Linformer) or fixed random draws (Performer, BigBird, LSH).
Adding a kind: one module here, one entry below, its row in core.attention_kinds.ATTN_KINDS, one
ledger row (cost.attention), one test against ``reference`` or the reference library.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from tformer.core.attention_kinds import AttnOptions
from tformer.core.errors import TformerError
from tformer.model.attention.chunked import Chunked
from tformer.model.attention.kernelized import LinearAttention
from tformer.model.attention.kind import AttentionKind, FunctionKind
from tformer.model.attention.linformer import Linformer
from tformer.model.attention.lsh import LSHAttention
from tformer.model.attention.performer import Performer
from tformer.model.attention.reference import reference
from tformer.model.attention.sdpa import sdpa
from tformer.model.attention.sliding import SlidingAttention
from tformer.model.attention.sparse_kinds import BigBird, Longformer, Strided
from tformer.model.attention.tiled import Tiled

AttentionFn = Callable[..., tuple[torch.Tensor, "torch.Tensor | None"]]  # (q, k, v, mask, scale, dropout_p)

ATTENTION: dict[str, AttentionFn | type[AttentionKind]] = {
    "sdpa": sdpa,
    "reference": reference,
    "tiled": Tiled,
    "chunked": Chunked,
    "sliding": SlidingAttention,
    "strided": Strided,
    "longformer": Longformer,
    "bigbird": BigBird,
    "linformer": Linformer,
    "linear": LinearAttention,
    "performer": Performer,
    "lsh": LSHAttention,
}


def attention_fn(name: str) -> AttentionFn | type[AttentionKind]:
    """The function (or module class) for attention kind ``name``; an unknown name is a one-line
    TformerError listing the known ones."""
    try:
        return ATTENTION[name]
    except (KeyError, TypeError):
        raise TformerError(f"attention kind '{name}' is unknown; choose one of: {', '.join(ATTENTION)}") from None


def make_attention(options: AttnOptions, n_heads: int, head_dim: int) -> nn.Module:
    """One layer's attention kind as a module (a stateless function is wrapped, holding nothing)."""
    entry = attention_fn(options.kind)
    if isinstance(entry, type):
        return entry(options, n_heads, head_dim)
    return FunctionKind(entry)
