"""Tiled attention: FlashAttention's algorithm (Dao et al. 2022; FlashAttention-2, Dao 2023) written in
PyTorch as a teaching path. Exact softmax(Q K^T * scale + bias) V; the (Tq, Tk) matrix never exists.

Forward. Queries are cut into blocks of ``block`` rows and keys/values into blocks of ``block`` rows.
For one query block, the key blocks stream past and three running quantities are kept per query row:
  m  the largest score seen so far          (softmax is shift-invariant: exp(s - m) never overflows)
  l  the sum of exp(s - m) seen so far      (the softmax's denominator)
  o  the sum of exp(s - m) v seen so far    (the numerator, a (rows, D) block)
When a new key block raises the max from m to m', everything accumulated so far was scaled by
exp(-m) and must be rescaled by alpha = exp(m - m'): l <- l * alpha + rowsum(p), o <- o * alpha + p V.
After the last key block, out = o / l. Under a causal mask a key block lying wholly after the
block's last query is skipped; the diagonal block is computed in full and masked.

Backward (FlashAttention-2). The forward keeps only the output O and, per query row, the fp32
log-sum-exp L = m + log l: O(n) memory, not O(n^2). The backward recomputes each block's scores S
and probabilities P = exp(S - L) (exact: L is the row's normaliser), then
  dV += P^T dO,   dP = dO V^T,   dS = P * (dP - rowsum(dO * O)),   dQ += dS K * scale,   dK += dS^T Q * scale
(rowsum(dO * O) = rowsum(P * dP): the softmax backward's correction, computed once per row). The
recompute costs one extra Q K^T product per block pair: the price of not storing P.

Dropout follows FlashAttention: each block's keep-mask is drawn from a generator seeded from the
call's seed and the block's indices, so the backward redraws the very same mask without storing it.

A query with no allowed key (left padding under a causal mask) gets l = 0: its output is 0 and its
L is +inf, so the backward's P is 0 there and every gradient stays finite.

Grouped-query attention never copies K and V per query head: the g = H / H_kv query heads sharing a
key/value head are folded into the rows of one product, (B, H_kv, g * rows, D) @ (B, H_kv, D, cols).
"""

from __future__ import annotations

import torch

from tformer.core.errors import TformerError
from tformer.model.attention.kind import AttentionKind
from tformer.model.masks import AttentionMask

SEED_RANGE = 2 ** 62


