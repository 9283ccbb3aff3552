"""What every architecture shares: the output record, token embeddings, losses."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from tformer.model.linear import Linear
from tformer.model.quantized import QuantizedLinear

IGNORE_INDEX = -100  # label value that the losses skip (padding, unmasked MLM positions)


@dataclass
class ModelOutput:
    """Named like Hugging Face's outputs, so code written for one works with the other."""

    logits: torch.Tensor | None = None  # (B, T, vocab)
    last_hidden_state: torch.Tensor | None = None  # (B, T, d_model), after the final norm
    loss: torch.Tensor | None = None
    pooler_output: torch.Tensor | None = None  # (B, d_model), encoder with a pooler
    encoder_last_hidden_state: torch.Tensor | None = None  # encoder-decoder: (B, S, d_model)
    past_key_values: object | None = None  # KVCache
    attentions: list | None = None  # per layer (B, H, T, Tk), when asked for
    cross_attentions: list | None = None
    encoder_attentions: list | None = None
    pair_logits: torch.Tensor | None = None  # (B, 2), encoder with a pair head (NSP, SOP)
    # clip: the projected, L2-normalised embeddings and the scaled similarities (logits_per_image = its transpose)
    image_embeds: torch.Tensor | None = None  # (N_images, projection_dim)
    text_embeds: torch.Tensor | None = None  # (N_texts, projection_dim)
    logits_per_image: torch.Tensor | None = None  # (N_images, N_texts)
    logits_per_text: torch.Tensor | None = None  # (N_texts, N_images)
    # question answering (task head): each token's score as the answer's first and last token
    start_logits: torch.Tensor | None = None  # (B, T)
    end_logits: torch.Tensor | None = None  # (B, T)

    def __getitem__(self, key: str):
        return getattr(self, key)


class TransformerModel(nn.Module):
    """Base class: holds the config and the token embedding table every architecture starts with."""

    def __init__(self, config, tokens: bool = True, table=None):
        """tokens: the model reads token ids (every architecture but the ViT, which reads pixels). ``table``: the
        description's token table; one with a layout is read from the quantized LM head's blocks (no weight)."""
        super().__init__()
        self.config = config
        if tokens:
            from_head = table is not None and table.layout
            self.tok_embed = None if from_head else nn.Embedding(config.vocab_size, config.d_model)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embeddings else 1.0

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        # Ids are not range-checked here: a check needs their values on the host, a device-to-host sync on
        # every decode step on a GPU. The entry points check once instead (generate, the batcher, the server's
        # requests, training's token streams); a direct call with a bad id gets PyTorch's own IndexError.
        if self.tok_embed is None:  # the token table is the quantized head's: each id's row of blocks, widened
            h = self.lm_head.rows(input_ids)  # (..., d_model) fp32
        else:
            h = self.tok_embed(input_ids)
        return h * self.embed_scale if self.embed_scale != 1.0 else h

    def tie_weights(self) -> None:
        if getattr(self, "tied", self.config.tied_embeddings) and getattr(self, "lm_head", None) is not None \
                and getattr(self, "tok_embed", None) is not None:
            self.lm_head.weight = self.tok_embed.weight

    def add_lm_head(self, arch) -> None:
        """The LM head the ledger describes (``arch``: cost.architecture.describe's), tied to the token embedding
        only where the description says so: a recurrent model's head reads d_hidden, so a config's
        tied_embeddings holds only when d_hidden == d_model."""
        self.lm_head = Linear.described(arch.lm_head.linear)
        self.tied = arch.lm_head.linear.tied
        self.tie_weights()

    def num_parameters(self) -> int:
        """Every weight once: the parameters (a tied head shares the embedding's storage and is not counted twice)
        and the weights quantized Linears pack into buffers (a tied head quantized apart still counts as the
        embedding's)."""
        n = sum(p.numel() for p in self.parameters())
        # a tied head quantized apart is the embedding's weight again; one whose blocks the lookup reads is the only copy
        tied = getattr(getattr(self, "config", None), "tied_embeddings", False) \
            and getattr(self, "tok_embed", None) is not None
        for name, m in self.named_modules():
            if isinstance(m, QuantizedLinear) and not (tied and name == "lm_head"):
                n += m.in_features * m.out_features
        return n


def lm_loss(logits: torch.Tensor, labels: torch.Tensor, shift: bool) -> torch.Tensor:
    """Mean cross-entropy in nats over labelled positions. ``shift``: position t predicts label t+1."""
    if shift:
        logits, labels = logits[:, :-1], labels[:, 1:]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), labels.reshape(-1), ignore_index=IGNORE_INDEX)
