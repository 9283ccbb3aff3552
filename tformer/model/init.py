"""Initial weights for training from scratch (loaded checkpoints overwrite them)."""

from __future__ import annotations

import math

import torch
from torch import nn

from tformer.model.attention import AttentionKind
from tformer.model.quantized import QuantizedLinear
from tformer.model.position import LearnedPositions, RelativePositionBias
from tformer.model.vision import PatchEmbed

STD = 0.02  # GPT-2 / BERT


def init_weights(model: nn.Module) -> None:
    config = model.config
    if config.traits.recurrent:
        _torch_defaults(model)
        return
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, 0.0, STD)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, QuantizedLinear):  # a quantized config built fresh: a quantized N(0, 0.02) draw
            module.quantize_(torch.randn(module.out_features, module.in_features) * STD)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, (LearnedPositions, RelativePositionBias, nn.Conv2d)):  # Conv2d: ViT's patches
            nn.init.normal_(module.weight, 0.0, STD)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, PatchEmbed):
            nn.init.normal_(module.cls_token, 0.0, STD)
        elif isinstance(module, AttentionKind) and hasattr(module, "reset_parameters"):
            module.reset_parameters()  # a kind's own parameters (Linformer's E, F) start as it says
    # Small even when the model scales embeddings by sqrt(d_model): with a tied output layer, a
    # unit-size embedding makes every position's logits favour its own input token (the residual
    # stream carries it), a minimum that a small encoder-decoder never left on the copy task.
    if getattr(model, "tok_embed", None) is not None:  # a ViT reads pixels, not tokens
        nn.init.normal_(model.tok_embed.weight, 0.0, STD)
    # Residual branches add up over depth; scale their output projections by 1/sqrt(2 * layers)
    # so the residual stream's variance stays put (GPT-2 paper, section 2.3).
    n_residual = 2 * (config.n_layers + (config.n_decoder_layers if config.arch == "encoder-decoder" else 0))
    for name, param in model.named_parameters():
        if name.endswith(("o_proj.weight", "mlp.down.weight")):
            nn.init.normal_(param, 0.0, STD / math.sqrt(n_residual))


def _torch_defaults(model: nn.Module) -> None:
    """Recurrent models start from torch's own initialisation (embedding N(0, 1), Linear and LSTM/GRU
    uniform in +-1/sqrt(fan_in)), as torch's recurrent language models do. GPT-2's 0.02 embedding would feed
    the gates inputs some 50 times smaller than their biases: measured here, an LSTM so initialised stayed at
    chance on an 8-token recall task for 600 Adam steps that the torch-initialised one solves in 300-400."""
    for module in model.modules():
        if module is not model and hasattr(module, "reset_parameters"):
            module.reset_parameters()
