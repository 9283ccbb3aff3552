"""Decoder-only Transformer: GPT-2 (Radford et al. 2019), and with RoPE, RMSNorm, SwiGLU and
grouped-query attention, LLaMA (Touvron et al. 2023).

    tokens -> embeddings -> N causal blocks -> final norm -> LM head -> next-token logits
"""

from __future__ import annotations

import torch

from tformer.cost.architecture import describe
from tformer.model.base import ModelOutput, TransformerModel, lm_loss
from tformer.model.blocks import Stack
from tformer.model.cache import KVCache
from tformer.model.linear import Linear
from tformer.model.task_heads import task_outputs


def _kept(h: torch.Tensor, logits_to_keep) -> torch.Tensor:
    """The hidden states (B, T, d) whose logits are wanted: all (0), the last n (an int), or per row the one at
    ``logits_to_keep[b]`` (a (B,) tensor: a batch of chunks of different lengths, right-padded) -> (B, 1, d)."""
    if isinstance(logits_to_keep, torch.Tensor):
        return h[torch.arange(h.shape[0], device=h.device), logits_to_keep][:, None]
    return h[:, -logits_to_keep:] if logits_to_keep else h


class DecoderLM(TransformerModel):
    def __init__(self, config):
        arch = describe(config)
        super().__init__(config, table=arch.tok_embed)
        self.decoder = Stack(config, arch.stack("decoder"))
        if arch.task:  # a task head (tformer.model.task_heads) in place of the LM head; no dropout before it (HF)
            self.head_dropout = torch.nn.Identity()
            self.head = Linear.described(arch.classifier)
        else:
            self.add_lm_head(arch)

    def new_cache(self, reserve: int | None = None) -> KVCache:
        """A KV cache of one layout per layer (a sliding-window layer's rolling window caps its memory, whatever
        the length); ``reserve``: positions the growing layers allocate up front and then write in place."""
        return KVCache.for_config(self.config, self.config.n_layers, reserve or 0)

    def lm_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Final hidden states (..., d_model) -> next-token logits (..., vocab); with logit_softcap, squashed
        into (-cap, cap) by cap * tanh(logits / cap) (Gemma 2: large logits saturate instead of dominating)."""
        logits = self.lm_head(h)
        cap = self.config.logit_softcap
        return logits if cap is None else cap * torch.tanh(logits / cap)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, past + T), 1 = real token
        position_ids: torch.Tensor | None = None,  # (B, T); default past..past+T-1
        past_key_values: KVCache | None = None,
        use_cache: bool = False,
        labels: torch.Tensor | None = None,  # (B, T); shifted inside, -100 = ignore (a task head: its labels)
        output_attentions: bool = False,
        logits_to_keep: int | torch.Tensor = 0,  # > 0: the last n positions' logits only; (B,): each row's one; 0 = all
        skip_head: bool = False,  # True: no logits, last_hidden_state only (a chunked loss applies the head itself)
        prefix_length: torch.Tensor | None = None,  # (B,) prefix LM: each row's first n tokens see each other
        start_positions: torch.Tensor | None = None,  # (B,) question answering: the answer's first token
        end_positions: torch.Tensor | None = None,  # (B,) ... and its last
    ) -> ModelOutput:
        cache = past_key_values if past_key_values is not None else (self.new_cache() if use_cache else None)
        h = self.embed(input_ids)
        h, attentions, _ = self.decoder(h, attention_mask, position_ids, cache=cache, need_weights=output_attentions,
                                        prefix_length=prefix_length)
        if self.config.task:
            return ModelOutput(last_hidden_state=h, attentions=attentions if output_attentions else None,
                               **task_outputs(self, h, None, input_ids, attention_mask, labels, start_positions,
                                              end_positions))
        # Generation needs only the last position's logits; the head over a long prompt would
        # otherwise cost T x d_model x vocab multiply-adds for numbers that are thrown away.
        logits = None if skip_head else self.lm_logits(_kept(h, logits_to_keep))
        return ModelOutput(
            logits=logits,
            last_hidden_state=h,
            loss=lm_loss(logits, labels, shift=True) if labels is not None and logits is not None else None,
            past_key_values=cache,
            attentions=attentions if output_attentions else None,
        )
