"""Performer's FAVOR+ (Choromanski et al. 2021): positive orthogonal random features whose inner
product estimates the softmax kernel, exp(q·k) = E_w[phi(q)·phi(k)], so attention costs O(n · m).

    phi(x) = exp(W x - |x|²/2) / sqrt(m),   x = q · scale^(1/2) or k · scale^(1/2)

W (m, D): blocks of D orthonormal rows (the Q of a Gaussian matrix's QR), each row rescaled by an
independent chi(D) length (the norm of a Gaussian D-vector), so every row is marginally Gaussian
while rows inside a block are exactly orthogonal: lower variance than i.i.d. rows (the paper's
section 2.4). Drawn once per layer from (attn_seed, layer), kept as a non-persistent buffer: it is
not in the state dict and rebuilding the model redraws the same W.

Stabilisation (exp overflows): a query's features are divided by exp of their own max over the m
features (a per-query factor: it cancels between numerator and denominator); the keys' by exp of
the max over every key and feature of the call (a per-(batch, head) factor c that cancels likewise).
Decoding keeps c in the state and, when a new key raises it, rescales the running sums by
exp(c_old - c_new), the online-softmax trick, so S and z never overflow.
"""

from __future__ import annotations

import math

import torch

from tformer.core.attention_kinds import AttnOptions
from tformer.model.attention.kernelized import FeatureMapAttention


def layer_generator(options: AttnOptions) -> torch.Generator:
    """A CPU generator fixed by the config's attn_seed and the layer index (each layer draws its own)."""
    return torch.Generator(device="cpu").manual_seed(options.seed * 1_000_003 + options.layer)


def orthogonal_features(m: int, d: int, generator: torch.Generator) -> torch.Tensor:
    """(m, d): ceil(m / d) blocks of d orthonormal rows (the last block cut to fit), each row scaled by
    a chi(d)-distributed length."""
    blocks = []
    for _ in range(math.ceil(m / d)):
        gaussian = torch.randn(d, d, generator=generator, device="cpu")
        q, r = torch.linalg.qr(gaussian)  # orthonormal columns
        # Signs fixed by R's diagonal: only then is Q uniform over rotations (Haar), so each row's
        # direction is uniform on the sphere and the kernel estimate unbiased.
        blocks.append((q * torch.sign(torch.diagonal(r))).T)
    directions = torch.cat(blocks)[:m]
    lengths = torch.randn(m, d, generator=generator, device="cpu").norm(dim=1)
    return directions * lengths[:, None]


class Performer(FeatureMapAttention):
    """FAVOR+ with ``options.features`` positive orthogonal random features, bidirectional or causal."""

    def __init__(self, options: AttnOptions, n_heads: int, head_dim: int):
        super().__init__(options, n_heads, head_dim)
        w = orthogonal_features(options.features, head_dim, layer_generator(options))
        here = torch.empty(0).device  # the device the model is being built on (build's device context)
        self.register_buffer("features", w.to(here), persistent=False)

    def _logits(self, x: torch.Tensor, scale: float) -> torch.Tensor:
        """W x - |x|²/2 for x scaled by scale^(1/2): (B, H, T, D) -> (B, H, T, m)."""
        x = x * math.sqrt(scale)
        return x @ self.features.to(x.dtype).T - (x * x).sum(-1, keepdim=True) / 2

    def query_features(self, q, scale):
        logits = self._logits(q, scale)
        m = logits.shape[-1]
        return torch.exp(logits - logits.amax(dim=-1, keepdim=True)) / math.sqrt(m)

    def key_features(self, k, scale, past):
        logits = self._logits(k, scale)
        m = logits.shape[-1]
        c = logits.amax(dim=(-2, -1))  # (B, H)
        rescale = None
        if past:
            c_old = past[0]
            c = torch.maximum(c, c_old)
            rescale = torch.exp(c_old - c)[..., None, None]
        kf = torch.exp(logits - c[..., None, None]) / math.sqrt(m)
        return kf, (c,), rescale

    def extra_repr(self) -> str:
        return f"features={self.options.features}"
