"""Attention masks: which keys each query may attend to.

A mask is built once per forward pass and shared by every layer of a stack. Boolean masks say
True = may attend. They become one additive float bias (0 or -inf, plus any position bias),
which both attention paths consume. A query that may attend to no key at all (a padding query
in a left-padded causal batch, say) would get softmax over nothing = NaN; such "dead" rows attend
everywhere instead and their output is set to zero afterwards, so no NaN ever appears, even in
the backward pass.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class AttentionMask(NamedTuple):
    bias: torch.Tensor | None  # (B|1, H|1, Tq, Tk) additive, or None
    is_causal: bool  # no bias; plain causal over a square Tq == Tk (lets SDPA use its causal kernel)
    dead_rows: torch.Tensor | None  # (B|1, 1, Tq, 1) True where a query may attend nothing


NO_MASK = AttentionMask(None, False, None)


def causal_mask(tq: int, tk: int, device=None) -> torch.Tensor:
    """(tq, tk) bool. Queries are the last tq of tk positions: query i sits at tk - tq + i."""
    q_pos = torch.arange(tk - tq, tk, device=device)[:, None]
    k_pos = torch.arange(tk, device=device)[None, :]
    return k_pos <= q_pos


def padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, Tk) with 1 = real token, 0 = padding -> (B, 1, 1, Tk) bool."""
    return attention_mask.bool()[:, None, None, :]


def build_mask(
    tq: int,
    tk: int,
    *,
    causal: bool,
    key_padding: torch.Tensor | None = None,
    position_bias: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float32,
    device=None,
) -> AttentionMask:
    if key_padding is not None and key_padding.shape[-1] != tk:
        raise ValueError(f"attention mask covers {key_padding.shape[-1]} keys but there are {tk}")
    if key_padding is not None and bool(key_padding.all()):
        key_padding = None  # nothing padded: keep the fast paths open
    if position_bias is None and key_padding is None:
        if not causal or tq == 1:  # one new token may attend to every cached key
            return NO_MASK
        if tq == tk:
            return AttentionMask(None, True, None)

    allowed = None
    if causal:
        allowed = causal_mask(tq, tk, device)[None, None]
    if key_padding is not None:
        pad = padding_mask(key_padding)
        allowed = pad if allowed is None else allowed & pad

    bias = torch.zeros((1, 1, tq, tk), dtype=dtype, device=device)
    if position_bias is not None:
        bias = bias + position_bias.to(dtype)
    dead = None
    if allowed is not None:
        bias = bias.masked_fill(~allowed, float("-inf"))
        dead = ~allowed.any(dim=-1, keepdim=True)
        if bool(dead.any()):
            bias = bias.masked_fill(dead, 0.0)
        else:
            dead = None
    return AttentionMask(bias, False, dead)
