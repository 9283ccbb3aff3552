"""Prompt tuning (Lester et al. 2021) and prefix tuning (Li & Liang 2021) on an encoder or decoder, as peft runs them.

Prompt tuning: ``virtual_tokens`` learned embeddings go before the token embeddings. As peft's PROMPT_TUNING, the
attention mask gets ones in front, token types zeros, and positions count from the first virtual token; LM and token
labels get -100 in front and answer positions shift by the prompt's length. A cls-pooled head reads position 0,
which is then the first virtual token: peft's BERT sequence classifier does the same (its pooler reads
inputs_embeds[:, 0]), and the learned prompt is free to become a better [CLS].

Prefix tuning: ``virtual_tokens`` learned keys and values before every self-attention layer's own, one embedding of
(virtual_tokens, n_layers x 2 x kv width) as peft's PREFIX_TUNING without projection (rows (layer, k|v, head, dim)).
The prefix enters as a KV cache already holding those positions, so no attention code changes: as with Hugging
Face models given peft's past_key_values, the real tokens' positions start after the prefix and the mask gets ones
in front.

Both run as hooks (a forward pre-hook on the model or stack, a forward hook on the token embedding) registered as
bound methods of their module, so the model files stay as they are and a deep copy of the model rebinds them.
"""

from __future__ import annotations

import inspect

import torch
from torch import nn

from tformer.core.errors import TformerError
from tformer.model.base import IGNORE_INDEX
from tformer.model.cache import KVCache

PROMPT_NAME, PREFIX_NAME = "peft_prompt", "peft_prefix"  # where each sits on the model: peft_prompt.embedding.weight


def _bind(fn, args, kwargs) -> dict:
    bound = inspect.signature(fn).bind(*args, **kwargs)
    return dict(bound.arguments)


def _ones_before(mask: torch.Tensor | None, width: int) -> torch.Tensor | None:
    """``mask`` (B, t) with ones in front up to ``width`` columns (None stays None)."""
    if mask is None or mask.shape[1] >= width:
        return mask
    return torch.cat([mask.new_ones(mask.shape[0], width - mask.shape[1]), mask], dim=1)


def _check_model(model: nn.Module, method: str) -> None:
    config = getattr(model, "config", None)
    traits = getattr(config, "traits", None)
    if traits is None or not (traits.decoder_only or traits.text_encoder):
        raise TformerError(f"{method} tuning is built for encoder and decoder models, not arch "
                           f"'{getattr(config, 'arch', None)}'; use lora or adapter")


class PromptTuning(nn.Module):
    def __init__(self, model: nn.Module, virtual_tokens: int):
        super().__init__()
        _check_model(model, "prompt")
        c = model.config
        like = model.tok_embed.weight
        # peft's RANDOM init: nn.Embedding's standard normal
        self.embedding = nn.Embedding(virtual_tokens, like.shape[1], device=like.device, dtype=like.dtype)
        self.n = virtual_tokens
        self.encoder = c.traits.text_encoder
        self.offset_positions = bool(c.position_offset)
        self.token_labels = c.task in ("", "token-classification")
        self.pending = False

    def attach(self, model: nn.Module) -> None:
        model.add_module(PROMPT_NAME, self)
        model.register_forward_pre_hook(self.before, with_kwargs=True)
        model.tok_embed.register_forward_hook(self.on_embed)

    def before(self, model, args, kwargs):
        """Widen what the model reads beside the ids (mask, token types, positions, labels) by the prompt."""
        a = _bind(model.forward, args, kwargs)
        ids = a["input_ids"]
        cache = a.get("past_key_values")
        if cache is not None and cache.length:  # a decode step: the prompt is already in the cache
            a["attention_mask"] = _ones_before(a.get("attention_mask"), cache.length + ids.shape[1])
            return (), a
        B, T, P = ids.shape[0], ids.shape[1], self.n
        a["attention_mask"] = _ones_before(a.get("attention_mask"), P + T)
        a["position_ids"] = None  # peft ignores given positions: the prompt shifts them
        if self.encoder:
            types = a.get("token_type_ids")
            zeros = ids.new_zeros(B, P)
            a["token_type_ids"] = torch.cat([zeros, types], 1) if types is not None else ids.new_zeros(B, P + T)
            if self.offset_positions:  # RoBERTa: HF counts inputs_embeds' positions 0.. (past the pad row)
                a["position_ids"] = torch.arange(P + T, device=ids.device)[None].expand(B, P + T)
        labels = a.get("labels")
        if labels is not None and self.token_labels and labels.dim() == 2:
            a["labels"] = torch.cat([labels.new_full((B, P), IGNORE_INDEX), labels], 1)
        for key in ("start_positions", "end_positions"):
            if a.get(key) is not None:
                a[key] = a[key] + P
        self.pending = True
        return (), a

    def on_embed(self, module, args, output: torch.Tensor) -> torch.Tensor:
        if not self.pending:
            return output
        self.pending = False
        prompts = self.embedding.weight.to(output.dtype)[None].expand(output.shape[0], -1, -1)
        return torch.cat([prompts, output], dim=1)


