"""Normalisation layers: LayerNorm (with a hand-written twin of F.layer_norm), RMSNorm, and Gemma's RMSNorm
whose scale is 1 + w."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def layer_norm_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    """LayerNorm written out: normalise each feature vector to mean 0, variance 1, then scale and shift.

    The variance is the biased one (divide by d, not d - 1), as in Ba et al. 2016 and F.layer_norm.
    """
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + eps) * weight + bias


class LayerNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))
        self.bias = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)

    def forward_reference(self, x: torch.Tensor) -> torch.Tensor:
        return layer_norm_reference(x, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019): no mean subtraction, no bias.

    Computed in fp32 and cast back, because the mean of squares overflows fp16 easily.
    """

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class OffsetRMSNorm(nn.Module):
    """RMSNorm with the scale written as 1 + w, w starting at 0 (Gemma): a freshly built layer is the identity
    scale, and weight decay pulls the scale toward 1 rather than 0.

    Unlike RMSNorm above, the scale multiplies in fp32 before the cast back (as Gemma's reference does), so in
    bf16 the two differ by one rounding.
    """

    def __init__(self, d: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.zeros(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x32 * (1.0 + self.weight.float())).to(x.dtype)


def make_norm(config, d: int | None = None) -> nn.Module:
    d = d or config.d_model
    if config.norm == "rmsnorm":
        return RMSNorm(d, config.norm_eps)
    if config.norm == "rmsnorm_offset":
        return OffsetRMSNorm(d, config.norm_eps)
    return LayerNorm(d, config.norm_eps)
