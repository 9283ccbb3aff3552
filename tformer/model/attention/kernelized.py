"""Kernelised attention: softmax(q·k) replaced by a feature map, phi(q)·phi(k), so the sum over keys
factorises and costs O(n) instead of O(n²) (Katharopoulos et al. 2020, "Transformers are RNNs").

    out_i = phi(q_i) (sum_j phi(k_j)^T v_j) / (phi(q_i) sum_j phi(k_j)^T)

Both sums ride one product: the values get a column of ones appended, v1 = [v | 1], so
S1 = phi(K)^T v1 (m, D+1) holds the numerator's matrix and, in its last column, the denominator's
vector z. Bidirectional attention is two matmuls. Causal attention needs the sums over j <= i only:
prefix sums, taken a chunk of ``block`` positions at a time (within a chunk an explicit C x C lower
triangle, across chunks the running S1), so memory stays chunk-sized, never n x m x D. Decoding keeps
the running sums as the state, (S (B, H, m, D), z (B, H, m)): O(1) work and memory per token.

Shapes: q (B, H, Tq, D); k, v (B, H_kv, Tk, D); features (B, H, T, m). Padding keys get phi = 0, so they
add nothing to either sum; a query with no key left (den = 0) gets output 0. No attention weights are
formed, so attention dropout does not apply.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tformer.model.attention.groups import expand_kv
from tformer.model.attention.kind import AttentionKind


def with_ones(v: torch.Tensor) -> torch.Tensor:
    """(..., T, D) -> (..., T, D+1): the last column sums the denominator alongside the numerator."""
    return torch.cat([v, v.new_ones(*v.shape[:-1], 1)], dim=-1)


def normalise(out1: torch.Tensor) -> torch.Tensor:
    """(..., D+1) numerator | denominator -> (..., D); a zero denominator (no key) gives 0, never NaN."""
    num, den = out1[..., :-1], out1[..., -1:]
    return num / torch.where(den > 0, den, torch.ones_like(den))


def bidirectional(qf: torch.Tensor, kf: torch.Tensor, v1: torch.Tensor) -> torch.Tensor:
    """Every query against every key: phi(Q) (phi(K)^T v1). Returns (B, H, Tq, D+1)."""
    return qf @ (kf.transpose(-2, -1) @ v1)


def causal(qf: torch.Tensor, kf: torch.Tensor, v1: torch.Tensor, s1: torch.Tensor | None, block: int,
           keep_state: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Query i against keys 0..i of this call plus the past summarised in ``s1`` (B, H, m, D+1) or None.

    Queries and keys are the same T positions. Chunk by chunk: the chunk's own lower triangle, explicit
    (C x C), plus the running sums of every earlier chunk. Returns ((B, H, T, D+1), the sums after the
    last position when ``keep_state``, else None: a forward pass without a cache skips that update)."""
    T = qf.shape[-2]
    outs = []
    for start in range(0, T, block):
        end = min(start + block, T)
        qc, kc, vc = qf[..., start:end, :], kf[..., start:end, :], v1[..., start:end, :]
        within = torch.tril(qc @ kc.transpose(-2, -1))  # (B, H, C, C): key j <= query i inside the chunk
        out = within @ vc
        if s1 is not None:
            out = out + qc @ s1
        if end < T or keep_state:
            update = kc.transpose(-2, -1) @ vc
            s1 = update if s1 is None else s1 + update
        outs.append(out)
    return torch.cat(outs, dim=-2), s1


def key_keep(mask, tk: int) -> torch.Tensor | None:
    """(B, 1, tk, 1) bool, True for a real key among the last ``tk`` the mask covers; None if none is padded."""
    if mask.keep is None:
        return None
    return mask.keep[:, -tk:].bool()[:, None, :, None]


class FeatureMapAttention(AttentionKind):
    """The shared body of linear attention and Performer; a subclass gives the feature maps, which take
    (B, H, T, D) to (B, H, T, m). Keys may carry extra state (Performer's stabiliser) after S and z."""

    def query_features(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        raise NotImplementedError

    def key_features(self, k, scale: float, past):
        """-> (features (B, H, T, m), the state's extra tensors, the factor that rescales the past sums or None)."""
        raise NotImplementedError

    def _prepare(self, q, k, v, mask, scale, past):
        H = q.shape[1]
        k, v = expand_kv(k, H), expand_kv(v, H)
        qf = self.query_features(q, scale)
        kf, extra, rescale = self.key_features(k, scale, past)
        keep = key_keep(mask, k.shape[-2])
        if keep is not None:
            kf = kf.masked_fill(~keep, 0.0)
        return qf, kf, with_ones(v), extra, rescale

    def forward(self, q, k, v, mask, scale: float, dropout_p: float = 0.0):
        Tq, Tk = q.shape[-2], k.shape[-2]
        if not mask.causal:
            qf, kf, v1, _, _ = self._prepare(q, k, v, mask, scale, None)
            return normalise(bidirectional(qf, kf, v1)), None
        if Tq < Tk:  # cached queries without a state: the earlier keys become the running sums first
            past = Tk - Tq
            _, state = self.step(q[..., :0, :], k[..., :past, :], v[..., :past, :], None, _Prefix(mask, past),
                                 scale, queries=False)
            out, _ = self.step(q, k[..., past:, :], v[..., past:, :], state, mask, scale, keep_state=False)
            return out, None
        out, _ = self.step(q, k, v, None, mask, scale, keep_state=False)
        return out, None

    def step(self, q, k, v, state, mask, scale: float, *, keep_state: bool = True, queries: bool = True):
        """Causal attention of q, k, v (the same T new positions) after the past summarised in ``state``
        ((S (B, H, m, D), z (B, H, m), *extra) or None). Returns (out (B, H, T, D), the new state)."""
        past = None if state is None else state[2:]
        qf, kf, v1, extra, rescale = self._prepare(q, k, v, mask, scale, past)
        s1 = None
        if state is not None:
            s1 = torch.cat([state[0], state[1][..., None]], dim=-1)
            if rescale is not None:
                s1 = s1 * rescale
        if not queries:  # summarise only
            update = kf.transpose(-2, -1) @ v1
            s1 = update if s1 is None else s1 + update
            return None, (s1[..., :-1], s1[..., -1], *extra)
        out1, s1 = causal(qf, kf, v1, s1, self.options.block, keep_state)
        new_state = None if s1 is None else (s1[..., :-1].contiguous(), s1[..., -1].contiguous(), *extra)
        return normalise(out1), new_state


class _Prefix:
    """The first ``n`` keys ``mask`` covers, as a mask of their own (its padding is all a kind reads)."""

    def __init__(self, mask, n: int):
        self.causal = mask.causal
        self.keep = None if mask.keep is None else mask.keep[:, :n]


class LinearAttention(FeatureMapAttention):
    """phi(x) = elu(x) + 1 on q and k as they come (the softmax scale does not enter: the kernel is not
    the exponential, and the normalisation by phi(q)·sum phi(k) fixes the weights' sum to one)."""

    def query_features(self, q, scale):
        return F.elu(q) + 1

    def key_features(self, k, scale, past):
        return F.elu(k) + 1, (), None
