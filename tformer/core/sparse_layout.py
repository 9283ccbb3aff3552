"""Where the sparse kinds' gathered blocks sit, without torch: the model (tformer.model.attention.block_sparse)
gathers these blocks and the ledger (tformer.cost.attention_sparse) charges them, both from this one geometry,
so the FLOPs the ledger predicts are the pairs the model forms.

Positions are grouped in blocks of ``block`` tokens from position 0: block c holds positions c·block ..
c·block + block - 1. Queries at positions q_start .. q_start + tq - 1 (the last tq of tk keys when decoding
with a KV cache) fill query blocks ``first`` .. ``first + q_blocks - 1``; each query block gathers ``slots``
key blocks (a fixed count; a slot with no block is padding, computed and masked). Besides its blocks a query
may meet:
  columns     (strided) the same row of every key block: the keys a multiple of the block (= window) away
  shared      (longformer) the first ``shared`` keys, the global tokens every query attends to
  dense rows  (longformer, bigbird) the leading queries that are global attend to every key, densely
"""

from __future__ import annotations

from dataclasses import dataclass

SPARSE_KINDS = ("strided", "longformer", "bigbird")


@dataclass(frozen=True)
class SparseGeometry:
    block: int
    first: int  # the first query block (absolute: block c starts at position c·block)
    q_blocks: int
    k_blocks: int
    slots: int  # key blocks gathered per query block (m)
    tk: int
    columns: bool = False
    shared: int = 0
    dense_rows: int = 0

    @property
    def gathered_keys(self) -> int:
        """Keys each query block meets besides the dense rows: m·b gathered, the column keys, the shared ones."""
        return self.slots * self.block + (self.k_blocks if self.columns else 0) + self.shared

    @property
    def pairs(self) -> int:
        """Query-key pairs formed per (batch, head): every padded query row against its keys, plus the dense rows."""
        return self.q_blocks * self.block * self.gathered_keys + self.dense_rows * self.tk


def sparse_block(options) -> int:
    """Tokens per block: the window for strided (so the strided keys are one row of the key blocks), else attn_block."""
    return options.window if options.kind == "strided" else options.block


def window_reach(options, causal: bool) -> tuple[int, int]:
    """How far (in positions) a query's window reaches left and right."""
    kind, b = options.kind, sparse_block(options)
    if kind == "bigbird":  # the previous, own (and next) block
        return b, (0 if causal else b)
    if kind == "strided":  # |i - j| < w
        return b - 1, (0 if causal else b - 1)
    w, d = options.window, options.dilation
    if causal:  # the w most recent keys, d apart
        return (w - 1) * d, 0
    return (w // 2) * d, (w // 2) * d  # w // 2 keys each side, d apart


def window_blocks(options, c: int, causal: bool) -> list[int]:
    """The key blocks query block ``c`` reaches with its window (some may lie outside the sequence)."""
    b = sparse_block(options)
    left, right = window_reach(options, causal)
    return list(range((c * b - left) // b, (c * b + b - 1 + right) // b + 1))


def global_blocks(options) -> int:
    """BigBird's global blocks: the global tokens rounded up to whole blocks (0 tokens: none)."""
    return -(-options.global_tokens // options.block) if options.kind == "bigbird" else 0


def global_positions(options) -> int:
    """Leading positions that are global (attend to every key and are attended to by every query)."""
    if options.kind == "longformer":
        return options.global_tokens
    return global_blocks(options) * options.block if options.kind == "bigbird" else 0


def sparse_geometry(options, tq: int, tk: int, q_start: int, causal: bool) -> SparseGeometry:
    """The blocks one call of sparse kind ``options.kind`` gathers, queries at q_start .. q_start + tq - 1."""
    b = sparse_block(options)
    first, last = q_start // b, (q_start + tq - 1) // b
    slots = len(window_blocks(options, 0, causal))
    if options.kind == "bigbird":
        slots += options.random + global_blocks(options)
    g = global_positions(options)
    return SparseGeometry(block=b, first=first, q_blocks=last - first + 1, k_blocks=-(-tk // b), slots=slots, tk=tk,
                          columns=options.kind == "strided", shared=min(g, tk) if options.kind == "longformer" else 0,
                          dense_rows=max(0, min(tq, g - q_start)))
