"""Images as tokens (Dosovitskiy et al. 2020): cut into P x P patches, each projected to d_model, with a
learned [CLS] vector in front and a learned position per token.

    pixels (B, C, H, W) -> (H/P)(W/P) patches of C P^2 values -> Linear -> (B, HW/P^2, d) -> [CLS] + patches

The projection is a Conv2d with kernel and stride P (what the released models store); ``unfolded`` computes
the same with the patches cut out (F.unfold) and one matmul, which is how the ledger counts it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from tformer.core.errors import TformerError


class PatchEmbed(nn.Module):
    """spec: tformer.cost.architecture.Patches. Parameters: ``cls_token`` (d,), ``proj`` Conv2d(C, d, P, stride P)."""

    def __init__(self, spec):
        super().__init__()
        self.cls_token = nn.Parameter(torch.zeros(spec.d))
        self.proj = nn.Conv2d(spec.channels, spec.d, spec.patch, stride=spec.patch, bias=spec.bias)
        self.channels, self.patch, self.grid = spec.channels, spec.patch, spec.grid

    def check(self, pixels: torch.Tensor, any_size: bool = False) -> None:
        """One line naming what is wrong with ``pixels`` and the fix: its rank, channels, size."""
        size = self.grid * self.patch
        if pixels.dim() != 4:
            raise TformerError(f"images must be a (batch, channels, height, width) tensor; got shape {tuple(pixels.shape)}")
        if not pixels.is_floating_point():
            raise TformerError(f"images must hold floating-point pixel values, got {pixels.dtype}; "
                               "scale them (e.g. to [0, 1] or normalised) and convert with .float()")
        _, c, h, w = pixels.shape
        if c != self.channels:
            raise TformerError(f"images have {c} channels but the model reads {self.channels}; "
                               f"convert them ({'grayscale to RGB' if c == 1 else 'to ' + str(self.channels)}) "
                               f"or build the model with num_channels={c}")
        if any_size:
            if h % self.patch or w % self.patch or not h or not w:
                raise TformerError(f"an image of {h}x{w} pixels is not whole {self.patch}x{self.patch} patches; "
                                   f"resize or crop it to a multiple of {self.patch}")
        elif (h, w) != (size, size):
            raise TformerError(f"images are {h}x{w} pixels but the model reads {size}x{size}; resize them, or pass "
                               "interpolate_pos_encoding=True to interpolate its positions to the new size")

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) -> (B, 1 + (H/P)(W/P), d): [CLS], then the patches row by row."""
        x = self.proj(pixels.to(self.proj.weight.dtype)).flatten(2).transpose(1, 2)  # (B, HW/P^2, d)
        return self._with_cls(x)

    def unfolded(self, pixels: torch.Tensor) -> torch.Tensor:
        """The same as ``forward``, as the textbook writes it: each patch flattened to C P^2 values (channel, row,
        column: the order of the convolution's weight), then one matmul with that weight viewed as (d, C P^2)."""
        cols = F.unfold(pixels.to(self.proj.weight.dtype), self.patch, stride=self.patch)  # (B, C P^2, HW/P^2)
        x = cols.transpose(1, 2) @ self.proj.weight.flatten(1).T
        if self.proj.bias is not None:
            x = x + self.proj.bias
        return self._with_cls(x)

    def _with_cls(self, x: torch.Tensor) -> torch.Tensor:
        cls = self.cls_token.to(x.dtype).expand(x.shape[0], 1, -1)
        return torch.cat([cls, x], dim=1)


def fitted_positions(table: torch.Tensor, grid: int, rows: int, cols: int) -> torch.Tensor:
    """A learned table (1 + grid^2, d) for a grid x grid image, fitted to rows x cols patches: [CLS]'s row as it is,
    the patch rows bicubically interpolated as the 2-D grid they are (align_corners off, as Hugging Face's ViT and
    CLIP do, so imported checkpoints agree). Returns (1, 1 + rows * cols, d)."""
    if (rows, cols) == (grid, grid):
        return table[None]
    d = table.shape[1]
    patch = table[1:].reshape(1, grid, grid, d).permute(0, 3, 1, 2)  # (1, d, grid, grid)
    patch = F.interpolate(patch.float(), size=(rows, cols), mode="bicubic", align_corners=False).to(table.dtype)
    patch = patch.permute(0, 2, 3, 1).reshape(1, rows * cols, d)
    return torch.cat([table[None, :1], patch], dim=1)


def encode_images(stack, pixels: torch.Tensor, interpolate_pos_encoding: bool = False, need_weights: bool = False):
    """Run a vision stack (tformer.model.blocks.Stack with a patch embedding) over (B, C, H, W) pixels:
    (hidden (B, n, d), attention weights per layer). At another image size the positions are interpolated
    (``interpolate_pos_encoding``), else such an image is refused in one line."""
    embed = stack.patch_embed
    embed.check(pixels, any_size=interpolate_pos_encoding)
    h = embed(pixels)
    rows, cols = pixels.shape[2] // embed.patch, pixels.shape[3] // embed.patch
    positions = fitted_positions(stack.positions.weight, embed.grid, rows, cols)
    hidden, weights, _ = stack(h, added_positions=positions, need_weights=need_weights)
    return hidden, weights
