"""The Transformer layer and the stack of layers that encoders and decoders are made of."""

from __future__ import annotations

import torch
from torch import nn

from tformer.core.errors import TformerError
from tformer.model.attention import MultiHeadAttention
from tformer.model.cache import Uncached
from tformer.model.feedforward import FeedForward, dropout_layer
from tformer.model.linear import Linear
from tformer.model.masks import AttentionMask, build_mask
from tformer.model.norm import make_norm
from tformer.model.position import (
    NO_SCALING,
    ALiBi,
    LearnedPositions,
    RelativePositionBias,
    RopeScaling,
    SinusoidalPositions,
    rope_cos_sin,
)
from tformer.model.vision import PatchEmbed


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
        self.dropout = dropout_layer(config.dropout)

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
        self.dropout = dropout_layer(config.dropout)
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
        # Whatever the cache (growing, rolling, preallocated slots, none), it answers the same three questions:
        # how many positions these tokens reach, their position ids (padding counted out), and per layer the mask
        # of these queries over the keys that layer will attend to.
        face = cache if cache is not None else Uncached()
        total = face.span(T)
        if self.positions is not None and added_positions is None and total is not None and total > self.max_positions:
            raise TformerError(
                f"sequence of {total} positions exceeds the model's max_positions={self.max_positions}; "
                "shorten the input (or truncate it) to fit the context window"
            )
        counted = face.admit(T, attention_mask, h.device)
        position_ids = (counted if position_ids is None else position_ids).expand(B, T)
        h = self.enter(h, position_ids, added_positions)
        masks = face.masks(T, h.dtype, h.device, causal=self.causal, score_bias=self.score_bias,
                           prefix=prefix_length, layers=len(self.order))
        cross_mask = None
        if memory is not None:
            cross_mask = (build_mask(T, memory.shape[1], causal=False, dtype=h.dtype, device=h.device)
                          if memory_mask is None else AttentionMask.padding_only(T, memory_mask.bool(), h.dtype))
        layer_masks = [masks[self.layers[i].attn.layer_idx] for i in self.order]
        return self._layers(h, layer_masks, self._ropes(position_ids, h.dtype), memory, cross_mask, cache,
                            need_weights)

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
