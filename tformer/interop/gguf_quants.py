"""ggml's block formats as torch: bytes of a GGUF tensor -> float32, and float32 -> bytes for a few types.

Every block starts (or, for Q6_K, ends) with fp16 scales; they are widened to fp32 and all arithmetic is
fp32 in the order ggml's reference dequantizers use (ggml-quants.c ``dequantize_row_*``, mirrored by
gguf-py's ``gguf.quants``), so the result is bit-identical to theirs: for any bytes of F32, F16 and BF16
(NaN payloads included), and for any block whose fp16 scales are finite (a NaN scale gives NaN values;
where two NaNs meet, which payload survives is up to each library's kernels). Each type is a handful of
vectorised ops over a (blocks, bytes per block) uint8 view: no Python loop over blocks.

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

import numpy as np
import torch

from tformer.core.errors import TformerError
from tformer.interop.gguf_file import BLOCK_LAYOUTS
from tformer.model.block_quantized import q4_1_blocks, q8_0_blocks

__all__ = ["BLOCK_LAYOUTS", "KEPT", "QUANTIZABLE", "block_parts", "dequantize", "quantize", "quantized_nbytes"]

QUANTIZABLE = ("F32", "F16", "Q8_0", "Q4_1")


def quantized_nbytes(ggml_type: str, shape) -> int:
    """Bytes that a tensor of ``shape`` (PyTorch order) takes as ``ggml_type``; its last dimension must be
    a whole number of blocks."""
    per_block, block_bytes = _layout(ggml_type)
    n = 1
    for d in shape:
        n *= int(d)
    row = int(shape[-1]) if len(shape) else 1
    if row % per_block:
        raise TformerError(f"a {ggml_type} tensor's rows hold whole blocks of {per_block} values; shape "
                           f"{tuple(shape)} has rows of {row}")
    return n // per_block * block_bytes


def _layout(ggml_type: str) -> tuple[int, int]:
    if ggml_type not in BLOCK_LAYOUTS:
        raise TformerError(f"ggml type {ggml_type!r} is not one tformer decodes; it decodes {', '.join(BLOCK_LAYOUTS)}")
    return BLOCK_LAYOUTS[ggml_type]


def _half_to_float(halves: torch.Tensor) -> torch.Tensor:
    """fp16 -> fp32 as numpy (and so gguf-py) widens it: exact, and a signalling NaN keeps its payload with
    the quiet bit clear, where torch's conversion sets that bit. Only a tensor holding a NaN pays for the fix."""
    out = halves.float()
    if out.isnan().any():
        bits = halves.view(torch.int16).to(torch.int32)
        nan = out.isnan()
        out = out.view(torch.int32).masked_scatter(
            nan, ((bits & -0x80000000) | 0x7F800000 | ((bits & 0x3FF) << 13))[nan]).view(torch.float32)
    return out


