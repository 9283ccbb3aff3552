"""fp32 weights -> ggml blocks of Q5_0, Q4_K and Q6_K, the inverse of tformer.model.ggml_blocks' decoders.

Q5_0 follows ggml's reference quantizer (quantize_row_q5_0_ref: d = the value of largest magnitude / -16,
q = trunc(x / d + 16.5) capped at 31), byte for byte what gguf-py writes. The K-quants are quantized in one
pass, without llama.cpp's search for the best scales (make_qkx2_quants, make_qx_quants) and without an
importance matrix: each sub-block's range sets its scale, the super-block's largest scale sets the 6- or 8-bit
grid of scales. Good enough to build a model to test and to measure; files from llama.cpp keep their own blocks.
All arithmetic is fp32 on the fp16-rounded super-block scales, so what is stored is what decoding reproduces.
"""

from __future__ import annotations

import torch

from tformer.core.quant_formats import GGML_BLOCKS


def _fp16_bytes(x: torch.Tensor) -> torch.Tensor:
    """(blocks, 1) fp32 -> (blocks, 2) bytes of its fp16."""
    return x.to(torch.float16).contiguous().view(torch.uint8)


def _safe_inverse(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x == 0, torch.zeros_like(x), 1 / x)


def _signed_extreme(x: torch.Tensor) -> torch.Tensor:
    """The value of largest magnitude along the last dimension (the first such), keeping its sign."""
    return x.gather(-1, x.abs().argmax(dim=-1, keepdim=True))


def encode_q5_0(x: torch.Tensor) -> torch.Tensor:
    """(blocks, 32) fp32 -> (blocks, 22) bytes: d, qh (the 5th bits, a little-endian u32), qs (value j in byte
    j's low nibble, 16 + j in its high)."""
    d = _signed_extreme(x) / -16
    q = (x * _safe_inverse(d) + 16.5).trunc().clamp(max=31).to(torch.uint8)
    qs = (q[:, :16] & 0x0F) | ((q[:, 16:] & 0x0F) << 4)
    bits = (q >> 4).view(-1, 4, 8)  # value 8 b + s -> bit s of byte b
    qh = sum(bits[:, :, s] << s for s in range(8)).to(torch.uint8)
    return torch.cat((_fp16_bytes(d), qh, qs), dim=1)


def _grid(values: torch.Tensor, top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-super-block scales on a grid: (blocks, subs) fp32 -> the fp16 step (blocks, 1) and integer steps."""
    step = (values.abs().amax(dim=1, keepdim=True) / top).to(torch.float16).float()
    return step, (values * _safe_inverse(step)).round().clamp(-top - 1, top)


def encode_q4_k(x: torch.Tensor) -> torch.Tensor:
    """(blocks, 256) fp32 -> (blocks, 144) bytes: d, dmin, 12 bytes of 6-bit scales and mins, 128 bytes of
    nibbles (chunk c of 32 bytes: sub-block 2c low, 2c+1 high). A sub-block's minimum is at most 0, as ggml keeps it."""
    n = x.shape[0]
    sub = x.view(n, 8, 32)
    low = sub.amin(dim=-1).clamp(max=0)
    d, sc = _grid((sub.amax(dim=-1) - low) / 15, 63)
    dmin, mn = _grid(-low, 63)
    sc, mn = sc.clamp(min=0).to(torch.uint8), mn.clamp(min=0).to(torch.uint8)
    scale, offset = (d * sc.float())[..., None], (dmin * mn.float())[..., None]
    q = ((sub + offset) * _safe_inverse(scale)).round().clamp(0, 15).to(torch.uint8)
    packed_scales = torch.cat((sc[:, :4] | ((sc[:, 4:] >> 4) << 6), mn[:, :4] | ((mn[:, 4:] >> 4) << 6),
                               (sc[:, 4:] & 0x0F) | ((mn[:, 4:] & 0x0F) << 4)), dim=1)
    pairs = q.view(n, 4, 2, 32)
    qs = (pairs[:, :, 0] | (pairs[:, :, 1] << 4)).view(n, 128)
    return torch.cat((_fp16_bytes(d), _fp16_bytes(dmin), packed_scales, qs), dim=1)


def encode_q6_k(x: torch.Tensor) -> torch.Tensor:
    """(blocks, 256) fp32 -> (blocks, 210) bytes: ql (per half of 128 values: value v < 64 in byte v's low nibble,
    64 + v in its high), qh (per half: value 32 s + l in bits 2s, 2s+1 of byte l), 16 int8 scales, d."""
    n = x.shape[0]
    sub = x.view(n, 16, 16)
    d, sc = _grid(_signed_extreme(sub).squeeze(-1) / -32, 127)
    scale = (d * sc)[..., None]
    q = ((sub * _safe_inverse(scale)).round().clamp(-32, 31) + 32).to(torch.uint8).view(n, 2, 128)
    ql = ((q[:, :, :64] & 0x0F) | ((q[:, :, 64:] & 0x0F) << 4)).view(n, 128)
    fields = (q >> 4).view(n, 2, 4, 32)
    qh = sum(fields[:, :, s] << (2 * s) for s in range(4)).to(torch.uint8).view(n, 64)
    return torch.cat((ql, qh, sc.to(torch.int8).view(torch.uint8), _fp16_bytes(d)), dim=1)


ENCODERS = {"Q5_0": encode_q5_0, "Q4_K": encode_q4_k, "Q6_K": encode_q6_k}

# Where each format keeps its fp16 scales (and mins): byte offsets in a block (ggml_blocks' table).
SCALE_BYTES = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,), "Q4_K": (0, 2),
               "Q5_K": (0, 2), "Q6_K": (208,)}


def random_blocks(rows: int, cols: int, ggml_type: str, generator: torch.Generator | None = None) -> torch.Tensor:
    """(rows, row bytes) uint8 of random blocks whose fp16 scales are finite (0.001 to 0.01, a Q4_1 min -0.1 to
    0): every other bit random, so every value, sub-block scale and high bit a format holds is met. For tests and
    benches of the block kernels, at sizes an encoder would take long over."""
    per_block, block_bytes = GGML_BLOCKS[ggml_type]
    blocks = torch.randint(0, 256, (rows * cols // per_block, block_bytes), dtype=torch.uint8, generator=generator)
    for i, at in enumerate(SCALE_BYTES[ggml_type]):
        value = torch.rand(blocks.shape[0], 1, generator=generator) * 0.009 + 0.001
        if i == 1 and ggml_type in ("Q4_1", "Q5_1"):
            value = -10 * value
        blocks[:, at:at + 2] = _fp16_bytes(value)
    return blocks.view(rows, -1)


__all__ = ["ENCODERS", "SCALE_BYTES", "encode_q4_k", "encode_q5_0", "encode_q6_k", "random_blocks"]
