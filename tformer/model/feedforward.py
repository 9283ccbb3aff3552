"""The position-wise feed-forward block: two (or, gated, three) linear maps around an activation."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tformer.model.linear import Linear
from tformer.model.stacked_products import run_linears, stack_linears

ACTIVATIONS = {
    "relu": F.relu,
    "gelu": F.gelu,  # exact, with erf (BERT, BART)
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),  # GPT-2's "gelu_new"
    "silu": F.silu,  # a.k.a. swish; with gating it makes SwiGLU (LLaMA)
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),  # CLIP's sigmoid approximation of gelu
}


def dropout_layer(p: float) -> nn.Module:
    """Dropout with probability ``p``; with p = 0 (every inference config read from Hugging Face or GGUF) nothing at
    all, so a decode step does not call a module that returns its input (three per layer, in eval mode too)."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


class FeedForward(nn.Module):
    """down(act(up(x))), or down(act(gate(x)) * up(x)) when gated (Shazeer 2020).

    x: (B, T, d_model) -> (B, T, d_model); the hidden layer is (B, T, d_ff).
    """

    def __init__(self, config, spec):
        """spec: the layer's MLP in the architecture description (tformer.cost.architecture.MLP)."""
        super().__init__()
        self.up = Linear.described(spec.up)
        self.gate = Linear.described(spec.gate) if spec.gate is not None else None
        self.down = Linear.described(spec.down)
        self.act = ACTIVATIONS[spec.activation]
        self.dropout = dropout_layer(config.activation_dropout)
        self._stacked = None  # gate and up as one block-kernel product: stack_products()

    def stack_products(self) -> None:
        """Prepare gate and up's one product where they can be one (the paths' choice: choose_paths)."""
        self._stacked = None if self.gate is None else stack_linears([self.gate, self.up], self._stacked)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:  # gate and up read x: one product where they can be (model/stacked_products)
            gate, up = run_linears(x, (self.gate, self.up), self._stacked)
            h = self.act(gate) * up
        else:
            h = self.act(self.up(x))
        return self.down(self.dropout(h))
