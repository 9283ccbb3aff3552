"""Positional information, five ways.

Added to the embeddings: sinusoidal (Vaswani et al. 2017) and learned absolute (GPT-2, BERT, BART).
Applied inside attention: RoPE rotates queries and keys (Su et al. 2021); ALiBi (Press et al. 2021)
and T5's bucketed relative bias (Raffel et al. 2020) add a bias to the attention scores.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def sinusoidal_table(n_positions: int, d: int) -> torch.Tensor:
    """PE[pos, 2i] = sin(pos / 10000^(2i/d)), PE[pos, 2i+1] = cos(same). Shape (n_positions, d)."""
    pos = torch.arange(n_positions, dtype=torch.float32)[:, None]
    inv_freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(n_positions, d)
    table[:, 0::2] = torch.sin(pos * inv_freq)
    table[:, 1::2] = torch.cos(pos * inv_freq[: d // 2])
    return table


class SinusoidalPositions(nn.Module):
    """A fixed table (a buffer, not a parameter), looked up by position id."""

    def __init__(self, n_positions: int, d: int):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(n_positions, d), persistent=False)

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return self.table[position_ids]


class LearnedPositions(nn.Module):
    """A trained table; ``offset`` shifts every id (BART reserves the first two rows)."""

    def __init__(self, n_positions: int, d: int, offset: int = 0):
        super().__init__()
        self.offset = offset
        self.weight = nn.Parameter(torch.zeros(n_positions + offset, d))

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(position_ids + self.offset, self.weight)


# RoPE ---------------------------------------------------------------------------------
def rope_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype):
    """cos and sin of each position's rotation angles, shaped (B, 1, T, head_dim) to broadcast over heads.

    Feature pair (i, i + head_dim/2) rotates by angle pos * theta^(-2i/head_dim): the "rotate half"
    layout used by GPT-NeoX and Hugging Face LLaMA checkpoints.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim))
    angles = position_ids.float()[..., None] * inv_freq  # (B, T, head_dim/2)
    angles = torch.cat([angles, angles], dim=-1)  # (B, T, head_dim)
    return angles.cos().to(dtype)[:, None], angles.sin().to(dtype)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x: (B, H, T, head_dim) by the angles in cos/sin: (B, 1, T, head_dim)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


# ALiBi --------------------------------------------------------------------------------
def alibi_slopes(n_heads: int) -> torch.Tensor:
    """Head h gets slope 2^(-8h/n) for n a power of two; otherwise the paper's interleaving rule."""

    def powers(n: int) -> list[float]:
        start = 2 ** (-8 / n)
        return [start ** (i + 1) for i in range(n)]

    closest = 2 ** math.floor(math.log2(n_heads))
    slopes = powers(closest)
    if closest < n_heads:
        slopes += powers(2 * closest)[0::2][: n_heads - closest]
    return torch.tensor(slopes)


class ALiBi(nn.Module):
    def __init__(self, n_heads: int):
        super().__init__()
        self.register_buffer("slopes", alibi_slopes(n_heads), persistent=False)

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Bias -slope * |i - j|, shaped (1, H, Tq, Tk). Distances only, so padding offsets cancel."""
        distance = (q_pos[:, None] - k_pos[None, :]).abs().float()
        return -(self.slopes[:, None, None] * distance)[None]


# T5 relative position bias ------------------------------------------------------------
def relative_position_bucket(relative: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int):
    """Map key-minus-query offsets to buckets: exact for small offsets, log-spaced up to max_distance.

    Bidirectional (encoder) stacks spend half the buckets on keys after the query; causal
    (decoder) stacks only see keys at or before the query.
    """
    bucket = torch.zeros_like(relative)
    if bidirectional:
        num_buckets //= 2
        bucket = bucket + (relative > 0).long() * num_buckets
        distance = relative.abs()
    else:
        distance = (-relative).clamp(min=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    log_ratio = torch.log(distance.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).long()
    large = large.clamp(max=num_buckets - 1)
    return bucket + torch.where(is_small, distance, large)


class RelativePositionBias(nn.Module):
    """One learned scalar per (bucket, head), added to every layer's self-attention scores."""

    def __init__(self, num_buckets: int, max_distance: int, n_heads: int, bidirectional: bool):
        super().__init__()
        self.num_buckets, self.max_distance, self.bidirectional = num_buckets, max_distance, bidirectional
        self.weight = nn.Parameter(torch.zeros(num_buckets, n_heads))

    def forward(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        relative = k_pos[None, :] - q_pos[:, None]  # (Tq, Tk)
        buckets = relative_position_bucket(relative, self.bidirectional, self.num_buckets, self.max_distance)
        return nn.functional.embedding(buckets, self.weight).permute(2, 0, 1)[None]  # (1, H, Tq, Tk)
