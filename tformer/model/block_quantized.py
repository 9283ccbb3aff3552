"""Linears that keep llama.cpp's GGUF blocks: 32 weights of a row share fp16 scales (config.quantize "q8_0",
"q4_1"), so a GGUF file's 8- and 4-bit weights run without being widened to fp32 in memory.

Stored layouts (plain tensors, safetensors-ready; tformer.cost.quantized sizes them; the bytes equal the
file's blocks, 34 per 32 weights for Q8_0 and 20 for Q4_1):
    Q8_0Linear  weight (out, in) int8, scale (out, in/32) fp16:                     W = q * d
    Q4_1Linear  weight (out, in/2) uint8 (input 2j low nibble, 2j+1 high), scale and min (out, in/32) fp16:
                W = q * d + m,  q in 0..15

The reference path widens the blocks exactly as ggml does (fp32 products of the fp16 scales), so a model kept
in blocks computes what the dequantized model computes. The kernel path feeds torch's int4 CPU kernel
(tformer.model.quantized): Q4_1 is its form with zero = m + 8d; a Q8_0 value is two 4-bit planes,
q = 16 * (q >> 4) + (q & 15), laid side by side along the input (the input repeated), so one int4 product
computes it exactly up to the kernel's bf16 rounding of the input and the scales.
"""

from __future__ import annotations

import torch

from tformer.core.errors import TformerError
from tformer.model.quantized import INT4_MID, Int4KernelLinear, nibble_pairs, pack_pairs

BLOCK = 32  # weights per block (Q8_0, Q4_1)


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """roundf: halves away from zero, as ggml rounds. floor(|x| + 0.5) is wrong just below a half
    (0.49999997 + 0.5 rounds up to 1.0 in fp32), so the fraction is compared instead: exact."""
    a = x.abs()
    whole = a.floor()
    return torch.copysign(whole + ((a - whole) >= 0.5).float(), x)


def q8_0_blocks(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, 32) fp32 -> q (B, 32) int8 and d (B, 1) fp32, as ggml's reference quantizer (and gguf-py): d = amax / 127,
    q = roundf(x * (1/d)); q uses the fp32 d, the block stores d as fp16."""
    d = blocks.abs().amax(dim=1, keepdim=True) / 127
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    return round_half_away(blocks * inverse).to(torch.int8), d


def q4_1_blocks(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(B, 32) fp32 -> q (B, 32) uint8 0..15, d and m (B, 1) fp32: d = (max - min) / 15, m = min,
    q = trunc((x - min) * (1/d) + 0.5) clamped to 15 (each fp32 step rounded on its own, as gguf-py)."""
    low = blocks.amin(dim=1, keepdim=True)
    d = (blocks.amax(dim=1, keepdim=True) - low) / 15
    inverse = torch.where(d == 0, torch.zeros_like(d), 1 / d)
    return ((blocks - low) * inverse + 0.5).trunc().to(torch.uint8).clamp(0, 15), d, low


def _blocks_of(weight: torch.Tensor) -> torch.Tensor:
    w = weight.detach().float()
    if not bool(w.isfinite().all()):
        raise TformerError("cannot quantize a weight holding inf or NaN to GGUF blocks; find where they came from")
    return w.reshape(-1, BLOCK)


class BlockQuantizedLinear(Int4KernelLinear):
    """Shared by Q8_0Linear and Q4_1Linear: rows of whole 32-weight blocks, run on the int4 kernel."""

    group = BLOCK

    def raw_blocks(self) -> torch.Tensor:
        """The stored parts laid out as the file's blocks (kernel_blocks() keeps their repacked form)."""
        return self._file_blocks().view(self.out_features, -1)

    def _file_blocks(self) -> torch.Tensor:
        raise NotImplementedError

    def __init__(self, d_in: int, d_out: int, bias: bool):
        if d_in % BLOCK:
            raise TformerError(f"{self.layout} keeps rows in blocks of {BLOCK} weights; this Linear's input width "
                               f"{d_in} is not a multiple of {BLOCK}: keep it at int8 or in float")
        super().__init__(d_in, d_out, bias)

    def extra_repr(self) -> str:
        return super().extra_repr() + f", layout={self.layout}"


