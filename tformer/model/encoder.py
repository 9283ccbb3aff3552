"""Encoder-only Transformer: BERT (Devlin et al. 2018).

    tokens + segments -> embeddings -> norm -> N bidirectional blocks -> hidden states
                                                 |-> pooler (first token, dense, tanh)
                                                 |-> MLM head (dense, act, norm, tied decoder)
"""

from __future__ import annotations

import torch
from torch import nn

from tformer.core.errors import TformerError
from tformer.cost.architecture import describe
from tformer.model.base import ModelOutput, TransformerModel, lm_loss
from tformer.model.blocks import Stack
from tformer.model.feedforward import ACTIVATIONS
from tformer.model.linear import Linear
from tformer.model.norm import make_norm


class Pooler(nn.Module):
    """A sentence vector: the first ([CLS]) token's state through dense + tanh."""

    def __init__(self, spec):
        super().__init__()
        self.dense = Linear.described(spec)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.dense(h[:, 0]))


class MLMHead(nn.Module):
    """Predicts masked tokens: transform (dense, activation, norm), then the tied output embedding."""

    def __init__(self, config, spec):
        super().__init__()
        self.dense = Linear.described(spec.dense)
        self.act = ACTIVATIONS[spec.activation]
        self.norm = make_norm(config, spec.norm.d)
        self.decoder = Linear.described(spec.decoder)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(self.act(self.dense(h))))


class EncoderModel(TransformerModel):
    def __init__(self, config):
        super().__init__(config)
        arch = describe(config)
        self.type_embed = nn.Embedding(*arch.type_embed.shape) if arch.type_embed else None
        self.encoder = Stack(config, arch.stack("encoder"))
        self.pooler = Pooler(arch.pooler) if arch.pooler else None
        self.mlm_head = MLMHead(config, arch.mlm_head) if arch.mlm_head else None
        if self.mlm_head is not None and arch.mlm_head.decoder.tied:
            self.mlm_head.decoder.weight = self.tok_embed.weight

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, T), 1 = real token
        token_type_ids: torch.Tensor | None = None,  # (B, T) segment ids
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B, T) original ids at masked positions, -100 elsewhere
        output_attentions: bool = False,
    ) -> ModelOutput:
        h = self.embed(input_ids)
        if self.type_embed is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            h = h + self.type_embed(token_type_ids)
        h, attentions, _ = self.encoder(h, attention_mask, position_ids, need_weights=output_attentions)
        logits = self.mlm_head(h) if self.mlm_head is not None else None
        loss = None
        if labels is not None:
            if logits is None:
                raise TformerError("labels given but the model has no MLM head; build it with lm_head=true")
            loss = lm_loss(logits, labels, shift=False)
        return ModelOutput(
            logits=logits,
            last_hidden_state=h,
            loss=loss,
            pooler_output=self.pooler(h) if self.pooler is not None else None,
            attentions=attentions if output_attentions else None,
        )
