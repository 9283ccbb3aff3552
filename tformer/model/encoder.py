"""Encoder-only Transformer: BERT (Devlin et al. 2018) and its variants.

    tokens + segments -> embeddings -> norm -> N bidirectional blocks -> hidden states
                                                 |-> pooler (first token, dense, tanh) -> pair head (NSP/SOP)
                                                 |-> MLM head (dense, act, norm, tied decoder)

RoBERTa (Liu et al. 2019): one segment row, positions counted over non-pad tokens from row
pad_token_id + 1 (position_offset). DistilBERT (Sanh et al. 2019): no segments, no pooler. ALBERT
(Lan et al. 2019): tables of width E projected to d_model, one layer's weights at every depth.
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
from tformer.model.task_heads import task_outputs


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
        if arch.tok_embed.shape[1] != config.d_model:  # ALBERT's factorised table (vocab, E)
            self.tok_embed = nn.Embedding(*arch.tok_embed.shape)
        self.type_embed = nn.Embedding(*arch.type_embed.shape) if arch.type_embed else None
        self.encoder = Stack(config, arch.stack("encoder"))
        self.pooler = Pooler(arch.pooler) if arch.pooler else None
        self.mlm_head = MLMHead(config, arch.mlm_head) if arch.mlm_head else None
        if self.mlm_head is not None and arch.mlm_head.decoder.tied:
            self.mlm_head.decoder.weight = self.tok_embed.weight
        self.pair_head = Linear.described(arch.pair_head) if arch.pair_head else None
        if arch.task:  # a task head (tformer.model.task_heads) in place of the MLM head
            self.head_dropout = nn.Dropout(config.dropout)
            self.head = Linear.described(arch.classifier)

    def forward(
        self,
        input_ids: torch.Tensor,  # (B, T)
        attention_mask: torch.Tensor | None = None,  # (B, T), 1 = real token
        token_type_ids: torch.Tensor | None = None,  # (B, T) segment ids
        position_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,  # (B, T) original ids at masked positions, -100 elsewhere
        output_attentions: bool = False,                 # (a task head: its labels, tformer.model.task_heads)
        pair_labels: torch.Tensor | None = None,  # (B,) NSP / SOP class of each row; needs the pair head
        start_positions: torch.Tensor | None = None,  # (B,) question answering: the answer's first token
        end_positions: torch.Tensor | None = None,  # (B,) ... and its last
    ) -> ModelOutput:
        h = self.embed(input_ids)
        if position_ids is None and self.config.position_offset and self.config.pad_token_id is not None:
            position_ids = non_pad_positions(input_ids, self.config.pad_token_id)
        if self.type_embed is not None:
            if token_type_ids is None:
                token_type_ids = torch.zeros_like(input_ids)
            h = h + self.type_embed(token_type_ids)
        h, attentions, _ = self.encoder(h, attention_mask, position_ids, need_weights=output_attentions)
        if self.config.task:
            pooled = self.pooler(h) if self.pooler is not None else None
            return ModelOutput(last_hidden_state=h, pooler_output=pooled, attentions=attentions if output_attentions
                               else None, **task_outputs(self, h, pooled, input_ids, attention_mask, labels,
                                                         start_positions, end_positions))
        logits = self.mlm_head(h) if self.mlm_head is not None else None
        loss = None
        if labels is not None:
            if logits is None:
                raise TformerError("labels given but the model has no MLM head; build it with lm_head=true")
            loss = lm_loss(logits, labels, shift=False)
        pooled = self.pooler(h) if self.pooler is not None else None
        pair_logits = self.pair_head(pooled) if self.pair_head is not None else None
        if pair_labels is not None:
            if pair_logits is None:
                raise TformerError("pair_labels given but the model has no pair head; build it with pair_head=true")
            pair_loss = lm_loss(pair_logits[:, None], pair_labels[:, None], shift=False)
            loss = pair_loss if loss is None else loss + pair_loss
        return ModelOutput(
            logits=logits,
            last_hidden_state=h,
            loss=loss,
            pooler_output=pooled,
            attentions=attentions if output_attentions else None,
            pair_logits=pair_logits,
        )


def non_pad_positions(input_ids: torch.Tensor, pad_token_id: int) -> torch.Tensor:
    """(B, T) position ids counting each row's non-pad tokens from 0; pad tokens get -1, which an
    offset table maps to its row offset - 1 (RoBERTa's padding_idx, as fairseq's make_positions)."""
    real = input_ids.ne(pad_token_id).long()
    return torch.cumsum(real, dim=1) * real - 1
