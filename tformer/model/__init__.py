"""The model family. ``build(config)`` returns the nn.Module for any ModelConfig."""

from __future__ import annotations

import torch

from tformer.model.base import ModelOutput, TransformerModel
from tformer.model.cache import KVCache
from tformer.model.decoder import DecoderLM
from tformer.model.encoder import EncoderModel
from tformer.model.encoder_decoder import EncoderDecoderModel
from tformer.model.init import init_weights
from tformer.model.runners import Batch, Runner, runner_for

ARCHITECTURES = {"decoder": DecoderLM, "encoder": EncoderModel, "encoder-decoder": EncoderDecoderModel}


def build(config, device=None, dtype=None, init: bool = True) -> TransformerModel:
    """Build the model; on device="meta" nothing is allocated (for counting the big presets)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    with device:
        model = ARCHITECTURES[config.arch](config)
    if init and device.type != "meta":
        init_weights(model)
    if dtype is not None:
        model.to(dtype)
    return model


__all__ = ["build", "runner_for", "Runner", "Batch", "ModelOutput", "TransformerModel", "KVCache", "DecoderLM", "EncoderModel", "EncoderDecoderModel"]
