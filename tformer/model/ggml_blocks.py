"""ggml's block formats decoded with torch: a (blocks, bytes per block) uint8 view -> fp32 values, in the
order and arithmetic of ggml's reference dequantizers (ggml-quants.c ``dequantize_row_*``, mirrored by
gguf-py's ``gguf.quants``), so every finite block decodes bit-identically to theirs. Used by the file reader
(tformer.interop.gguf_quants, which widens fp16 keeping NaN payloads as numpy does) and by the Linears that keep
a file's K-quant blocks in memory (tformer.model.kquant_linear, which widens plainly: no host read, so a compiled
graph holds it). Each type is a handful of vectorised ops: no Python loop over blocks.

Block layouts (``d``, ``m``, ``dmin`` fp16; value j of the block; q a small unsigned integer):

    Q4_0  d, qs[16]                      q = nibble (low nibbles: j 0-15, high: 16-31);  d * (q - 8)
    Q4_1  d, m, qs[16]                   as Q4_0;                                         d * q + m
    Q5_0  d, qh u32, qs[16]              q = nibble | bit j of qh << 4;                   d * (q - 16)
    Q5_1  d, m, qh u32, qs[16]           as Q5_0;                                         d * q + m
    Q8_0  d, qs int8[32]                                                                   d * q
    Q4_K  d, dmin, scales[12], qs[128]   8 sub-blocks of 32 with 6-bit (sc, mn) each; qs in 4 chunks of 32
                                         bytes, low nibbles sub-block 2c, high 2c+1;      (d*sc) * q - (dmin*mn)
    Q5_K  d, dmin, scales[12], qh[32], qs[128]  as Q4_K, plus bit s of qh[l] as bit 4 of sub-block s's l-th
    Q6_K  ql[128], qh[64], scales int8[16], d   16 sub-blocks of 16, q 6 bits - 32;  (d*sc) * q
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Widen = Callable[[torch.Tensor], torch.Tensor]  # fp16 (blocks, 1) -> fp32


def plain_widen(halves: torch.Tensor) -> torch.Tensor:
    return halves.float()


def _fp16(blocks: torch.Tensor, start: int, widen: Widen) -> torch.Tensor:
    """The fp16 at byte ``start`` of each block as fp32, shape (blocks, 1)."""
    return widen(blocks[:, start:start + 2].contiguous().view(torch.float16))


def _shift(x: torch.Tensor, n: int) -> torch.Tensor:
    # x >> n with n as a uint8 tensor: torch's uint8 shift by a Python int takes a slow path (several times slower)
    return x >> torch.tensor([n], dtype=torch.uint8, device=x.device) if n else x


def nibbles(qs: torch.Tensor) -> torch.Tensor:
    """(..., n) bytes -> (..., 2n) values: the low nibbles, then the high ones."""
    return torch.cat([qs & 0x0F, _shift(qs, 4)], dim=-1)


def _bits(packed: torch.Tensor, width: int) -> torch.Tensor:
    """(blocks, n) bytes -> (blocks, 8 // width, n): field s of byte l is bits s*width .. s*width+width-1."""
    mask = (1 << width) - 1
    return torch.stack([_shift(packed, s) & mask for s in range(0, 8, width)], dim=1)


def _qh_bits(qh: torch.Tensor) -> torch.Tensor:
    """Q5_0/Q5_1's qh (blocks, 4) bytes, a little-endian u32 -> (blocks, 32) bits: bit j is value j's 5th bit."""
    return torch.stack([_shift(qh, s) & 1 for s in range(8)], dim=2).flatten(1)


def _k_scales(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 scale bytes -> 8 six-bit scales and 8 six-bit mins (ggml's get_scale_min_k4): sub-blocks
    0-3 keep bytes 0-3 / 4-7 (low 6 bits); 4-7 take a nibble of bytes 8-11 and the top 2 bits of 0-3 / 4-7."""
    lo, hi, mixed = scales[:, 0:4], scales[:, 4:8], scales[:, 8:12]
    sc = torch.cat([lo & 0x3F, (mixed & 0x0F) | ((lo >> 2) & 0x30)], dim=1)
    mn = torch.cat([hi & 0x3F, (mixed >> 4) | ((hi >> 2) & 0x30)], dim=1)
    return sc, mn


def _q4_0(b: torch.Tensor, widen: Widen) -> torch.Tensor:
    d = _fp16(b, 0, widen)
    q = nibbles(b[:, 2:18]).to(torch.int8) - 8
    return d * q.float()


def _q4_1(b: torch.Tensor, widen: Widen) -> torch.Tensor:
    d, m = _fp16(b, 0, widen), _fp16(b, 2, widen)
    q = nibbles(b[:, 4:20]).float()
    return d * q + m


def q5_parts(b: torch.Tensor, with_min: bool, widen: Widen = plain_widen):
    """Q5_0/Q5_1 blocks -> q (blocks, 32) uint8 0..31, d (blocks, 1) and, for Q5_1, m (blocks, 1)."""
    at = 4 if with_min else 2
    q = nibbles(b[:, at + 4:at + 20]) | (_qh_bits(b[:, at:at + 4]) * 16)
    return (q, _fp16(b, 0, widen)) + ((_fp16(b, 2, widen),) if with_min else ())


def _q5(b: torch.Tensor, with_min: bool, widen: Widen) -> torch.Tensor:
    if with_min:
        q, d, m = q5_parts(b, True, widen)
        return d * q.float() + m
    q, d = q5_parts(b, False, widen)
    return d * (q.to(torch.int8) - 16).float()


def _q8_0(b: torch.Tensor, widen: Widen) -> torch.Tensor:
    d = _fp16(b, 0, widen)
    return b[:, 2:34].contiguous().view(torch.int8).float() * d


def k_quant_parts(b: torch.Tensor, high_bits: bool, widen: Widen = plain_widen):
    """Q4_K (or, with ``high_bits``, Q5_K) blocks -> q (blocks, 8, 32) uint8, each sub-block's scale d*sc and
    offset dmin*mn (blocks, 8, 1) fp32: value = scale * q - offset."""
    n = b.shape[0]
    d, dmin = _fp16(b, 0, widen), _fp16(b, 2, widen)
    sc, mn = _k_scales(b[:, 4:16])
    qs = b[:, 48:176] if high_bits else b[:, 16:144]
    q = nibbles(qs.reshape(n, 4, 32)).view(n, 8, 32)
    if high_bits:
        q = q | (_bits(b[:, 16:48], 1) * 16)
    return q, (d * sc.float()).view(n, 8, 1), (dmin * mn.float()).view(n, 8, 1)


def _k_quant(b: torch.Tensor, high_bits: bool, widen: Widen) -> torch.Tensor:
    q, scale, offset = k_quant_parts(b, high_bits, widen)
    return (scale * q.float() - offset).view(b.shape[0], 256)


def q6_k_parts(b: torch.Tensor, widen: Widen = plain_widen) -> tuple[torch.Tensor, torch.Tensor]:
    """Q6_K blocks -> q (blocks, 16, 16) uint8 0..63 and each sub-block's scale d*sc (blocks, 16, 1) fp32:
    value = scale * (q - 32)."""
    n = b.shape[0]
    d = _fp16(b, 208, widen)
    scale = (d * b[:, 192:208].contiguous().view(torch.int8).float()).view(n, 16, 1)
    low = nibbles(b[:, 0:128].reshape(n, 2, 64)).view(n, 8, 32)  # per 128 values: low nibbles, high nibbles
    high = _bits(b[:, 128:192].reshape(n * 2, 32), 2).reshape(n, 8, 32)  # per 128: 2-bit fields 0..3
    return (low | (high * 16)).view(n, 16, 16), scale


def _q6_k(b: torch.Tensor, widen: Widen) -> torch.Tensor:
    q, scale = q6_k_parts(b, widen)
    return (scale * (q.to(torch.int8) - 32).float()).view(b.shape[0], 256)


DECODERS: dict[str, Callable[[torch.Tensor, Widen], torch.Tensor]] = {
    "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": lambda b, w: _q5(b, False, w), "Q5_1": lambda b, w: _q5(b, True, w),
    "Q8_0": _q8_0, "Q4_K": lambda b, w: _k_quant(b, False, w), "Q5_K": lambda b, w: _k_quant(b, True, w),
    "Q6_K": _q6_k,
}


def decode(blocks: torch.Tensor, ggml_type: str, widen: Widen = plain_widen) -> torch.Tensor:
    """(blocks, bytes per block) uint8 -> (blocks, values per block) fp32."""
    return DECODERS[ggml_type](blocks, widen)


__all__ = ["DECODERS", "decode", "k_quant_parts", "nibbles", "plain_widen", "q5_parts", "q6_k_parts"]
