"""Linears that keep a GGUF file's Q5_0, Q4_K and Q6_K blocks as they are (config.quantize "q5_0", "q4_k",
"q6_k", or per Linear with quantize="mixed"): the formats of llama.cpp's "Q4_K_M" files, so such a model runs
with its weights at the file's 5.5, 4.5 and 6.6 bits each instead of widened to fp32.

Stored layout: ``blocks`` (out, row bytes) uint8, each row's blocks byte for byte as the file holds them
(tformer.model.ggml_blocks documents each block; tformer.cost.quantized sizes the buffer).

Two paths, as the other quantized Linears (tformer.model.quantized; choose() times them per shape): the
reference decodes the blocks with ggml's arithmetic (the values gguf-py's dequantizer gives) and runs F.linear;
the kernel rewrites them once for torch's int4 CPU kernel, groups of 32:
    Q4_K  each sub-block of 32 is (q - 8) * (d sc) + (8 d sc - dmin mn), q 0..15: int4's own form;
    Q5_0  q = 16 h + l (h 0..1, l 0..15): two 4-bit planes side by side along the input (the input repeated),
          h with scale 16 d and zero 128 d, l with scale d and zero -8 d, whose sum is d (q - 16).
    Q6_K  q = 16 h + l (h 0..3) in sub-blocks of 16, smaller than any group the kernel takes: four planes, h
          and l each under the first and under the second sub-block scale s of a group of 32, over four copies of
          the input in which the other sub-block's half is zero (h: scale 16 s, zero 128 s; l: scale s, zero -24 s).
A float weight is quantized in one pass (tformer.model.ggml_encode: Q5_0 as ggml's reference, the K-quants
without llama.cpp's search for the best scales); files from llama.cpp keep their own blocks.
"""

from __future__ import annotations

import torch

from tformer.core.errors import TformerError
from tformer.core.quant_formats import GGML_BLOCKS, QUANT_BITS
from tformer.model.ggml_blocks import decode, k_quant_parts, q5_parts, q6_k_parts
from tformer.model.ggml_encode import ENCODERS
from tformer.model.quantized import INT4_MID, Int4KernelLinear


class GGMLBlocksLinear(Int4KernelLinear):
    """A Linear over ``blocks``, rows of whole ggml blocks of ``ggml_type``."""

    ggml_type = ""

    def __init__(self, d_in: int, d_out: int, bias: bool = False):
        super().__init__(d_in, d_out, bias)
        self.per_block, self.block_bytes = GGML_BLOCKS[self.ggml_type]
        if d_in % self.per_block:
            raise TformerError(f"{self.layout} keeps rows in blocks of {self.per_block} weights; this Linear's input "
                               f"width {d_in} is not a multiple of {self.per_block}")
        self.register_buffer("blocks", torch.zeros(d_out, d_in // self.per_block * self.block_bytes,
                                                   dtype=torch.uint8))

    def set_blocks(self, raw: torch.Tensor) -> None:
        """The tensor's bytes as the file holds them: (out, row bytes) uint8, or flat."""
        if raw.dtype != torch.uint8 or raw.numel() != self.blocks.numel():
            raise TformerError(f"a {self.layout} Linear of {self.out_features} x {self.in_features} takes "
                               f"{self.blocks.numel()} bytes of blocks, got {raw.numel()} of {raw.dtype}")
        self.blocks.copy_(raw.reshape(self.blocks.shape))

    def quantize_(self, weight: torch.Tensor) -> None:
        """A float weight (out, in) into blocks, in one pass (tformer.model.ggml_encode)."""
        w = weight.detach().float()
        if not bool(w.isfinite().all()):
            raise TformerError(f"cannot quantize a weight holding inf or NaN to {self.layout} blocks; find where "
                               "they came from")
        self.set_blocks(ENCODERS[self.ggml_type](w.reshape(-1, self.per_block)))

    def raw_blocks(self) -> torch.Tensor:
        return self.blocks

    def _rows_of_blocks(self) -> torch.Tensor:
        return self.blocks.view(-1, self.block_bytes)  # (out * blocks per row, bytes per block)

    def dequantized(self) -> torch.Tensor:
        return decode(self._rows_of_blocks(), self.ggml_type).view(self.out_features, self.in_features)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (any shape) of W, decoded as dequantized() decodes them: (*ids.shape, in) fp32."""
        blocks = self.blocks[ids].reshape(-1, self.block_bytes)
        return decode(blocks, self.ggml_type).view(*ids.shape, self.in_features)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", layout={self.layout}"


class Q5_0Linear(GGMLBlocksLinear):
    ggml_type, layout, bits = "Q5_0", "q5_0", QUANT_BITS["q5_0"]

    def _planes(self):
        n, k = self.out_features, self.in_features
        q, d = q5_parts(self._rows_of_blocks(), with_min=False)
        q, d = q.view(n, k), d.view(n, k // 32)
        planes = torch.cat((q >> 4, q & 0x0F), dim=1)  # (out, 2 in): the fifth bits, then the nibbles
        return planes, torch.cat((16 * d, d), dim=1), torch.cat((16 * INT4_MID * d, (INT4_MID - 16) * d), dim=1)

    def _kernel_input(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat((x, x), dim=1)  # (rows, 2 in): one copy of the input for each plane


class Q4_KLinear(GGMLBlocksLinear):
    ggml_type, layout, bits = "Q4_K", "q4_k", QUANT_BITS["q4_k"]

    def _planes(self):
        n, k = self.out_features, self.in_features
        q, scale, offset = k_quant_parts(self._rows_of_blocks(), high_bits=False)
        scale, offset = scale.view(n, k // 32), offset.view(n, k // 32)
        return q.view(n, k), scale, INT4_MID * scale - offset


class Q6_KLinear(GGMLBlocksLinear):
    ggml_type, layout, bits = "Q6_K", "q6_k", QUANT_BITS["q6_k"]

    def _planes(self):
        n, k = self.out_features, self.in_features
        q, scale = q6_k_parts(self._rows_of_blocks())
        q, scale = q.view(n, k), scale.view(n, k // 32, 2)  # each group of 32: its two sub-blocks' scales
        first, second = scale[..., 0], scale[..., 1]
        high, low = q >> 4, q & 0x0F
        # Four planes over the input four times (_kernel_input): the fifth-and-sixth bits, then the nibbles, each
        # once under the first sub-block's scale and once under the second's; the half of each group a plane's
        # scale does not belong to meets zeros in its copy of the input.
        planes = torch.cat((high, high, low, low), dim=1)
        scales = torch.cat((16 * first, 16 * second, first, second), dim=1)
        zeros = torch.cat((16 * INT4_MID * first, 16 * INT4_MID * second, (INT4_MID - 32) * first,
                           (INT4_MID - 32) * second), dim=1)
        return planes, scales, zeros

    def _kernel_input(self, x: torch.Tensor) -> torch.Tensor:
        halves = x.view(x.shape[0], -1, 2, 16)  # (rows, groups of 32, sub-block, 16)
        first = torch.cat((halves[:, :, :1], torch.zeros_like(halves[:, :, 1:])), dim=2).view_as(x)
        second = x - first
        return torch.cat((first, second, first, second), dim=1)  # (rows, 4 in)


LAYOUTS = {cls.layout: cls for cls in (Q5_0Linear, Q4_KLinear, Q6_KLinear)}  # core.quant_formats.RAW_BLOCKS

__all__ = ["GGMLBlocksLinear", "LAYOUTS", "Q4_KLinear", "Q5_0Linear", "Q6_KLinear"]
