"""Learning-rate schedules, as plain functions of the step (1-based), so they are easy to check by hand."""

from __future__ import annotations

from tformer.core.errors import TformerError
from tformer.cost.formulas import noam, warmup_cosine, warmup_linear

SCHEDULES = ("cosine", "noam", "constant", "linear")


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
