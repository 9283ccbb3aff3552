"""Reformer's LSH attention (Kitaev et al. 2020): hash, sort, attend inside chunks of the sorted order.

Angular LSH: a vector's bucket is argmax([xR; -xR]) for a random Gaussian R (D, b/2), b buckets, so
vectors at a small angle tend to share one. Reformer shares one projection between queries and keys
(k = q / |q|); here q and k have projections of their own, so both are normalised to unit length and
hashed with the same rotations: a query lands where the keys it would score highly tend to land.

Per hash round (``options.hashes``, each with its own rotations): queries sorted by (bucket, position),
keys sorted the same way, both cut into chunks of ``options.block``; query chunk c attends to key chunks
c and c-1 of the sorted order (a causal stack hides keys after the query by original position). Every
query also attends to its own key, once: with separate q and k nothing makes q_i·k_i special, so
Reformer's rule (no self unless nothing else) is replaced by one that leaves no query without a key,
even at the start of a causal sequence. Rounds combine by their log-sum-exp weights, which is a softmax
over every (round, key) pair a query met: a key met in two rounds counts twice.

b = ceil(n / block) rounded up to even (tformer.cost.attention_approx.lsh_buckets); R is drawn once per
layer from (attn_seed, layer) for the buckets max_positions needs (a non-persistent buffer), and an
input of n tokens uses its first b/2 columns. With one chunk (block >= n) every query sees every key:
exact attention.

Decoding (queries after cached keys, Tq < Tk) cannot sort a sequence it only sees one token of: a new
query attends to every allowed key that shares its bucket in some round (counted per round, as above),
plus itself. Padding keys are never attended; a query with no key gets output 0. No attention dropout.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tformer.core.attention_kinds import AttnOptions
from tformer.cost.attention_approx import lsh_buckets
from tformer.model.attention.groups import expand_kv
from tformer.model.attention.kind import AttentionKind
from tformer.model.attention.performer import layer_generator


class LSHAttention(AttentionKind):
    """rotations: (hashes, D, max_buckets / 2), fixed by (attn_seed, layer)."""

    def __init__(self, options: AttnOptions, n_heads: int, head_dim: int):
        super().__init__(options, n_heads, head_dim)
        half = lsh_buckets(options.max_positions, options.block, options.max_positions) // 2
        r = torch.randn(options.hashes, head_dim, half, generator=layer_generator(options), device="cpu")
        self.register_buffer("rotations", r.to(torch.empty(0).device), persistent=False)

    def buckets(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """(B, H, T, D) -> (B, H, T, hashes) bucket ids in [0, b) for an input of n keys."""
        half = lsh_buckets(n, self.options.block, self.options.max_positions) // 2
        r = self.rotations[:, :, :half].to(x.dtype)  # (hashes, D, half)
        hashes, D = r.shape[0], r.shape[1]
        with torch.no_grad():  # argmax passes no gradient: the hash is not part of the graph
            rotated = F.normalize(x, dim=-1) @ r.permute(1, 0, 2).reshape(D, hashes * half)
            rotated = rotated.view(*x.shape[:-1], hashes, half)
            return torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1)

    def forward(self, q, k, v, mask, scale: float, dropout_p: float = 0.0):
        H = q.shape[1]
        k, v = expand_kv(k, H), expand_kv(v, H)
        n = k.shape[-2]
        hq, hk = self.buckets(q, n), self.buckets(k, n)
        if q.shape[-2] == n and mask.q_start == mask.k_start:
            return self._sorted(q, k, v, hq, hk, mask, scale), None
        return self._decode(q, k, v, hq, hk, mask, scale), None

    def _sorted(self, q, k, v, hq, hk, mask, scale):
        """The whole sequence: sort, chunk, attend to own and previous chunk, combine rounds."""
        B, H, T, D = q.shape
        C = self.options.block
        nc = math.ceil(T / C)
        pos = torch.arange(T, device=q.device)
        # (B, H, r, T): each round's order of positions by (bucket, position)
        q_order = (hq.transpose(-1, -2) * T + pos).argsort(dim=-1)
        k_order = (hk.transpose(-1, -2) * T + pos).argsort(dim=-1)
        R = q_order.shape[2]

        def chunks(x, order, fill):
            """Gather x (B, H, T, ...) in ``order`` (B, H, r, T), pad to nc·C, cut into (B, H, r, nc, C, ...)."""
            extra = x.shape[3:]
            idx = order.reshape(B, H, R * T, *([1] * len(extra))).expand(B, H, R * T, *extra)
            g = x.gather(2, idx).view(B, H, R, T, *extra)
            g = F.pad(g, (*([0, 0] * len(extra)), 0, nc * C - T), value=fill)
            return g.view(B, H, R, nc, C, *extra)

        def with_previous(x):
            """(B, H, r, nc, C, ...) -> (B, H, r, nc, 2C, ...): each chunk, then the one before it."""
            return torch.cat([x, x.roll(1, dims=3)], dim=4)

        qc = chunks(q, q_order, 0.0)
        q_pos = chunks(pos.expand(B, H, T), q_order, -1)  # -1: a padded slot
        kc, vc = with_previous(chunks(k, k_order, 0.0)), with_previous(chunks(v, k_order, 0.0))
        k_pos = chunks(pos.expand(B, H, T), k_order, -1)
        first = torch.zeros(nc, 2 * C, dtype=torch.bool, device=q.device)
        first[0, C:] = True  # chunk 0 has no previous chunk
        k_pos = with_previous(k_pos).masked_fill(first[:, :], -1)
        scores = (qc @ kc.transpose(-2, -1)) * scale  # (B, H, r, nc, C, 2C)
        qp, kp = q_pos[..., :, None], k_pos[..., None, :]
        allowed = (kp >= 0) & (qp >= 0) & (kp != qp)
        if mask.causal:
            allowed &= kp <= qp
        keep = mask.keep.bool() if mask.keep is not None else None
        if keep is not None:
            allowed &= keep[:, None, None, None, None, :].expand(B, H, R, nc, C, T).gather(
                -1, kp.clamp(min=0).expand(B, H, R, nc, C, 2 * C))
        # Each query's own key: one extra column.
        own = (q * k).sum(-1) * scale  # (B, H, T)
        own_c = chunks(own[..., None], q_order, 0.0)  # (B, H, r, nc, C, 1)
        own_ok = q_pos[..., None] >= 0
        if keep is not None:
            own_ok &= keep[:, None, None, None, None, :].expand(B, H, R, nc, C, T).gather(
                -1, q_pos.clamp(min=0)[..., None])
        scores = torch.cat([scores, own_c], dim=-1).masked_fill(~torch.cat([allowed, own_ok], dim=-1), float("-inf"))
        lse = torch.logsumexp(scores, dim=-1, keepdim=True)  # (B, H, r, nc, C, 1)
        dead = torch.isinf(lse)
        weights = torch.exp(scores - lse.masked_fill(dead, 0.0))
        v_own = chunks(v, q_order, 0.0)
        out = weights[..., :-1] @ vc + weights[..., -1:] * v_own  # (B, H, r, nc, C, D)
        # Back to original positions, then the rounds' log-sum-exp weights.
        out = out.view(B, H, R, nc * C, D)[:, :, :, :T]
        lse = lse.view(B, H, R, nc * C)[:, :, :, :T]
        back = q_order.argsort(dim=-1)
        out = out.gather(3, back[..., None].expand(B, H, R, T, D))
        lse = lse.gather(3, back)
        total = torch.logsumexp(lse, dim=2, keepdim=True)
        share = torch.exp(lse - total.masked_fill(torch.isinf(total), 0.0))  # 0 for dead rounds and rows
        return (share[..., None] * out).sum(dim=2)

    def _decode(self, q, k, v, hq, hk, mask, scale):
        """Queries after cached keys: every allowed key in the query's bucket, per round, plus itself."""
        scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, Tq, Tk)
        count = (hq[:, :, :, None, :] == hk[:, :, None, :, :]).sum(-1).to(q.dtype)  # rounds in which they meet
        q_pos, _ = mask.positions()
        own = (q_pos - mask.k_start)[:, None] == torch.arange(k.shape[-2], device=q.device)[None, :]
        count = torch.where(own, float(hq.shape[-1]), count)
        allowed = count > 0
        rule = mask.allowed()
        if rule is not None:
            allowed = allowed & rule
        scores = (scores + count.clamp(min=1).log()).masked_fill(~allowed, float("-inf"))
        dead = ~allowed.any(dim=-1, keepdim=True)
        weights = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
        return weights @ v

    def extra_repr(self) -> str:
        return f"block={self.options.block}, hashes={self.options.hashes}"
