"""Every attention kind by name: the names ``ModelConfig.attn_impl`` accepts (core.config.ATTN_IMPLS).

Each kind is one function with one signature,
    fn(q, k, v, mask: AttentionMask, scale: float, dropout_p: float) -> (out, weights or None)
    q (B, H, Tq, D); k, v (B, H_kv, Tk, D), H_kv dividing H; out (B, H, Tq, D); weights (B, H, Tq, Tk).
Adding a kind: one module here, one entry below, its name in core.config.ATTN_IMPLS, one ledger row,
one test against ``reference``.
"""

from __future__ import annotations

from typing import Callable

import torch

from tformer.core.errors import TformerError
from tformer.model.attention.reference import reference
from tformer.model.attention.sdpa import sdpa

AttentionFn = Callable[..., tuple[torch.Tensor, "torch.Tensor | None"]]  # (q, k, v, mask, scale, dropout_p)

ATTENTION: dict[str, AttentionFn] = {
    "sdpa": sdpa,
    "reference": reference,
}


def attention_fn(name: str) -> AttentionFn:
    """The function for attention kind ``name``; an unknown name is a one-line TformerError listing the known ones."""
    try:
        return ATTENTION[name]
    except (KeyError, TypeError):
        raise TformerError(f"attention kind '{name}' is unknown; choose one of: {', '.join(ATTENTION)}") from None
