"""Positional information, five ways.

Added to the embeddings: sinusoidal (Vaswani et al. 2017) and learned absolute (GPT-2, BERT, BART).
Applied inside attention: RoPE rotates queries and keys (Su et al. 2021); ALiBi (Press et al. 2021)
and T5's bucketed relative bias (Raffel et al. 2020) add a bias to the attention scores.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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
@dataclass(frozen=True)
class RopeScaling:
    """How RoPE reaches past the context it was trained at (the config's rope_* fields).

    kind: none, linear (positions / factor), ntk (theta * factor^(d/(d-2))), dynamic (theta grows
    with the sequence once it passes original_positions), yarn (per-frequency blend of the two
    plus a cos/sin scale) or llama3 (Llama 3.1's: slow frequencies / factor, fast ones kept, a blend
    between). Numbers follow Hugging Face's modeling_rope_utils, so imported
    ``rope_scaling`` checkpoints compute the same angles.
    """

    kind: str = "none"
    factor: float = 1.0
    original_positions: int = 2048
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0

    @classmethod
    def from_config(cls, config) -> "RopeScaling":
        # None means the model was trained at max_positions: HF's default for yarn, and what dynamic always uses.
        return cls(config.rope_scaling, config.rope_factor, config.rope_original_positions or config.max_positions,
                   config.rope_beta_fast, config.rope_beta_slow, config.rope_attention_factor,
                   config.rope_low_freq_factor, config.rope_high_freq_factor)


NO_SCALING = RopeScaling()


def yarn_attention_factor(factor: float) -> float:
    """YaRN's default cos/sin scale, 0.1 ln(factor) + 1: keeps attention entropy at longer context."""
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def _default_inv_freq(head_dim: int, theta, device) -> torch.Tensor:
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))


def _yarn_inv_freq(head_dim: int, theta: float, s: RopeScaling, device) -> torch.Tensor:
    """Frequencies that turn fewer than beta_slow times over the trained context are interpolated
    (divided by factor), those turning more than beta_fast times are kept, and a linear ramp blends between."""

    def feature(rotations: float) -> float:  # the pair index whose wavelength fits `rotations` times
        return head_dim * math.log(s.original_positions / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = max(math.floor(feature(s.beta_fast)), 0)
    high = min(math.ceil(feature(s.beta_slow)), head_dim - 1)
    if low == high:
        high += 0.001  # a one-step ramp, not a division by zero
    powers = theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    ramp = ((torch.arange(head_dim // 2, device=device, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp  # 1: extrapolate (original frequency), 0: interpolate
    return 1.0 / (s.factor * powers) * (1 - keep) + 1.0 / powers * keep


def llama3_freq_factors(head_dim: int, theta: float, s: RopeScaling) -> torch.Tensor:
    """What each of the head_dim/2 frequencies is divided by under llama3 scaling (head_dim/2,) float32: a wavelength
    longer than original / low_freq_factor turns too few times in the trained context to have learnt positions
    beyond it, so it is stretched by the whole factor; one shorter than original / high_freq_factor is kept (it
    encodes local order); between, 1 / divisor blends 1 / factor and 1 linearly in original / wavelength. (What
    llama.cpp's converter stores as rope_freqs.)"""
    wavelength = 2 * math.pi / _default_inv_freq(head_dim, theta, None).double()
    blend = ((s.original_positions / wavelength - s.low_freq_factor)
             / (s.high_freq_factor - s.low_freq_factor)).clamp(0, 1)  # 0: stretch, 1: keep
    return (1 / ((1 - blend) / s.factor + blend)).float()


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling = NO_SCALING, seq_len: int = 0,
                  device=None) -> tuple[torch.Tensor, float]:
    """(inverse frequencies (head_dim/2,) float32, cos/sin scale) for a sequence of ``seq_len`` positions.

    seq_len only matters for dynamic scaling (position ids 0 .. seq_len-1 in this forward).
    """
    kind, factor = scaling.kind, scaling.factor
    if kind == "linear":  # dividing the frequencies is dividing the positions
        return _default_inv_freq(head_dim, theta, device) / factor, 1.0
    if kind == "ntk":
        return _default_inv_freq(head_dim, theta * factor ** (head_dim / (head_dim - 2)), device), 1.0
    if kind == "dynamic" and seq_len > scaling.original_positions:
        # float32 like HF, which computes the new base from a tensor length
        n = torch.tensor(float(seq_len), dtype=torch.float32)
        grow = (factor * n / scaling.original_positions - (factor - 1)) ** (head_dim / (head_dim - 2))
        return _default_inv_freq(head_dim, (theta * grow).to(device), device), 1.0
    if kind == "llama3":
        divisor = llama3_freq_factors(head_dim, theta, scaling).to(device)
        return _default_inv_freq(head_dim, theta, device) / divisor, 1.0
    if kind == "yarn":
        scale = scaling.attention_factor if scaling.attention_factor is not None else yarn_attention_factor(factor)
        return _yarn_inv_freq(head_dim, theta, scaling, device), scale
    return _default_inv_freq(head_dim, theta, device), 1.0


def rope_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype,
                 scaling: RopeScaling = NO_SCALING):
    """cos and sin of each position's rotation angles, shaped (B, 1, T, head_dim) to broadcast over heads.

    Feature pair (i, i + head_dim/2) rotates by angle pos * theta^(-2i/head_dim): the "rotate half"
    layout used by GPT-NeoX and Hugging Face LLaMA checkpoints. Dynamic scaling reads the sequence
    length from the largest position id, as HF does: in cached decoding each new token's query and
    key use the base for the length so far, while cached keys keep the rotation they were stored with.
    """
    seq_len = int(position_ids.max()) + 1 if scaling.kind == "dynamic" and position_ids.numel() else 0
    inv_freq, scale = rope_inv_freq(head_dim, theta, scaling, seq_len, position_ids.device)
    angles = position_ids.float()[..., None] * inv_freq  # (B, T, head_dim/2)
    angles = torch.cat([angles, angles], dim=-1)  # (B, T, head_dim)
    cos, sin = angles.cos(), angles.sin()
    if scale != 1.0:
        cos, sin = cos * scale, sin * scale
    return cos.to(dtype)[:, None], sin.to(dtype)[:, None]


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
