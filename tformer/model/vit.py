"""The Vision Transformer (Dosovitskiy et al. 2020): an encoder over an image's patches.

    pixels -> patches + [CLS] (tformer.model.vision) + learned positions -> N pre-norm blocks -> norm
           -> the [CLS] state -> classifier (n_classes; none when n_classes = 0: features only)

Equal to Hugging Face's ViTForImageClassification on the same weights (tformer.interop maps the names).
"""

from __future__ import annotations

import torch

from tformer.cost.architecture import describe
from tformer.model.base import ModelOutput, TransformerModel, lm_loss
from tformer.model.blocks import Stack
from tformer.model.linear import Linear
from tformer.model.vision import encode_images


class ViTModel(TransformerModel):
    def __init__(self, config):
        super().__init__(config, tokens=False)
        arch = describe(config)
        self.encoder = Stack(config, arch.stack("encoder"))
        self.head = Linear.described(arch.classifier) if arch.classifier else None

    def forward(
        self,
        pixel_values: torch.Tensor,  # (B, C, H, W)
        labels: torch.Tensor | None = None,  # (B,) class of each image
        output_attentions: bool = False,
        interpolate_pos_encoding: bool = False,  # another image size: interpolate the positions (else refused)
    ) -> ModelOutput:
        h, attentions = encode_images(self.encoder, pixel_values, interpolate_pos_encoding, output_attentions)
        pooled = h[:, 0]  # (B, d): the [CLS] state
        logits = self.head(pooled) if self.head is not None else None  # (B, n_classes)
        loss = None
        if labels is not None:
            loss = lm_loss(logits[:, None], labels[:, None], shift=False)
        return ModelOutput(logits=logits, last_hidden_state=h, loss=loss, pooler_output=pooled,
                           attentions=attentions if output_attentions else None)