def fold_heads(x: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """(B, H, T, D) -> (B, H_kv, g, T, D), g = H / H_kv: query head j * g + i serves key/value head j."""
    B, H, T, D = x.shape
    return x.view(B, kv_heads, H // kv_heads, T, D)


def fold_bias(bias: torch.Tensor | None, kv_heads: int) -> torch.Tensor | None:
    """A position bias (B|1, H|1, Tq, Tk) -> (B|1, H_kv|1, g|1, Tq, Tk), heads laid out as ``fold_heads``."""
    if bias is None:
        return None
    b, h, tq, tk = bias.shape
    return bias.view(b, 1, 1, tq, tk) if h == 1 else bias.view(b, kv_heads, h // kv_heads, tq, tk)


def block_allowed(mask: AttentionMask, q0: int, q1: int, k0: int, k1: int) -> torch.Tensor | None:
    """Padding + causality of queries q0..q1-1 against keys k0..k1-1: (B|1, 1, 1, bq, bk) bool, or None."""
    q_pos = torch.arange(mask.q_start + q0, mask.q_start + q1, device=mask.device)
    allowed = mask.allowed(q_pos, torch.arange(k0, k1, device=mask.device))
    return None if allowed is None else allowed[:, :, None]


def key_stop(mask: AttentionMask, q1: int) -> int:
    """Keys any of queries 0..q1-1 may see: under a causal mask, none after the last query's position."""
    if not mask.causal:
        return mask.tk
    return max(0, min(mask.tk, mask.q_start + q1 - mask.k_start))


def sum_to(t: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Sum ``t`` over the dimensions where ``shape`` broadcast (size 1): the gradient of a broadcast."""
    dims = [i for i, (want, have) in enumerate(zip(shape, t.shape)) if want == 1 and have != 1]
    return t.sum(dims, keepdim=True) if dims else t


class _Blocks:
    """The shared pieces of one call: folded tensors, the mask, and how to (re)compute one block's scores."""

    def __init__(self, q5, k, v, bias5, mask: AttentionMask, scale: float, block: int, dropout_p: float, seed: int):
        self.q5, self.k, self.v, self.bias5, self.mask = q5, k, v, bias5, mask
        self.scale, self.block, self.dropout_p, self.seed = scale, block, dropout_p, seed
        B, self.kv, self.g, self.tq, self.d = q5.shape
        self.batch, self.tk = B, k.shape[2]
        self.acc = torch.promote_types(q5.dtype, torch.float32)  # fp32 accumulation (fp64 inputs stay fp64)

    def query_blocks(self):
        for q0 in range(0, self.tq, self.block):
            yield q0, min(q0 + self.block, self.tq)

    def key_blocks(self, q1: int):
        for k0 in range(0, key_stop(self.mask, q1), self.block):
            yield k0, min(k0 + self.block, self.tk)

    def rows(self, x5: torch.Tensor, q0: int, q1: int) -> torch.Tensor:
        """Rows q0..q1 of a folded (B, H_kv, g, T, ...) tensor as (B, H_kv, g * bq, ...)."""
        part = x5[:, :, :, q0:q1]
        return part.reshape(self.batch, self.kv, self.g * (q1 - q0), *part.shape[4:])

    def zeros(self, shape) -> torch.Tensor:
        return torch.zeros(shape, dtype=self.acc, device=self.k.device)

    def scores(self, qb, q0, q1, k0, k1) -> torch.Tensor:
        """(B, H_kv, g * bq, bk) in the accumulation dtype: Q_i K_j^T * scale + bias, -inf where a key is hidden."""
        s = torch.matmul(qb, self.k[:, :, k0:k1].transpose(-2, -1)).to(self.acc) * self.scale
        s5 = s.view(self.batch, self.kv, self.g, q1 - q0, k1 - k0)
        if self.bias5 is not None:
            s5 = s5 + self.bias5[..., q0:q1, k0:k1].to(self.acc)
        allowed = block_allowed(self.mask, q0, q1, k0, k1)
        if allowed is not None:
            s5 = s5.masked_fill(~allowed, float("-inf"))
        return s5.reshape(s.shape)

    def keep(self, p: torch.Tensor, q0: int, k0: int) -> torch.Tensor | None:
        """Dropout's scaled keep-mask for block (q0, k0), redrawn identically in the backward; None without dropout."""
        if self.dropout_p == 0.0:
            return None
        gen = torch.Generator(device=p.device)
        gen.manual_seed((self.seed + q0 * (self.tk + 1) + k0) % SEED_RANGE)
        kept = torch.rand(p.shape, generator=gen, dtype=torch.float32, device=p.device) >= self.dropout_p
        return kept.to(p.dtype) / (1.0 - self.dropout_p)


def _forward(blocks: _Blocks, out5: torch.Tensor, lse: torch.Tensor) -> None:
    """Fill out5 (B, H_kv, g, Tq, D) and lse (B, H_kv, g, Tq) fp32, one query block at a time."""
    v = blocks.v
    for q0, q1 in blocks.query_blocks():
        qb = blocks.rows(blocks.q5, q0, q1)  # (B, H_kv, g * bq, D)
        m = blocks.zeros(qb.shape[:-1]).fill_(float("-inf"))  # running row max
        l = blocks.zeros(qb.shape[:-1])  # running row sum of exp(s - m)
        acc = blocks.zeros(qb.shape)  # running sum of exp(s - m) V
        for k0, k1 in blocks.key_blocks(q1):
            s = blocks.scores(qb, q0, q1, k0, k1)
            m_new = torch.maximum(m, s.amax(dim=-1))
            # A row with no allowed key yet has max -inf: shift by 0 so exp() gives 0, not NaN.
            shift = m_new.masked_fill(m_new == float("-inf"), 0.0)
            p = torch.exp(s - shift[..., None])
            alpha = torch.exp(m - shift)  # rescales what was accumulated under the old max
            l = l * alpha + p.sum(dim=-1)  # the denominator counts every probability, dropped or not
            keep = blocks.keep(p, q0, k0)
            pv = p if keep is None else p * keep
            acc = acc * alpha[..., None] + torch.matmul(pv.to(v.dtype), v[:, :, k0:k1]).to(blocks.acc)
            m = m_new
        live = l > 0
        shape = (blocks.batch, blocks.kv, blocks.g, q1 - q0)
        out5[:, :, :, q0:q1] = (acc / torch.where(live, l, 1.0)[..., None]).view(*shape, -1).to(out5.dtype)
        shift = m.masked_fill(~live, 0.0)
        lse[:, :, :, q0:q1] = torch.where(live, shift + torch.log(torch.where(live, l, 1.0)), float("inf")).view(shape)


def _backward(blocks: _Blocks, out5, lse, dout5, want_bias: bool):
    """FlashAttention-2's backward: (dq5, dk, dv, dbias5 or None) in the accumulation dtype, recomputing P
    block by block."""
    k, v, acc = blocks.k, blocks.v, blocks.acc
    delta = (dout5.to(acc) * out5.to(acc)).sum(dim=-1)  # (B, H_kv, g, Tq): rowsum(dO * O) = rowsum(P * dP)
    dq5, dk, dv = blocks.zeros(blocks.q5.shape), blocks.zeros(k.shape), blocks.zeros(v.shape)
    dbias5 = blocks.zeros(blocks.bias5.shape) if want_bias else None
    for q0, q1 in blocks.query_blocks():
        qb, dob = blocks.rows(blocks.q5, q0, q1), blocks.rows(dout5, q0, q1)
        lse_b, delta_b = blocks.rows(lse[..., None], q0, q1), blocks.rows(delta[..., None], q0, q1)  # (.., g*bq, 1)
        dqb = blocks.zeros(qb.shape)
        for k0, k1 in blocks.key_blocks(q1):
            kb, vb = k[:, :, k0:k1], v[:, :, k0:k1]
            p = torch.exp(blocks.scores(qb, q0, q1, k0, k1) - lse_b)  # the forward's probabilities, exactly
            keep = blocks.keep(p, q0, k0)
            pv = p if keep is None else p * keep
            dv[:, :, k0:k1] += torch.matmul(pv.to(v.dtype).transpose(-2, -1), dob).to(acc)
            dp = torch.matmul(dob, vb.transpose(-2, -1)).to(acc)
            if keep is not None:
                dp = dp * keep
            ds = p * (dp - delta_b)  # the gradient of the scaled, biased scores
            if dbias5 is not None:
                ds5 = ds.view(blocks.batch, blocks.kv, blocks.g, q1 - q0, k1 - k0)
                dbias5[..., q0:q1, k0:k1] += sum_to(ds5, dbias5.shape)
            ds = (ds * blocks.scale).to(k.dtype)
            dqb += torch.matmul(ds, kb).to(acc)
            dk[:, :, k0:k1] += torch.matmul(ds.transpose(-2, -1), qb).to(acc)
        dq5[:, :, :, q0:q1] = dqb.view(blocks.batch, blocks.kv, blocks.g, q1 - q0, -1)
    return dq5, dk, dv, dbias5


class TiledAttention(torch.autograd.Function):
    """Keeps O and the fp32 log-sum-exp for the backward, never the probabilities."""

    @staticmethod
    def forward(ctx, q, k, v, bias, mask, scale, block, dropout_p, seed):
        blocks = _Blocks(fold_heads(q, k.shape[1]), k, v, fold_bias(bias, k.shape[1]), mask, scale, block,
                         dropout_p, seed)
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        lse = torch.empty(blocks.q5.shape[:-1], dtype=blocks.acc, device=q.device)  # fp32 (fp64 for fp64 inputs)
        _forward(blocks, fold_heads(out, k.shape[1]), lse)
        ctx.save_for_backward(q, k, v, bias, out, lse)
        ctx.settings = (mask, scale, block, dropout_p, seed)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, bias, out, lse = ctx.saved_tensors
        kv = k.shape[1]
        blocks = _Blocks(fold_heads(q, kv), k, v, fold_bias(bias, kv), *ctx.settings)
        want_bias = bias is not None and ctx.needs_input_grad[3]
        dq5, dk, dv, dbias5 = _backward(blocks, fold_heads(out, kv), lse, fold_heads(dout.contiguous(), kv), want_bias)
        dbias = dbias5.view(bias.shape).to(bias.dtype) if want_bias else None
        return dq5.view(q.shape).to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), dbias, None, None, None, None, None


def tiled_attention(q, k, v, mask: AttentionMask, scale: float, dropout_p: float = 0.0, block: int = 64):
    """Exact attention, ``block`` queries against ``block`` keys at a time (the module docstring says how).

    q (B, H, Tq, D); k, v (B, H_kv, Tk, D), H_kv dividing H; mask: padding (keep), causality, queries
    offset (q_start), position bias (B|1, H|1, Tq, Tk), which also gets its gradient when it needs one.
    Returns (out (B, H, Tq, D), None): the weights are never formed.
    """
    if block < 1:
        raise TformerError(f"tiled attention needs a block of at least 1 token, got {block}; set attn_block")
    if not 0.0 <= dropout_p < 1.0:
        raise TformerError(f"attention dropout must be in [0, 1), got {dropout_p}; set attention_dropout")
    # The per-block dropout masks derive from one seed drawn here: torch.manual_seed fixes them.
    seed = int(torch.randint(0, SEED_RANGE, (1,)).item()) if dropout_p > 0 else 0
    out = TiledAttention.apply(q, k, v, mask.position_bias, mask, scale, block, dropout_p, seed)
    return out, None


class Tiled(AttentionKind):
    """The "tiled" kind: ``tiled_attention`` with the layer's ``attn_block`` as the tile size."""

    def forward(self, q, k, v, mask, scale: float, dropout_p: float = 0.0):
        return tiled_attention(q, k, v, mask, scale, dropout_p, block=self.options.block)
