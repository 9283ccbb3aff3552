"""Fine-tuning methods on a tformer model (tformer.core.peft.PeftSpec says which and how big).

``apply_peft(model, spec)`` freezes what the method does not train and adds the method's modules, in place, as
peft's get_peft_model does; the task head (``head.*``) always trains. ``merge_peft`` folds LoRA's updates into
the base weights (inference at the base model's cost) and ``unmerge_peft`` restores them exactly.
"""

from __future__ import annotations

import torch
from torch import nn

from tformer.adapt.adapters import add_adapters
from tformer.adapt.lora import add_lora, lora_modules, match_targets
from tformer.adapt.prompts import add_prefix, add_prompt
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
    # The added modules are the only trainable ones besides the head: freeze first, then add.
    frozen = {name: p for name, p in model.named_parameters()}
    if spec.method == "lora":
        add_lora(model, match_targets(model, spec.targets), spec.rank, spec.alpha, spec.dropout)
    elif spec.method == "adapter":
        add_adapters(model, spec.bottleneck)
    elif spec.method == "prompt":
        add_prompt(model, spec.virtual_tokens)
    elif spec.method == "prefix":
        add_prefix(model, spec.virtual_tokens)
    else:
        raise TformerError(f"fine-tuning method '{spec.method}' is not built")
    for name, p in model.named_parameters():
        p.requires_grad_(name.startswith(HEAD_PREFIX) or frozen.get(name) is not p)
    return model


def merge_peft(model: nn.Module) -> nn.Module:
    """Fold every LoRA update into its base weight (W + (alpha / r) B A); other methods have nothing to fold."""
    for module in lora_modules(model).values():
        module.merge()
    return model


def unmerge_peft(model: nn.Module) -> nn.Module:
    """Undo merge_peft: the base weights exactly as they were."""
    for module in lora_modules(model).values():
        module.unmerge()
    return model


def merged_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    """The plain model's state dict of a LoRA model: each target's W + (alpha / r) B A under W's own name, the LoRA
    tensors left out, so the result loads into a model built from the config alone (tformer.interop.checkpoint).
    ``model`` is left as it was. Methods that add modules (adapters, prompt, prefix) have no such form: refused."""
    extra = [n for n, _ in model.named_parameters() if n.startswith("peft_") or ".adapter." in n]
    if extra:
        raise TformerError(f"{extra[0]} belongs to a method that adds modules; it cannot be folded into the base "
                           "weights (keep the base and the adapter folder, tformer.adapt.load_adapter)")
    lora = lora_modules(model)
    state = {k: v.detach() for k, v in model.state_dict().items() if ".lora_" not in k}
    for path, module in lora.items():
        state[f"{path}.weight"] = (module.weight.detach() + (0 if module.merged else module.delta().detach())).clone()
    return state


def trainable_parameters(model: nn.Module) -> int:
    """Parameters that take a gradient (each shared tensor once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


__all__ = ["HEAD_PREFIX", "apply_peft", "merge_peft", "merged_weights", "trainable_parameters", "unmerge_peft"]
