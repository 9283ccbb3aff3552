"""The Transformer layer and the stack of layers that encoders and decoders are made of."""

from __future__ import annotations

import torch
from torch import nn

from tformer.core.errors import TformerError
from tformer.model.attention import MultiHeadAttention
from tformer.model.feedforward import FeedForward
from tformer.model.linear import Linear
from tformer.model.masks import AttentionMask, build_mask
from tformer.model.norm import make_norm
from tformer.model.vision import PatchEmbed
from tformer.model.position import (
    NO_SCALING, ALiBi, LearnedPositions, RelativePositionBias, RopeScaling, SinusoidalPositions, rope_cos_sin,
)


class Block(nn.Module):
    """Self-attention, optional cross-attention, feed-forward; each wrapped in a residual and a norm.

    post-norm (the 2017 paper, BERT, BART):  x = norm(x + sublayer(x))
    pre-norm  (GPT-2, LLaMA, T5):            x = x + sublayer(norm(x))
    sandwich  (Gemma 2 and 3):               x = x + post_norm(sublayer(norm(x)))
    """

    def __init__(self, config, spec):
        """spec: one layer of the architecture description (tformer.cost.architecture.Layer)."""
        super().__init__()
        layer_idx, cross = spec.index, len(spec.attention) > 1
        self.pre_norm = config.norm_placement in ("pre", "sandwich")
        attention = spec.attention[0]
        self.attn_norm = make_norm(config)
        self.attn = MultiHeadAttention(config, layer_idx, spec=attention)
        # Registered after the sublayer it follows, as the description lists it (tformer.cost.description).
        self.attn_post_norm = make_norm(config) if attention.post_norm else None
        self.cross_attn_norm = make_norm(config) if cross else None
        self.cross_attn = MultiHeadAttention(config, layer_idx, cross=True, spec=spec.attention[1]) if cross else None
        self.mlp_norm = make_norm(config)
        self.mlp = FeedForward(config, spec.mlp)
        self.mlp_post_norm = make_norm(config) if spec.mlp.post_norm else None
        self.dropout = nn.Dropout(config.dropout)

    def _residual(self, x, norm, sublayer, post_norm=None):
        if self.pre_norm:
            out, weights = sublayer(norm(x))
            if post_norm is not None:
                out = post_norm(out)
            return x + self.dropout(out), weights
        out, weights = sublayer(x)
        return norm(x + self.dropout(out)), weights

    def forward(self, x, self_mask, rope=None, memory=None, cross_mask=None, cache=None, need_weights=False):
        x, self_w = self._residual(
            x, self.attn_norm, lambda h: self.attn(h, self_mask, rope=rope, cache=cache, need_weights=need_weights),
            self.attn_post_norm,
        )
        cross_w = None
        if self.cross_attn is not None:
            x, cross_w = self._residual(
                x,
                self.cross_attn_norm,
                lambda h: self.cross_attn(h, cross_mask, memory=memory, cache=cache, need_weights=need_weights),
            )
        x, _ = self._residual(x, self.mlp_norm, lambda h: (self.mlp(h), None), self.mlp_post_norm)
        return x, self_w, cross_w