def _fp16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The fp16 at byte ``start`` of each block as fp32, shape (blocks, 1)."""
    return _half_to_float(blocks[:, start:start + 2].contiguous().view(torch.float16))


def _shift(x: torch.Tensor, n: int) -> torch.Tensor:
    # x >> n with n as a uint8 tensor: torch's uint8 shift by a Python int takes a slow path (several times slower)
    return x >> torch.tensor([n], dtype=torch.uint8, device=x.device) if n else x


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
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


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    d = _fp16(b, 0)
    q = _nibbles(b[:, 2:18]).to(torch.int8) - 8
    return d * q.float()


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    d, m = _fp16(b, 0), _fp16(b, 2)
    q = _nibbles(b[:, 4:20]).float()
    return d * q + m


def _q5(b: torch.Tensor, with_min: bool) -> torch.Tensor:
    d = _fp16(b, 0)
    at = 4 if with_min else 2
    low = _nibbles(b[:, at + 4:at + 20])
    q = low | (_qh_bits(b[:, at:at + 4]) * 16)
    if with_min:
        return d * q.float() + _fp16(b, 2)
    return d * (q.to(torch.int8) - 16).float()


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    d = _fp16(b, 0)
    return b[:, 2:34].contiguous().view(torch.int8).float() * d


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    return _k_quant(b, b[:, 16:144], None)


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    return _k_quant(b, b[:, 48:176], b[:, 16:48])


def _k_quant(b: torch.Tensor, qs: torch.Tensor, qh: torch.Tensor | None) -> torch.Tensor:
    n = b.shape[0]
    d, dmin = _fp16(b, 0), _fp16(b, 2)
    sc, mn = _k_scales(b[:, 4:16])
    scale = (d * sc.float()).view(n, 8, 1)
    offset = (dmin * mn.float()).view(n, 8, 1)
    q = _nibbles(qs.reshape(n, 4, 32)).view(n, 8, 32)
    if qh is not None:
        q = q | (_bits(qh, 1) * 16)
    return (scale * q.float() - offset).view(n, 256)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    d = _fp16(b, 208)
    scale = (d * b[:, 192:208].contiguous().view(torch.int8).float()).view(n, 16, 1)
    low = _nibbles(b[:, 0:128].reshape(n, 2, 64)).view(n, 8, 32)  # per 128 values: low nibbles, high nibbles
    high = _bits(b[:, 128:192].reshape(n * 2, 32), 2).reshape(n, 8, 32)  # per 128: 2-bit fields 0..3
    q = ((low | (high * 16)).to(torch.int8) - 32).view(n, 16, 16)
    return (scale * q.float()).view(n, 256)


_DECODERS = {
    "Q4_0": _q4_0, "Q4_1": _q4_1, "Q5_0": lambda b: _q5(b, False), "Q5_1": lambda b: _q5(b, True),
    "Q8_0": _q8_0, "Q4_K": _q4_k, "Q5_K": _q5_k, "Q6_K": _q6_k,
}


def _as_uint8(raw) -> tuple[torch.Tensor, bool]:
    """The bytes as a flat uint8 tensor, and whether it is a fresh copy (else it is the caller's tensor)."""
    if isinstance(raw, torch.Tensor):
        if raw.dtype != torch.uint8:
            raise TformerError(f"dequantize takes the tensor's bytes as uint8, got {raw.dtype}")
        return raw.reshape(-1), False
    array = np.asarray(raw)
    if array.dtype != np.uint8:
        raise TformerError(f"dequantize takes the tensor's bytes as uint8, got {array.dtype}")
    # A copy: the bytes usually lie in a read-only memory map, which torch will not wrap, and the copy is
    # a fraction of the fp32 result's size.
    return torch.from_numpy(np.array(array.reshape(-1), copy=True)), True


def dequantize(raw, ggml_type: str, shape) -> torch.Tensor:
    """The float32 tensor of ``shape`` (PyTorch order) that ``raw`` (its bytes in the file: a uint8 numpy
    array or tensor) encodes as ``ggml_type``; bit-identical to ``gguf.quants.dequantize``."""
    shape = tuple(int(d) for d in shape)
    nbytes = quantized_nbytes(ggml_type, shape)
    data, owned = _as_uint8(raw)
    if data.storage_offset() % 4:  # a slice of a larger byte tensor: torch views its dtype only when aligned
        data, owned = data.clone(), True
    if data.numel() != nbytes:
        raise TformerError(f"a {ggml_type} tensor of shape {shape} takes {nbytes} bytes, got {data.numel()}")
    if ggml_type == "F32":
        out = data.view(torch.float32).reshape(shape)
        return out if owned else out.clone()
    if ggml_type == "F16":
        return _half_to_float(data.view(torch.float16)).reshape(shape)
    if ggml_type == "BF16":
        # bf16 is the top half of an fp32: widening is a 16-bit shift, NaN payloads included.
        return (data.view(torch.int16).to(torch.int32) << 16).view(torch.float32).reshape(shape)
    blocks = data.view(-1, BLOCK_LAYOUTS[ggml_type][1])
    return _DECODERS[ggml_type](blocks).reshape(shape)


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    """(blocks, 32) values 0-15 -> (blocks, 16) bytes: value j in the low nibble of byte j, value 16+j high."""
    return q[:, :16] | (q[:, 16:] << 4)


def _fp16_bytes(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> fp16 bytes, rounded to nearest even as numpy (and ggml) round. A NaN keeps the top 10 bits of
    its payload as numpy keeps them (at least one bit set), where torch writes one canonical NaN."""
    half = x.to(torch.float16).view(torch.int16)
    nan = x.isnan()
    if nan.any():
        bits = x.view(torch.int32)
        payload = ((bits & 0x7FFFFF) >> 13).clamp(min=1)
        fixed = (((bits >> 16) & -0x8000) | 0x7C00 | payload).to(torch.int16)
        half = torch.where(nan, fixed, half)
    return half.view(torch.uint8)


def quantize(tensor: torch.Tensor, ggml_type: str) -> np.ndarray:
    """``tensor`` (any shape, rows a whole number of blocks) in ``ggml_type`` as a flat uint8 numpy array;
    byte for byte what ``gguf.quants.quantize`` writes (F32, F16, Q8_0, Q4_1).

    Both follow ggml's reference quantizers as gguf-py writes them. Q8_0: d = amax / 127, q = roundf(x * (1/d))
    (halves away from zero). Q4_1: d = (max - min) / 15, q = trunc((x - min) * (1/d) + 0.5) clamped to 15;
    the q's use the fp32 d and min, the block stores them as fp16. Each fp32 step is rounded on its own, as
    in gguf-py; ggml's C may fuse the multiply-add into one FMA where its compiler does, and can then differ
    from both on a value that lands exactly on a half. F32 and F16 keep inf and NaN (F16's NaN payloads
    as numpy narrows them); the block types refuse them.
    """
    if ggml_type not in QUANTIZABLE:
        raise TformerError(f"tformer writes ggml types {', '.join(QUANTIZABLE)}, not {ggml_type!r}")
    x = tensor.detach().to("cpu", torch.float32).contiguous()
    quantized_nbytes(ggml_type, tuple(x.shape))  # refuses rows that are not whole blocks
    if ggml_type not in ("F32", "F16") and not bool(x.isfinite().all()):
        bad = int((~x.isfinite()).sum())
        raise TformerError(f"cannot write a tensor with {bad} inf or NaN values as {ggml_type} (its blocks hold "
                           "finite numbers only); find where they came from, or write it as F32 or F16")
    if ggml_type == "F32":
        return x.view(torch.uint8).reshape(-1).numpy().copy()
    if ggml_type == "F16":
        return _fp16_bytes(x).reshape(-1).numpy().copy()
    blocks = x.reshape(-1, 32)
    if ggml_type == "Q8_0":
        q, d = q8_0_blocks(blocks)
        out = torch.cat([_fp16_bytes(d), q.view(torch.uint8)], dim=1)
    else:  # Q4_1
        q, d, low = q4_1_blocks(blocks)
        out = torch.cat([_fp16_bytes(d), _fp16_bytes(low), _pack_nibbles(q)], dim=1)
    return out.reshape(-1).numpy().copy()


KEPT = ("Q8_0", "Q4_1")  # the block types a model can keep (tformer.model.block_quantized)


def block_parts(raw, ggml_type: str, shape) -> tuple[torch.Tensor, ...]:
    """A Q8_0 or Q4_1 tensor's blocks as the parts tformer's block Linears store, for a 2-D ``shape`` (out, in):
    Q8_0 -> q (out, in) int8, d (out, in/32) fp16; Q4_1 -> q (out, in) uint8 0..15 in input order, d, m fp16."""
    if ggml_type not in KEPT:
        raise TformerError(f"tformer keeps ggml types {', '.join(KEPT)} in their blocks, not {ggml_type}; "
                           "load the file dequantized instead (--gguf-weights dequantize)")
    n, k = (int(x) for x in shape)
    data, _ = _as_uint8(raw)
    if data.numel() != quantized_nbytes(ggml_type, shape):
        raise TformerError(f"a {ggml_type} tensor of shape {tuple(shape)} takes {quantized_nbytes(ggml_type, shape)} "
                           f"bytes, not {data.numel()}")
    b = data.view(-1, BLOCK_LAYOUTS[ggml_type][1])

    def fp16(at: int) -> torch.Tensor:
        return b[:, at:at + 2].contiguous().view(torch.float16).view(n, k // 32)
    if ggml_type == "Q8_0":
        return b[:, 2:34].contiguous().view(torch.int8).view(n, k), fp16(0)
    return _nibbles(b[:, 4:20]).view(n, k), fp16(0), fp16(2)
