"""One decode step over a static KV cache, written with fixed shapes so ``torch.compile`` can trace it
once and replay it for every token.

The eager step (``Runner.step``) attends over the ``t`` keys read so far, so every shape grows by one
each token and the mask is rebuilt from Python numbers. Here every tensor has the shape of the whole
preallocated cache instead:

    k, v buffers  (N, H_kv, L, D)   L = the cache's length, fixed for the whole generation
    slot          ()                the column this step writes (the number of tokens read so far)
    positions     (N,)              each row's position id (left-padded rows count only real tokens)
    keep          (N, L) bool       False at padding columns; columns after ``slot`` are hidden here

The new key and value go into column ``slot`` with ``index_copy_`` (in place, no reallocation); the
query attends to all L columns under an additive bias that is -inf past ``slot``, at padding, and
outside a sliding window. Reading L columns where t are live costs (L - t) wasted keys per step; the
cache length is rounded up to a few sizes so one compiled graph serves many generations.

The step reuses the model's own modules (embedding, norms, projections, feed-forward, head) and
differs from the eager path only in how keys are stored and masked: outputs agree to float rounding
(the sums run over masked columns too, which add exact zeros), and greedy tokens agree exactly.
"""

from __future__ import annotations

import torch

from tformer.core.attention_kinds import ATTN_KINDS
from tformer.core.errors import TformerError
from tformer.model.attention.sliding import in_window
from tformer.model.position import apply_rope, rope_cos_sin


def check_static_step(config) -> None:
    """Raise one line naming why ``config`` cannot decode through the static step, if it cannot."""
    if not config.traits.decoder:
        raise TformerError(f"--compile speeds up decoding, and this {config.traits.label} model does not generate; "
                           "drop --compile")
    if config.traits.recurrent:
        raise TformerError("the compiled decode step walks attention blocks over a KV cache, and this recurrent model "
                           "has none (its step is one cell update); drop --compile")
    kind = config.attn_impl
    if ATTN_KINDS[kind].family != "exact" and kind != "sliding":
        raise TformerError(f"the compiled decode step runs exact or sliding-window attention; this model runs '{kind}'. "
                           "Drop --compile, or build it with attn_impl='sdpa'")
    if config.rope_scaling == "dynamic":
        raise TformerError("dynamic NTK RoPE scaling changes its base with every length, which a compiled step "
                           "cannot hold fixed; drop --compile, or use rope_scaling 'linear', 'ntk' or 'yarn'")


def _windows(config) -> list[tuple[int, int] | None]:
    """Per layer: (window, dilation) for a sliding-window layer, else None."""
    if config.attn_impl != "sliding":
        return [None] * config.n_layers
    return [(config.attention_options(i).window, config.attention_options(i).dilation) for i in range(config.n_layers)]


def self_attention_bias(keep: torch.Tensor, slot: torch.Tensor, window: tuple[int, int] | None,
                        dtype: torch.dtype) -> torch.Tensor:
    """(N, 1, 1, L) additive bias of the one query at column ``slot``: 0 where it may attend, -inf at
    padding, past ``slot`` (stale columns of an earlier generation), and outside its window."""
    cols = torch.arange(keep.shape[1], device=keep.device)
    allowed = keep & (cols <= slot)
    if window is not None:
        allowed = allowed & in_window(slot - cols, window[0], window[1], causal=True)
    zero = torch.zeros((), dtype=dtype, device=keep.device)
    return torch.where(allowed, zero, float("-inf"))[:, None, None, :]


def _attend(attn, x, kv, slot, bias, rope=None, write=True):
    """One query per row through ``attn``'s projections: x (N, 1, d_model) -> (N, 1, d_model).
    kv: the layer's (k, v) buffers (N, H_kv, L, D); ``write`` puts this token's k, v at ``slot``
    (self-attention); cross-attention reads the encoder's projected k, v as they are."""
    q = attn._heads(attn.q_proj(x), attn.n_heads)  # (N, H, 1, D)
    k_all, v_all = kv
    if write:
        k = attn._heads(attn.k_proj(x), attn.n_kv_heads)
        v = attn._heads(attn.v_proj(x), attn.n_kv_heads)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        index = slot.reshape(1)
        k_all.index_copy_(2, index, k)
        v_all.index_copy_(2, index, v)
    # Written out rather than a fused kernel: for one query the products are two small matrix-vector
    # products the compiler fuses with the softmax. Query heads are grouped under their key/value head
    # (G = H / H_kv per group), so grouped-query attention reads the cache without copying it per head.
    N, H_kv, L, D = k_all.shape
    G = attn.n_heads // H_kv
    q = q.reshape(N, H_kv, G, D)
    if bias.shape[1] > 1:  # a per-head position bias (N|1, H, 1, L): heads grouped the same way
        bias = bias.reshape(bias.shape[0], H_kv, G, L)
    scores = torch.matmul(q, k_all.transpose(-1, -2)) * attn.scale + bias.to(q.dtype)  # (N, H_kv, G, L)
    out = torch.matmul(scores.softmax(dim=-1), v_all)  # (N, H_kv, G, D)
    return attn._merge(out.reshape(N, attn.n_heads, 1, D))


def _block_step(block, h, kv, slot, bias, rope, cross_kv, cross_bias):
    """One Block (its residuals and norms, pre or post) on the one new token h (N, 1, d_model)."""
    h, _ = block._residual(h, block.attn_norm, lambda x: (_attend(block.attn, x, kv, slot, bias, rope), None))
    if block.cross_attn is not None:
        h, _ = block._residual(h, block.cross_attn_norm,
                               lambda x: (_attend(block.cross_attn, x, cross_kv, slot, cross_bias, write=False), None))
    h, _ = block._residual(h, block.mlp_norm, lambda x: (block.mlp(x), None))
    return h


def static_step(model, stack, tokens, slot, positions, keep, self_kv, cross_kv=None, cross_bias=None):
    """Logits (N, V) for the next position after reading ``tokens`` (N,) at column ``slot``.

    stack: the model's decoding Stack; self_kv: per layer (k, v) buffers (N, H_kv, L, D), written in
    place; cross_kv: per layer the encoder's (k, v) (N, H_kv, S, D) and cross_bias (N, 1, 1, S) for an
    encoder-decoder model, else None.
    """
    pos = positions[:, None]  # (N, 1)
    h = stack.enter(model.embed(tokens[:, None]), pos)
    rope = rope_cos_sin(pos, *stack.rope[:2], h.dtype, stack.rope[2]) if stack.rope else None
    biases, position_bias = {}, None
    if stack.score_bias is not None:  # ALiBi, T5 buckets: (1, H, 1, L) from column distances
        position_bias = stack.score_bias(slot.reshape(1), torch.arange(keep.shape[1], device=keep.device))
    blocks = [stack.layers[j] for j in stack.order]  # by depth: a shared layer runs at every depth it holds
    for i, (block, window) in enumerate(zip(blocks, _windows(model.config))):
        if window not in biases:
            bias = self_attention_bias(keep, slot, window, h.dtype)
            biases[window] = bias if position_bias is None else bias + position_bias.to(h.dtype)
        h = _block_step(block, h, self_kv[i], slot, biases[window], rope,
                        cross_kv[i] if cross_kv is not None else None, cross_bias)
    if stack.final_norm is not None:
        h = stack.final_norm(h)
    return model.lm_logits(h)[:, -1]


__all__ = ["check_static_step", "self_attention_bias", "static_step"]
