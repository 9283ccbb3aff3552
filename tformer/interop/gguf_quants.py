"""ggml's block formats as torch: bytes of a GGUF tensor -> float32, and float32 -> bytes for a few types.

Every block starts (or, for Q6_K, ends) with fp16 scales; they are widened to fp32 and all arithmetic is
fp32 in the order ggml's reference dequantizers use (ggml-quants.c ``dequantize_row_*``, mirrored by
gguf-py's ``gguf.quants``), so the result is bit-identical to theirs: for any bytes of F32, F16 and BF16
(NaN payloads included), and for any block whose fp16 scales are finite (a NaN scale gives NaN values;
where two NaNs meet, which payload survives is up to each library's kernels). Each type is a handful of
vectorised ops over a (blocks, bytes per block) uint8 view: no Python loop over blocks.

The block layouts and their decoders live in tformer.model.ggml_blocks (the Linears that keep K-quant blocks
decode with them too); this module adds the file's side: exact NaN payloads, byte checks, and the writer.
"""

from __future__ import annotations

import numpy as np
import torch

from tformer.core.errors import TformerError
from tformer.core.quant_formats import KEPT_BLOCKS
from tformer.interop.gguf_file import BLOCK_LAYOUTS
from tformer.model.block_quantized import q4_1_blocks, q8_0_blocks
from tformer.model.ggml_blocks import decode, nibbles

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
    return decode(blocks, ggml_type, _half_to_float).reshape(shape)


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


KEPT = tuple(name.upper() for name in KEPT_BLOCKS)  # the block types a model keeps (block_quantized, kquant_linear)


def block_parts(raw, ggml_type: str, shape) -> tuple[torch.Tensor, ...]:
    """A kept tensor's blocks as the parts tformer's block Linears store, for a 2-D ``shape`` (out, in):
    Q8_0 -> q (out, in) int8, d (out, in/32) fp16; Q4_1 -> q (out, in) uint8 0..15 in input order, d, m fp16;
    Q5_0, Q4_K, Q6_K -> the bytes as they are, (out, row bytes) uint8."""
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
    if ggml_type not in ("Q8_0", "Q4_1"):
        return (data.view(n, -1),)
    if ggml_type == "Q8_0":
        return b[:, 2:34].contiguous().view(torch.int8).view(n, k), fp16(0)
    return nibbles(b[:, 4:20]).view(n, k), fp16(0), fp16(2)