class PrefixTuning(nn.Module):
    def __init__(self, model: nn.Module, virtual_tokens: int):
        super().__init__()
        _check_model(model, "prefix")
        c = model.config
        self.stack = "encoder" if c.traits.text_encoder else "decoder"
        stack = getattr(model, self.stack)
        if len(set(stack.order)) != len(stack.order):
            raise TformerError("prefix tuning needs one module per layer; this model shares layers (ALBERT), "
                               "use prompt or lora")
        if not all(block.attn.exact for block in stack.layers):
            raise TformerError(f"prefix tuning prepends keys and values; attention kind '{c.attn_impl}' keeps no keys "
                               "(build with an exact kind such as sdpa)")
        self.n, self.n_layers = virtual_tokens, len(stack.order)
        self.kv_heads, self.head_dim = c.n_kv_heads, c.head_dim
        like = model.tok_embed.weight
        self.embedding = nn.Embedding(virtual_tokens, self.n_layers * 2 * c.n_kv_heads * c.head_dim,
                                      device=like.device, dtype=like.dtype)

    def attach(self, model: nn.Module) -> None:
        model.add_module(PREFIX_NAME, self)
        getattr(model, self.stack).register_forward_pre_hook(self.before, with_kwargs=True)

    def key_values(self, batch: int, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (k, v), each (batch, kv heads, virtual_tokens, head_dim), as peft's get_prompt splits them."""
        kv = self.embedding.weight.to(dtype).view(self.n, 2 * self.n_layers, self.kv_heads, self.head_dim)
        kv = kv.permute(1, 2, 0, 3)  # (2L, H, P, D)
        return [(kv[2 * i][None].expand(batch, -1, -1, -1), kv[2 * i + 1][None].expand(batch, -1, -1, -1))
                for i in range(self.n_layers)]

    def before(self, stack, args, kwargs):
        a = _bind(stack.forward, args, kwargs)
        h, cache = a["h"], a.get("cache")
        if cache is None or cache.length == 0:
            cache = cache if cache is not None else KVCache(self.n_layers)
            for i, (k, v) in enumerate(self.key_values(h.shape[0], h.dtype)):
                cache.update(i, k, v)
            if a.get("position_ids") is not None:  # given positions count the real tokens; the prefix comes first
                a["position_ids"] = a["position_ids"] + self.n
        a["cache"] = cache
        a["attention_mask"] = _ones_before(a.get("attention_mask"), cache.length + h.shape[1])
        return (), a


def add_prompt(model: nn.Module, virtual_tokens: int) -> PromptTuning:
    prompt = PromptTuning(model, virtual_tokens)
    prompt.attach(model)
    return prompt


def add_prefix(model: nn.Module, virtual_tokens: int) -> PrefixTuning:
    prefix = PrefixTuning(model, virtual_tokens)
    prefix.attach(model)
    return prefix


__all__ = ["PREFIX_NAME", "PROMPT_NAME", "PrefixTuning", "PromptTuning", "add_prefix", "add_prompt"]
