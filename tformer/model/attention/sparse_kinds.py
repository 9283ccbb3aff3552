"""The sparse kinds: strided (Sparse Transformer), Longformer and BigBird, all computed with gathered
blocks (tformer.model.attention.block_sparse), never with an n x n mask. Each is exactly softmax attention
restricted to its pattern; its tests compare it with dense attention under the same pattern as a mask.
Positions i (query) and j (key) count from the start of the sequence."""

from __future__ import annotations

import torch

from tformer.core.sparse_layout import SparseGeometry, global_blocks
from tformer.model.attention.block_sparse import BlockSparseKind

_MIX = 1_000_003  # a prime to mix seed, layer and block into one generator seed


class Strided(BlockSparseKind):
    """Sparse Transformer's strided pattern (Child et al. 2019), both heads merged into one: query i sees key j
    when |i - j| < w (local) or (i - j) mod w == 0 (strided); causal: only j <= i. Window w = attn_window.

    Computed with gathered blocks of b = w: the local part gathers the own and previous block (and the next
    when bidirectional), 2w or 3w keys per query; the strided part is the same row of every key block
    ("columns", a reshape, no gather): n/w keys per query. So at fixed w the strided part costs n²/w pairs,
    quadratic in n; with w ≈ √n the whole costs n·√n (the paper's choice)."""

    def pairs(self, q_pos, k_pos, causal):
        diff = q_pos - k_pos
        return diff < self.options.window if causal else diff.abs() < self.options.window

    def column_pairs(self, q_pos, k_pos, causal):
        # Same row of another block: a multiple of w away, the local part's keys (|i - j| < w) excluded.
        diff = q_pos - k_pos
        return diff >= self.options.window if causal else diff.abs() >= self.options.window


class Longformer(BlockSparseKind):
    """Longformer (Beltagy et al. 2020): a sliding window, dilated per layer, plus global tokens.

    Window of w = attn_window keys, d = this layer's attn_dilation apart: causal, the w most recent
    (j = i, i - d, ..., i - (w-1)·d); bidirectional, w // 2 each side of i (|i - j| <= (w // 2)·d, i - j a
    multiple of d), so 2·(w // 2) + 1 keys. Global: the first g = attn_global positions attend to every key
    (dense rows, g x n) and every query attends to them (shared key columns, g per query; causal: only those
    at or before it). A global key is taken out of the window so no pair is counted twice.

    Computed with gathered blocks of b = attn_block covering the window's span ((w-1)·d + 1 positions), so
    the pairs formed grow with n·(w·d + b) + g·n; a dilated window forms d times the pairs it keeps."""

    def pairs(self, q_pos, k_pos, causal):
        w, d = self.options.window, self.options.dilation
        diff = q_pos - k_pos
        reach = diff <= (w - 1) * d if causal else diff.abs() <= (w // 2) * d
        return reach & (diff % d == 0) & (k_pos >= self.options.global_tokens)


class BigBird(BlockSparseKind):
    """BigBird (Zaheer et al. 2020, the ITC form): blocks of b = attn_block; each query block sees
    - its window blocks: previous, own and next (causal: previous and own, and only the keys j <= i);
    - attn_random random key blocks, fixed at init: drawn with a torch.Generator seeded by attn_seed, the
      layer and the query block (and, bidirectional, the sequence's block count), from the blocks outside
      the window and the global ones; causal: only from the past (blocks before the previous one), so a
      decode step draws the same blocks as the full forward;
    - the global blocks: attn_global tokens rounded up to whole blocks (attn_global=0, the default: none;
      the paper's ITC uses 2 global blocks, attn_global = 2·attn_block). Global query blocks attend to every
      key, densely.
    Computed with gathered blocks: (3 + random + global) blocks per query block, so the pairs grow with
    n·b·(3 + r + g), linear in n at fixed block size. A block listed twice (the window reaching a global
    block) counts once; a row with fewer past blocks than attn_random leaves the rest as padding."""

    def extra_blocks(self, c: int, geometry: SparseGeometry, causal: bool) -> list[int]:
        n_global, r = global_blocks(self.options), self.options.random
        picks: list[int] = []
        if r:
            end = c - 1 if causal else geometry.k_blocks
            candidates = [j for j in range(n_global, end) if not c - 1 <= j <= c + 1]
            o = self.options
            seed = ((o.seed * _MIX + o.layer) * _MIX + c) * _MIX + (0 if causal else geometry.k_blocks)
            generator = torch.Generator().manual_seed(seed % (2 ** 63))
            order = torch.randperm(len(candidates), generator=generator)[:r] if candidates else []
            picks = sorted(candidates[int(i)] for i in order)
        return picks + [-1] * (r - len(picks)) + list(range(n_global))
