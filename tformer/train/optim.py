"""Optimizers with weight decay applied only where it makes sense."""

from __future__ import annotations

import torch
from torch import nn

from tformer.core.errors import TformerError

OPTIMIZERS = ("adamw", "adam", "sgd", "momentum")


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Decay matrices (linear and embedding weights); never biases or norm gains.

    Decaying a norm's gain or a bias pulls it towards 0, which changes what the layer computes
    rather than regularising it (Loshchilov & Hutter 2019; the nanoGPT/GPT-2 recipes do the same).
    Tied weights appear once because parameters() deduplicates them.
    """
    decay, no_decay = [], []
    for param in model.parameters():
        if not param.requires_grad:
            continue
        (decay if param.dim() >= 2 else no_decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def make_optimizer(model: nn.Module, name: str, lr: float, weight_decay: float = 0.1,
                   betas: tuple[float, float] = (0.9, 0.95), eps: float = 1e-8) -> torch.optim.Optimizer:
    groups = parameter_groups(model, weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)
    if name == "adam":  # decay added to the gradient (L2), not decoupled
        return torch.optim.Adam(groups, lr=lr, betas=betas, eps=eps)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr)
    if name == "momentum":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9)
    raise TformerError(f"unknown optimizer '{name}'; choose one of: {', '.join(OPTIMIZERS)}")
