"""Multi-head attention with a KV cache; the attention kind itself comes from the registry.

Layouts: q (B, H, Tq, D), k and v (B, H_kv, Tk, D); H_kv divides H (MHA: equal, GQA: fewer,
MQA: one). Each key/value head serves H / H_kv consecutive query heads.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

from tformer.core.attention_kinds import ATTN_KINDS
from tformer.core.errors import TformerError
from tformer.model.attention.reference import reference
from tformer.model.attention.registry import make_attention
from tformer.model.attention.row_exact import row_exact
from tformer.model.linear import Linear
from tformer.model.masks import AttentionMask
from tformer.model.norm import make_norm
from tformer.model.position import apply_rope
from tformer.model.stacked_products import run_linears, stack_linears


class MultiHeadAttention(nn.Module):
    """Project to heads, attend, concatenate heads, project back (Vaswani et al. 2017, section 3.2.2).

    Self-attention reads keys and values from x; cross-attention from the encoder output
    (``memory``), whose projections are computed once and kept in the cache during decoding.
    """

    def __init__(self, config, layer_idx: int, cross: bool = False, spec=None):
        """spec: the attention in the architecture description (tformer.cost.architecture.Attention), whose
        projections may be quantized; None: float projections sized from the config."""
        super().__init__()
        d, self.n_heads, self.n_kv_heads, self.head_dim = config.d_model, config.n_heads, config.n_kv_heads, config.head_dim
        self.layer_idx, self.cross = layer_idx, cross
        if spec is not None:
            self.q_proj, self.k_proj, self.v_proj, self.o_proj = map(Linear.described, spec.linears())
        else:
            qkv_bias = config.qkv_has_bias
            self.q_proj = Linear(d, self.n_heads * self.head_dim, bias=qkv_bias)
            self.k_proj = Linear(d, self.n_kv_heads * self.head_dim, bias=qkv_bias)
            self.v_proj = Linear(d, self.n_kv_heads * self.head_dim, bias=qkv_bias)
            self.o_proj = Linear(self.n_heads * self.head_dim, d, bias=config.bias)
        # Per-head norms of q and k (Gemma 3): over head_dim, one weight shared by every head.
        self.q_norm = make_norm(config, spec.q_norm.d) if spec is not None and spec.q_norm else None
        self.k_norm = make_norm(config, spec.k_norm.d) if spec is not None and spec.k_norm else None
        self.scale = 1.0 / math.sqrt(config.attn_scale_dim or self.head_dim) if config.scale_attention else 1.0
        self.dropout_p = config.attention_dropout
        # Built once: switching kind builds a new model from a new config (tformer.model.with_attention).
        # Sparse and approximate kinds shape self-attention; cross-attention reads a whole source, exactly.
        options = config.attention_options(layer_idx)
        if cross and ATTN_KINDS[options.kind].family != "exact":
            options = dataclasses.replace(options, kind="sdpa")
        self.attend = make_attention(options, self.n_heads, self.head_dim)
        self.kind, self.exact = options.kind, ATTN_KINDS[options.kind].family == "exact"
        # Row-exact attention (tformer.model.attention.row_exact) computes what the exact kinds compute, and a
        # sliding window read as its band; use_path(model, "blocks") turns it on beside the block kernel.
        self.row_exact_possible = self.exact or hasattr(self.attend, "dense_mask")
        self.row_exact = False
        self._stacked = None  # q, k, v as one block-kernel product: stack_products()

    def stack_products(self) -> None:
        """Prepare q, k and v's one product where they can be one (the paths' choice: choose_paths)."""
        self._stacked = None if self.cross else stack_linears([self.q_proj, self.k_proj, self.v_proj], self._stacked)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.head_dim).transpose(1, 2)  # (B, n, T, head_dim)

    def forward(self, x, mask: AttentionMask, memory=None, rope=None, cache=None, need_weights: bool = False):
        """x: (B, T, d_model) -> ((B, T, d_model), weights (B, H, T, Tk) or None). mask: the AttentionMask of these
        queries over the keys the cache hands back (the cache built it: tformer.model.cache)."""
        if need_weights and not self.exact and hasattr(self.attend, "dense_mask"):
            mask = self.attend.dense_mask(mask)  # a sliding window: the same attention, its band as a dense mask
        elif need_weights and not self.exact:
            # The weights come from the reference kind, which would also compute the output: dense attention
            # where this layer runs another formula. Refuse rather than return another model's output.
            raise TformerError(f"attention weights come only from exact kinds; this layer runs '{self.kind}', "
                               "which never forms softmax(Q K^T) over all keys (build it with attn_impl='sdpa' to see maps)")
        if self.cross:
            q = self.q_proj(x)
        else:  # q, k and v read x: one product where they can be (tformer.model.stacked_products)
            q, k, v = run_linears(x, (self.q_proj, self.k_proj, self.v_proj), self._stacked)
        q = self._heads(q, self.n_heads)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if self.cross and cache is not None and cache.has_cross(self.layer_idx):
            k, v = cache.get_cross(self.layer_idx)
        else:
            if self.cross:
                k, v = self.k_proj(memory), self.v_proj(memory)
            k, v = self._heads(k, self.n_kv_heads), self._heads(v, self.n_kv_heads)
            if self.k_norm is not None:
                k = self.k_norm(k)
            if rope is not None:
                cos, sin = rope
                q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            recurrent = getattr(self.attend, "step", None) if not self.cross else None
            if cache is not None and recurrent is not None and not need_weights:
                # A kind that summarises the past in a fixed-size state keeps that state, not the keys.
                out, state = recurrent(q, k, v, cache.get_state(self.layer_idx), mask, self.scale)
                cache.set_state(self.layer_idx, state, k.shape[2])
                return self._merge(out), None
            if cache is not None:
                if self.cross:
                    cache.set_cross(self.layer_idx, k, v)
                else:
                    k, v = cache.update(self.layer_idx, k, v)  # what this layer attends to, under ``mask``

        dropout_p = self.dropout_p if self.training else 0.0
        attend = self.attend
        if need_weights:
            attend = reference  # only the reference kind keeps the weights
        elif self.row_exact and not self.training and not q.requires_grad and q.dtype == torch.float32 \
                and q.device.type == "cpu":
            attend = row_exact
            if not self.exact:
                mask = self.attend.dense_mask(mask)  # the window as a band over the keys
        out, weights = attend(q, k, v, mask, self.scale, dropout_p)
        return self._merge(out), (weights if need_weights else None)

    def _merge(self, out: torch.Tensor) -> torch.Tensor:
        """(B, H, T, head_dim) -> concatenate heads -> output projection -> (B, T, d_model)."""
        B, _, T, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))