class Q8_0Linear(BlockQuantizedLinear):
    """GGUF's Q8_0: 32 int8 weights of a row share one fp16 scale d (symmetric: W = q * d)."""

    bits, layout, ggml_type = 8, "q8_0", "Q8_0"

    def __init__(self, d_in: int, d_out: int, bias: bool = False):
        super().__init__(d_in, d_out, bias)
        self.register_buffer("weight", torch.zeros(d_out, d_in, dtype=torch.int8))
        self.register_buffer("scale", torch.ones(d_out, d_in // BLOCK, dtype=torch.float16))

    def set_blocks(self, q: torch.Tensor, d: torch.Tensor) -> None:
        """q (out, in) int8 and d (out, in/32) fp16, as a Q8_0 tensor's blocks hold them."""
        self.weight.copy_(q)
        self.scale.copy_(d)

    def quantize_(self, weight: torch.Tensor) -> None:
        q, d = q8_0_blocks(_blocks_of(weight))
        n = self.out_features
        self.set_blocks(q.view(n, -1), d.view(n, -1).to(torch.float16))

    def dequantized(self) -> torch.Tensor:
        n, k = self.out_features, self.in_features
        return (self.weight.view(n, k // BLOCK, BLOCK).float() * self.scale.float()[..., None]).view(n, k)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (any shape) of W, widened as dequantized() widens them: (*ids.shape, in) fp32. The token
        lookup of a model whose tied head is this Linear."""
        k = self.in_features
        q = self.weight[ids].float().view(*ids.shape, k // BLOCK, BLOCK)
        return (q * self.scale[ids].float()[..., None]).view(*ids.shape, k)

    def _file_blocks(self) -> torch.Tensor:
        # per block: d fp16, then the 32 int8 values
        d = self.scale.reshape(-1, 1).contiguous().view(torch.uint8)
        return torch.cat((d, self.weight.reshape(-1, BLOCK).view(torch.uint8)), dim=1)

    def _planes(self):
        q = self.weight
        high, low = (q >> 4) + INT4_MID, q & 0x0F  # q = 16 (high - 8) + low; high and low 0..15
        d = self.scale.float()
        # (high - 8) * 16d + 0, then (low - 8) * d + 8d: the two planes' groups, high first.
        scale = torch.cat((16 * d, d), dim=1)
        zero = torch.cat((torch.zeros_like(d), INT4_MID * d), dim=1)
        return torch.cat((high, low), dim=1), scale, zero

    def _kernel_input(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat((x, x), dim=1)  # (rows, 2 in): one copy of the input for each plane


class Q4_1Linear(BlockQuantizedLinear):
    """GGUF's Q4_1: 32 4-bit weights of a row share an fp16 scale d and minimum m (W = q * d + m)."""

    bits, layout, ggml_type = 4, "q4_1", "Q4_1"

    def __init__(self, d_in: int, d_out: int, bias: bool = False):
        super().__init__(d_in, d_out, bias)
        self.register_buffer("weight", torch.zeros(d_out, d_in // 2, dtype=torch.uint8))
        self.register_buffer("scale", torch.ones(d_out, d_in // BLOCK, dtype=torch.float16))
        self.register_buffer("min", torch.zeros(d_out, d_in // BLOCK, dtype=torch.float16))

    def set_blocks(self, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> None:
        """q (out, in) uint8 0..15 in input order, d and m (out, in/32) fp16."""
        self.weight.copy_(pack_pairs(q))
        self.scale.copy_(d)
        self.min.copy_(m)

    def quantize_(self, weight: torch.Tensor) -> None:
        q, d, m = q4_1_blocks(_blocks_of(weight))
        n = self.out_features
        self.set_blocks(q.view(n, -1), d.view(n, -1).to(torch.float16), m.view(n, -1).to(torch.float16))

    def values(self) -> torch.Tensor:
        """The 4-bit values q (out, in), 0..15."""
        return nibble_pairs(self.weight, self.out_features, self.in_features)

    def dequantized(self) -> torch.Tensor:
        n, k = self.out_features, self.in_features
        q = self.values().float().view(n, k // BLOCK, BLOCK)
        return (q * self.scale.float()[..., None] + self.min.float()[..., None]).view(n, k)

    def rows(self, ids: torch.Tensor) -> torch.Tensor:
        """Rows ``ids`` (any shape) of W, widened as dequantized() widens them: (*ids.shape, in) fp32."""
        k = self.in_features
        q = nibble_pairs(self.weight[ids].reshape(-1, k // 2), ids.numel(), k).float()
        q = q.view(*ids.shape, k // BLOCK, BLOCK)
        return (q * self.scale[ids].float()[..., None] + self.min[ids].float()[..., None]).view(*ids.shape, k)

    def _file_blocks(self) -> torch.Tensor:
        # per block: d and m fp16, then 16 bytes: value j in byte j's low nibble, value j + 16 in its high one
        q = self.values().view(-1, BLOCK)
        qs = q[:, :16] | (q[:, 16:] << 4)
        dm = torch.cat((self.scale.reshape(-1, 1), self.min.reshape(-1, 1)), dim=1).contiguous().view(torch.uint8)
        return torch.cat((dm, qs), dim=1)

    def _planes(self):
        d = self.scale.float()
        return self.values(), d, self.min.float() + INT4_MID * d


LAYOUTS = {"q8_0": Q8_0Linear, "q4_1": Q4_1Linear}

__all__ = ["BLOCK", "LAYOUTS", "BlockQuantizedLinear", "Q4_1Linear", "Q8_0Linear", "q4_1_blocks", "q8_0_blocks",
           "round_half_away"]