class Stack(nn.Module):
    """Positions, embedding norm, N blocks, final norm: the body of an encoder or a decoder.

    Takes token embeddings (B, T, d_model) and returns hidden states of the same shape. A causal
    stack lets each position attend only to itself and earlier positions; a stack with ``cross``
    also attends to an encoder's output.
    """

    def __init__(self, config, spec):
        """spec: the stack in the architecture description (tformer.cost.architecture.Stack)."""
        super().__init__()
        # A stack over images starts with its patch embedding (tformer.model.vision.PatchEmbed); the model calls it.
        self.patch_embed = PatchEmbed(spec.patches) if spec.patches is not None else None
        self.causal = causal = spec.causal
        pos = spec.positions
        kind, table = pos.kind, pos.table.shape if pos.table else None
        self.positions = None
        if kind == "learned":
            self.positions = LearnedPositions(table[0] - pos.offset, table[1], pos.offset)  # table holds the offset rows
        elif kind == "sinusoidal":
            self.positions = SinusoidalPositions(*table)
        rope = kind == "rope"
        self.rope = (config.head_dim, config.rope_theta, RopeScaling.from_config(config)) if rope else None
        # Per depth (base, scaling): a sliding layer with a base of its own (Gemma 3's local layers) rotates unscaled,
        # as its checkpoints were trained.
        local = [config.layer_types is not None and config.layer_types[i] == "sliding"
                 and config.rope_local_theta is not None for i in range(len(spec.layers))]
        self.layer_rope = [(config.rope_local_theta, NO_SCALING) if own else (config.rope_theta, self.rope[2])
                           for own in local] if rope else None
        self.score_bias = None
        if kind == "alibi":
            self.score_bias = ALiBi(config.n_heads)
        elif kind == "relative":  # table: (buckets, heads)
            self.score_bias = RelativePositionBias(
                table[0], config.relative_attention_max_distance, table[1], bidirectional=not causal,
            )
        self.embed_norm = make_norm(config, spec.embed_norm.d) if spec.embed_norm else None
        self.embed_proj = Linear.described(spec.embed_proj) if spec.embed_proj else None
        self.dropout = nn.Dropout(config.dropout)
        # One module per distinct path: a shared layer (ALBERT) is built once and run at every depth.
        distinct: dict[str, object] = {}
        for layer in spec.layers:
            distinct.setdefault(layer.path, layer)
        self.layers = nn.ModuleList(Block(config, layer) for layer in distinct.values())
        self.order = [int(layer.path.rsplit(".", 1)[1]) for layer in spec.layers]
        self.final_norm = make_norm(config, spec.final_norm.d) if spec.final_norm else None
        self.pool_norm = make_norm(config, spec.pool_norm.d) if spec.pool_norm else None  # CLIP: on [CLS] alone
        self.max_positions = table[0] - pos.offset if kind == "learned" else config.max_positions

    def enter(self, h: torch.Tensor, position_ids: torch.Tensor, added_positions: torch.Tensor | None = None
              ) -> torch.Tensor:
        """Token embeddings (B, T, d_model) at ``position_ids`` (B, T) -> the first layer's input: plus
        absolute positions (learned, sinusoidal; or ``added_positions``, a table already fitted to the input:
        a ViT's, interpolated to another image size), then the embedding norm and dropout."""
        if added_positions is not None:
            h = h + added_positions.to(h.dtype)
        elif self.positions is not None:
            h = h + self.positions(position_ids).to(h.dtype)
        if self.embed_norm is not None:
            h = self.embed_norm(h)
        h = self.dropout(h)
        return self.embed_proj(h) if self.embed_proj is not None else h

    def forward(
        self,
        h: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        cache=None,
        need_weights: bool = False,
        prefix_length: torch.Tensor | None = None,
        added_positions: torch.Tensor | None = None,
    ):
        """h: (B, T, d_model) token embeddings. attention_mask: (B, past + T), 1 = real token.
        prefix_length: (B,) a prefix LM's prefix per row, attended bidirectionally (causal stacks only).
        added_positions: (1, T, d_model) positions to add instead of looking them up (see ``enter``).

        Returns (hidden (B, T, d_model), self-attention weights per layer, cross-attention weights per layer).
        """
        B, T, _ = h.shape
        if getattr(cache, "preallocated", False):
            if attention_mask is not None:
                raise TformerError("a preallocated KV cache holds its padding itself (its keep mask); pass no "
                                   "attention_mask with it")
            return self._forward_preallocated(h, position_ids, memory, memory_mask, cache, need_weights,
                                              prefix_length, added_positions)
        past = cache.length if cache is not None else 0
        total = past + T
        if self.positions is not None and added_positions is None and total > self.max_positions:
            raise TformerError(
                f"sequence of {total} positions exceeds the model's max_positions={self.max_positions}; "
                "shorten the input (or truncate it) to fit the context window"
            )
        if position_ids is None:
            position_ids = torch.arange(past, total, device=h.device)[None].expand(B, T)
        h = self.enter(h, position_ids, added_positions)

        # Each layer's cache holds keys from its own first position (a rolling layer has dropped the oldest):
        # one mask per distinct start, each depth reading its layer's.
        held_from = cache.starts if cache is not None else None
        starts = [held_from[self.layers[i].attn.layer_idx] if held_from else 0 for i in self.order]
        masks = {k_start: self._self_mask(T, past, k_start, attention_mask, prefix_length, h)
                 for k_start in dict.fromkeys(starts)}
        cross_mask = None
        if memory is not None:
            cross_mask = build_mask(T, memory.shape[1], causal=False, key_padding=memory_mask,
                                    dtype=h.dtype, device=h.device)
        return self._layers(h, [masks[s] for s in starts], self._ropes(position_ids, h.dtype), memory, cross_mask,
                            cache, need_weights)

    def _self_mask(self, T, past, k_start, attention_mask, prefix_length, h) -> AttentionMask:
        """The self-attention mask of T queries after ``past`` positions over keys from position ``k_start``."""
        total = past + T
        if attention_mask is not None and k_start:
            attention_mask = attention_mask[:, k_start:]
        score_bias = None
        if self.score_bias is not None:
            k_pos = torch.arange(k_start, total, device=h.device)
            score_bias = self.score_bias(k_pos[past - k_start:], k_pos)
        return build_mask(T, total - k_start, causal=self.causal, key_padding=attention_mask, position_bias=score_bias,
                          k_start=k_start, dtype=h.dtype, device=h.device, prefix=prefix_length)

    def _forward_preallocated(self, h, position_ids, memory, memory_mask, cache, need_weights, prefix_length,
                              added_positions):
        """The same stack over a preallocated cache (tformer.model.slot_cache): positions and masks come from
        the cache's tensors, never from Python numbers, so the shapes are those of the buffers whatever was
        read, and a compiled forward is traced once. Padding is the cache's ``keep``, never an attention_mask."""
        if prefix_length is not None:
            raise TformerError("a prefix LM's bidirectional prefix is not kept in a preallocated cache; "
                               "decode it with the growing cache")
        T = h.shape[1]
        if position_ids is None:
            position_ids = cache.position_ids(T)
        h = self.enter(h, position_ids, added_positions)
        masks = cache.self_masks(T, h.dtype, self.score_bias)  # per depth: (N, 1|H, T, L)
        cross_mask = None
        if memory is not None:
            cross_mask = (build_mask(T, memory.shape[1], causal=False, dtype=h.dtype, device=h.device)
                          if memory_mask is None else AttentionMask.padding_only(T, memory_mask.bool(), h.dtype))
        return self._layers(h, masks, self._ropes(position_ids, h.dtype), memory, cross_mask, cache, need_weights)

    def _ropes(self, position_ids: torch.Tensor, dtype: torch.dtype) -> list | None:
        """Per depth the (cos, sin) its layer rotates q and k by: one computation per distinct base."""
        if self.rope is None:
            return None
        tables = {key: rope_cos_sin(position_ids, self.rope[0], key[0], dtype, key[1])
                  for key in dict.fromkeys(self.layer_rope)}
        return [tables[self.layer_rope[depth]] for depth in range(len(self.order))]

    def _layers(self, h, self_masks, ropes, memory, cross_mask, cache, need_weights):
        """The blocks by depth (a shared layer runs at every depth it holds), then the final norm."""
        self_weights, cross_weights = [], []
        for depth, (i, mask) in enumerate(zip(self.order, self_masks)):
            h, sw, cw = self.layers[i](h, mask, rope=ropes[depth] if ropes else None, memory=memory,
                                       cross_mask=cross_mask, cache=cache, need_weights=need_weights)
            self_weights.append(sw)
            cross_weights.append(cw)
        if self.final_norm is not None:
            h = self.final_norm(h)
        return h, self_weights, cross_weights
