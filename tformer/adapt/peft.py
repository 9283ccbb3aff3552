"""Fine-tuning methods on a tformer model (tformer.core.peft.PeftSpec says which and how big).

``apply_peft(model, spec)`` freezes what the method does not train and adds the method's modules, in place, as
peft's get_peft_model does; the task head (``head.*``) always trains.
"""

from __future__ import annotations

from torch import nn

from tformer.core.errors import TformerError
from tformer.core.peft import PeftSpec

HEAD_PREFIX = "head."  # the task head's parameters (tformer.model.task_heads)


def apply_peft(model: nn.Module, spec: PeftSpec) -> nn.Module:
    """``model`` made ready to fine-tune by ``spec.method``; returns it (changed in place)."""
    if spec.method == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    if spec.method in ("head", "bitfit"):
        for name, p in model.named_parameters():
            p.requires_grad_(name.startswith(HEAD_PREFIX) or (spec.method == "bitfit" and name.endswith(".bias")))
        return model
    raise TformerError(f"fine-tuning method '{spec.method}' is not built yet")


def trainable_parameters(model: nn.Module) -> int:
    """Parameters that take a gradient (each shared tensor once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
