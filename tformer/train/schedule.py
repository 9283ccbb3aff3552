"""Learning-rate schedules, as plain functions of the step (1-based), so they are easy to check by hand."""

from __future__ import annotations

import math

from tformer.errors import TformerError

SCHEDULES = ("cosine", "noam", "constant", "linear")


def warmup_cosine(step: int, lr_max: float, warmup: int, total: int, lr_min: float = 0.0) -> float:
    """Linear warmup to lr_max over ``warmup`` steps, then a half cosine down to lr_min at ``total``."""
    if warmup > 0 and step <= warmup:
        return lr_max * step / warmup
    if step >= total:
        return lr_min
    progress = (step - warmup) / max(1, total - warmup)
    return lr_min + 0.5 * (lr_max - lr_min) * (1.0 + math.cos(math.pi * progress))


def warmup_linear(step: int, lr_max: float, warmup: int, total: int, lr_min: float = 0.0) -> float:
    """Linear warmup, then linear decay to lr_min at ``total`` (BERT's schedule)."""
    if warmup > 0 and step <= warmup:
        return lr_max * step / warmup
    if step >= total:
        return lr_min
    return lr_min + (lr_max - lr_min) * (total - step) / max(1, total - warmup)


def noam(step: int, d_model: int, warmup: int, factor: float = 1.0) -> float:
    """The 2017 paper's schedule: d_model^-0.5 * min(step^-0.5, step * warmup^-1.5).

    Rises linearly for ``warmup`` steps, then decays as the inverse square root of the step.
    """
    step = max(step, 1)
    return factor * d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def adam_effective_step(alpha: float, beta1: float, beta2: float, t: int) -> float:
    """Size of Adam's first bias-corrected step scale alpha * sqrt(1 - beta2^t) / (1 - beta1^t)."""
    return alpha * math.sqrt(1 - beta2**t) / (1 - beta1**t)


def make_schedule(name: str, lr: float, warmup: int, total: int, d_model: int, lr_min: float = 0.0):
    """A function step -> learning rate. For noam, ``lr`` is the multiplier on the paper's formula."""
    if name == "cosine":
        return lambda step: warmup_cosine(step, lr, warmup, total, lr_min)
    if name == "linear":
        return lambda step: warmup_linear(step, lr, warmup, total, lr_min)
    if name == "noam":
        if warmup < 1:
            raise TformerError("the noam schedule needs --warmup of at least 1 step")
        return lambda step: noam(step, d_model, warmup, factor=lr)
    if name == "constant":
        return lambda step: lr * min(1.0, step / warmup) if warmup else lr
    raise TformerError(f"unknown schedule '{name}'; choose one of: {', '.join(SCHEDULES)}")
