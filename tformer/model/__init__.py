"""The model family. ``build(config)`` returns the nn.Module for any ModelConfig: the class that
the architecture's record (tformer.core.architectures) names, through ``model_class``."""

from __future__ import annotations

import torch

from tformer.model.attention import ATTENTION, attention_fn
from tformer.model.base import ModelOutput, TransformerModel
from tformer.model.cache import KVCache
from tformer.model.decoder import DecoderLM
from tformer.model.encoder import EncoderModel
from tformer.model.encoder_decoder import EncoderDecoderModel
from tformer.model.init import init_weights
from tformer.model.rnn_lm import RecurrentLM
from tformer.model.rnn_seq2seq import RecurrentSeq2Seq
from tformer.model.vit import ViTModel
from tformer.model.clip import CLIPModel
from tformer.model.records import model_class, runner_class
from tformer.model.runners import Batch, Runner, runner_for
from tformer.model.compiled import compiled_runner


def build(config, device=None, dtype=None, init: bool = True) -> TransformerModel:
    """Build the model; on device="meta" nothing is allocated (for counting the big presets)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    with device:
        model = model_class(config.arch)(config)  # the class the arch's record names
    if init and device.type != "meta":
        init_weights(model)
    if dtype is not None:
        model.to(dtype)
    return model


def with_attention(model: TransformerModel, name: str) -> TransformerModel:
    """A new model, equal to ``model`` in weights, device, dtype and train/eval mode, whose attention
    layers run kind ``name`` (see ``ATTENTION``; an unknown name is the config's one-line error).
    ``model`` and its config are left untouched: modules keep the kind they were built with."""
    first = next(model.parameters())
    new = build(model.config.replace(attn_impl=name), device=first.device, dtype=first.dtype, init=False)
    new.load_state_dict(model.state_dict())
    for mine, theirs in zip(new.parameters(), model.parameters()):
        mine.requires_grad_(theirs.requires_grad)
    return new.train(model.training)


__all__ = [
    "build", "with_attention", "model_class", "runner_class", "ATTENTION", "attention_fn", "runner_for",
    "compiled_runner", "Runner", "Batch",
    "ModelOutput", "TransformerModel", "KVCache", "DecoderLM", "EncoderModel", "EncoderDecoderModel",
    "RecurrentLM", "RecurrentSeq2Seq", "ViTModel", "CLIPModel",
]
