"""Bottleneck adapters (Houlsby et al. 2019): h + up(act(down(h))) on each block's attention output projection and on
its feed-forward's down projection, before the residual add. ``up`` starts at zero, so at initialisation the
adapted model computes exactly the base model.

Each adapter is a child of the Linear it follows (``...attn.o_proj.adapter.down.weight``) and runs as that Linear's
forward hook: the base parameters keep their names and no model file changes.
"""

from __future__ import annotations

import torch
from torch import nn

from tformer.core.errors import TformerError
from tformer.model.blocks import Block

# The Linears an adapter follows in every block: the attention's output projection and the FFN's down projection.
ADAPTED = ("attn.o_proj", "mlp.down")


class BottleneckAdapter(nn.Module):
    def __init__(self, d: int, bottleneck: int, act, like: torch.Tensor):
        super().__init__()
        factory = {"device": like.device, "dtype": like.dtype}
        self.down = nn.Linear(d, bottleneck, **factory)
        self.up = nn.Linear(bottleneck, d, **factory)
        nn.init.zeros_(self.up.weight)
        nn.init.zeros_(self.up.bias)
        self.act = act

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.up(self.act(self.down(h)))

    def after(self, module: nn.Module, args, output: torch.Tensor) -> torch.Tensor:
        """Forward hook on the Linear it follows (a bound method: a deep copy of the model rebinds it)."""
        return self(output)


def add_adapters(model: nn.Module, bottleneck: int) -> list[str]:
    """An adapter after each block's attention output and feed-forward output (in place); their paths."""
    places = [(f"{name}.{rel}", block, block.get_submodule(rel)) for name, block in model.named_modules()
              if isinstance(block, Block) for rel in ADAPTED]
    for path, _, linear in places:  # all checked before any is added: a refusal leaves the model as it was
        if hasattr(linear, "adapter"):
            raise TformerError(f"'{path}' already has an adapter; apply adapters once per model")
        if bottleneck > linear.out_features:
            width = linear.out_features
            raise TformerError(f"adapter bottleneck {bottleneck} is wider than the model's width {width}; "
                               f"choose at most {width}")
    added = []
    for path, block, linear in places:
        adapter = BottleneckAdapter(linear.out_features, bottleneck, block.mlp.act, linear.weight)
        linear.add_module("adapter", adapter)
        linear.register_forward_hook(adapter.after)
        added.append(f"{path}.adapter")
    if not added:
        raise TformerError(f"{type(model).__name__} has no Transformer blocks to put adapters in; "
                           "adapters are for encoder and decoder models")
    return added


__all__ = ["ADAPTED", "BottleneckAdapter", "add_adapters"]
