"""PeftSpec: what a fine-tuning run trains, as one record read by the model (tformer.adapt wraps the modules), the
ledger (tformer.cost.peft: trainable parameters, extra FLOPs, training memory) and the CLI (`tformer finetune`).

Methods (the course's chapter on adapting models):
    full     every parameter
    head     the task head only (a linear probe on frozen features)
    bitfit   biases and the task head (Ben Zaken et al. 2021)
    lora     W x + (alpha / r) B A x on the target Linears, A (r, in) and B (out, r); W frozen (Hu et al. 2021)
    adapter  a bottleneck (down, activation, up, residual) after each block's attention and feed-forward output
             (Houlsby et al. 2019)
    prompt   virtual_tokens learned embeddings before the input (Lester et al. 2021)
    prefix   virtual_tokens learned keys and values before every layer's own (Li & Liang 2021)
The task head trains under every method (peft's modules_to_save for a classifier).

No torch: the ledger reads it.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from tformer.core.errors import TformerError

METHODS = ("full", "head", "bitfit", "lora", "adapter", "prompt", "prefix")
# Where LoRA goes when no targets are named: the query and value projections, as the LoRA paper and peft's
# defaults for BERT and GPT-2 do.
DEFAULT_TARGETS = ("q_proj", "v_proj")


@dataclass(frozen=True)
class PeftSpec:
    method: str = "lora"
    rank: int = 8  # lora: r
    alpha: float = 8.0  # lora: the update is scaled by alpha / r (peft's default: r = alpha = 8)
    dropout: float = 0.0  # lora: dropout on the input of A (training only)
    # lora: module names (the last part of a module's path, e.g. q_proj, or a path ending) or one regular
    # expression matched against the whole path, as peft's target_modules
    targets: tuple[str, ...] = DEFAULT_TARGETS
    bottleneck: int = 64  # adapter: the bottleneck's width
    virtual_tokens: int = 20  # prompt, prefix: learned positions

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.method not in METHODS:
            raise TformerError(f"fine-tuning method '{self.method}' is unknown; choose one of: {', '.join(METHODS)}")
        for name in ("rank", "bottleneck", "virtual_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TformerError(f"{name} must be a whole number of at least 1, got {value!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not 0 < self.alpha < math.inf:
            raise TformerError(f"alpha (LoRA's scale numerator) must be a finite positive number, got {self.alpha!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise TformerError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if isinstance(self.targets, str) or not self.targets or not all(isinstance(t, str) and t for t in self.targets):
            raise TformerError(f"targets must name at least one module (e.g. q_proj,v_proj), got {self.targets!r}")

    @property
    def scaling(self) -> float:
        """LoRA's alpha / r."""
        return self.alpha / self.rank

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["targets"] = list(self.targets)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PeftSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise TformerError(f"unknown fine-tuning setting '{unknown[0]}'; valid: {', '.join(sorted(known))}")
        data = dict(data)
        if "targets" in data:
            targets = data["targets"]
            data["targets"] = tuple(targets.split(",")) if isinstance(targets, str) else tuple(targets or ())
        return cls(**data)


__all__ = ["DEFAULT_TARGETS", "METHODS", "PeftSpec"]
