"""CLIP (Radford et al. 2021): an image tower and a text tower trained so that matching pairs meet.

    pixels -> ViT (pre-norm over the embeddings, no final norm) -> [CLS] -> pool norm -> vision_proj -> / ||.||
    text   -> causal Transformer -> final norm -> the state at each text's end token -> text_proj -> / ||.||
    logits_per_text = text_embeds @ image_embeds^T * exp(logit_scale)   (N_texts, N_images)
    loss = (CE(logits_per_text, diagonal) + CE(logits_per_image, diagonal)) / 2   (symmetric InfoNCE)

Equal to Hugging Face's CLIPModel on the same weights (tformer.interop maps the names).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tformer.core.errors import TformerError
from tformer.cost.architecture import describe
from tformer.model.base import ModelOutput, TransformerModel
from tformer.model.blocks import Stack
from tformer.model.linear import Linear
from tformer.model.vision import encode_images


class ContrastiveHead(nn.Module):
    """The projections into the shared space and the learned temperature (its log: ``logit_scale``)."""

    def __init__(self, config, spec):
        super().__init__()
        self.logit_scale = nn.Parameter(torch.tensor(float(config.logit_scale_init)))
        self.vision_proj = Linear.described(spec.vision_proj)
        self.text_proj = Linear.described(spec.text_proj)


def contrastive_loss(logits_per_text: torch.Tensor, label_smoothing: float = 0.0) -> torch.Tensor:
    """Symmetric cross-entropy (fp32) of an (N, N) similarity whose diagonal holds the matching pairs."""
    target = torch.arange(logits_per_text.shape[0], device=logits_per_text.device)
    logits = logits_per_text.float()
    return (F.cross_entropy(logits, target, label_smoothing=label_smoothing)
            + F.cross_entropy(logits.T, target, label_smoothing=label_smoothing)) / 2


class CLIPModel(TransformerModel):
    def __init__(self, config):
        super().__init__(config)
        arch = describe(config)
        self.vision = Stack(config.vision_tower(), arch.stack("vision"))
        self.text = Stack(config, arch.stack("text"))
        self.head = ContrastiveHead(config, arch.contrastive)

    # The two towers alone -------------------------------------------------------------------------------
    def image_features(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False,
                       output_attentions: bool = False):
        """(B, C, H, W) -> ((B, projection_dim) projected, not normalised; hidden states; attentions)."""
        h, attentions = encode_images(self.vision, pixel_values, interpolate_pos_encoding, output_attentions)
        pooled = self.vision.pool_norm(h[:, 0])
        return self.head.vision_proj(pooled), h, attentions

    def text_features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                      output_attentions: bool = False):
        """(B, T) ids -> ((B, projection_dim) projected, not normalised; hidden states; attentions). Each text is
        read up to its end token (eos_token_id; the first one, where padding repeats it); the state there is its
        vector. A text without one is refused: the tokenizer adds it."""
        h, attentions, _ = self.text(self.embed(input_ids), attention_mask, need_weights=output_attentions)
        ends = self.text_ends(input_ids)
        pooled = h[torch.arange(h.shape[0], device=h.device), ends]
        return self.head.text_proj(pooled), h, attentions

    def text_ends(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(B,) the position each text is pooled at. eos_token_id = 2 is the released configs' old value, under
        which Hugging Face takes the largest id (the end token is the vocabulary's last); tformer does the same."""
        eos = self.config.eos_token_id
        if eos is None or eos == 2:
            return input_ids.argmax(dim=-1)
        is_end = input_ids == eos
        if not bool(is_end.any(dim=-1).all()):
            raise TformerError(f"a text has no end token (id {eos}); end every text with it, as the tokenizer does")
        return is_end.int().argmax(dim=-1)

    def forward(
        self,
        input_ids: torch.Tensor,  # (N_texts, T)
        pixel_values: torch.Tensor,  # (N_images, C, H, W)
        attention_mask: torch.Tensor | None = None,  # (N_texts, T), 1 = real token
        return_loss: bool = False,  # needs N_texts == N_images: text i describes image i
        output_attentions: bool = False,
        interpolate_pos_encoding: bool = False,
    ) -> ModelOutput:
        image, _, image_w = self.image_features(pixel_values, interpolate_pos_encoding, output_attentions)
        text, text_h, text_w = self.text_features(input_ids, attention_mask, output_attentions)
        image = image / image.norm(dim=-1, keepdim=True)
        text = text / text.norm(dim=-1, keepdim=True)
        logits_per_text = (text @ image.T) * self.head.logit_scale.exp()
        loss = None
        if return_loss:
            if logits_per_text.shape[0] != logits_per_text.shape[1]:
                raise TformerError(f"the contrastive loss pairs text i with image i; got {logits_per_text.shape[0]} "
                                   f"texts and {logits_per_text.shape[1]} images")
            loss = contrastive_loss(logits_per_text)
        return ModelOutput(loss=loss, last_hidden_state=text_h, image_embeds=image, text_embeds=text,
                           logits_per_text=logits_per_text, logits_per_image=logits_per_text.T,
                           attentions=text_w if output_attentions else None,
                           encoder_attentions=image_w if output_attentions else None)
