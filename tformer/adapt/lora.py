"""LoRA (Hu et al. 2021): a frozen Linear plus a trainable low-rank update, y = W x + b + (alpha / r) B A dropout(x).

A (r, in) starts kaiming-uniform (a = sqrt(5), as nn.Linear and peft initialise it) and B (out, r) at zero, so the
wrapped model computes exactly what it did before training. The wrapper keeps the base parameters under their
own names (``...q_proj.weight``, ``...q_proj.bias``) and adds ``...q_proj.lora_A.weight`` and
``...q_proj.lora_B.weight``, so a checkpoint of a LoRA model still holds the base model's names.

Targets are matched as peft's ``target_modules``: a name matches a module whose path equals it or ends with
"." + name; a single target that is not a plain name is a regular expression full-matched against the path.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from tformer.core.errors import TformerError
from tformer.cost.peft import match_paths
from tformer.model.linear import Linear


class LoraLinear(Linear):
    """A Linear whose weight (and bias) stay frozen, beside LoRA's trainable A and B."""

    def __init__(self, base: nn.Linear, rank: int, alpha: float, dropout: float = 0.0):
        nn.Module.__init__(self)  # the base's own parameters are reused, not initialised again
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight = base.weight
        self.bias = base.bias
        self.weight.requires_grad_(False)
        if self.bias is not None:
            self.bias.requires_grad_(False)
        self.rank, self.alpha, self.scaling = rank, alpha, alpha / rank
        factory = {"device": base.weight.device, "dtype": base.weight.dtype}
        self.lora_A = nn.Linear(self.in_features, rank, bias=False, **factory)
        self.lora_B = nn.Linear(rank, self.out_features, bias=False, **factory)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.lora_dropout = nn.Dropout(dropout) if dropout else nn.Identity()
        self.merged = False
        self._unmerged: torch.Tensor | None = None  # W before merge(): unmerge restores it bit for bit

    def delta(self) -> torch.Tensor:
        """The update merge() folds into W: (alpha / r) B A, (out, in)."""
        return (self.lora_B.weight @ self.lora_A.weight) * self.scaling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = super().forward(x)  # the base product, on the path chosen for it (tformer.model.path_choice)
        if self.merged:
            return out
        return out + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling

    @torch.no_grad()
    def merge(self) -> None:
        """W <- W + (alpha / r) B A: one matmul per call again (inference)."""
        if self.merged:
            return
        self._unmerged = self.weight.detach().clone()
        self.weight.add_(self.delta().to(self.weight.dtype))
        self.merged = True

    @torch.no_grad()
    def unmerge(self) -> None:
        """W as it was before merge(), exactly (the kept copy, not W - B A, which would round)."""
        if not self.merged:
            return
        self.weight.copy_(self._unmerged)
        self._unmerged = None
        self.merged = False

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, alpha={self.alpha}"


def match_targets(model: nn.Module, targets: tuple[str, ...] | list[str] | str) -> list[str]:
    """Paths of the modules ``targets`` names (peft's target_modules rules); every match must be a Linear."""
    paths = [name for name, _ in model.named_modules() if name]
    found = match_paths(paths, targets)
    modules = dict(model.named_modules())
    for path in found:
        if not isinstance(modules[path], nn.Linear):
            raise TformerError(f"LoRA target '{path}' is a {type(modules[path]).__name__}, not a Linear; "
                               "target linear layers (e.g. q_proj, v_proj, up, down)")
    return found


def add_lora(model: nn.Module, paths: list[str], rank: int, alpha: float, dropout: float) -> list[str]:
    """Replace each Linear at ``paths`` by a LoraLinear around it (in place; every path checked first, so a refusal
    leaves the model as it was); returns ``paths``."""
    bases = {path: model.get_submodule(path) for path in paths}
    for path, base in bases.items():
        if isinstance(base, LoraLinear):
            raise TformerError(f"'{path}' already has LoRA; apply LoRA once per model")
        limit = min(base.in_features, base.out_features)
        if not 1 <= rank <= limit:
            raise TformerError(f"LoRA rank {rank} does not fit '{path}' ({base.out_features} x {base.in_features}); "
                               f"choose a rank from 1 to {limit}")
    for path, base in bases.items():
        parent_path, _, name = path.rpartition(".")
        parent = model.get_submodule(parent_path) if parent_path else model
        setattr(parent, name, LoraLinear(base, rank, alpha, dropout))
    return paths


def lora_modules(model: nn.Module) -> dict[str, LoraLinear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, LoraLinear)}


__all__ = ["LoraLinear", "add_lora", "lora_modules", "match_targets"]
