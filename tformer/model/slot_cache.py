"""The preallocated KV cache: every row a slot of ``L`` columns, written in place at positions held in tensors.

The eager cache (tformer.model.cache.KVCache) hands attention keys as long as the sequence, so every shape
grows by one each token and the mask is rebuilt from Python numbers. Here nothing changes shape from one step
to the next, which is what lets ``torch.compile`` trace the model's own forward once and replay it for every
token (Hugging Face's static cache does the same), and lets rows of different lengths share a step (serving):

    k, v       per layer (N, H_kv, L, D)   allocated once; a forward hands back the whole buffers
    lengths    (N,) long                   columns written in each row: T new tokens go to lengths .. lengths+T-1
    positions  (N,) long                   each row's next position id (a left-padded row counts real tokens only)
    keep       (N, L) bool                 False at padding columns

A query at column q sees column c of its row iff c <= q, keep[c], and c lies in the layer's window (the
column distance q - c, as tformer.model.attention.sliding defines it), plus its own column always: a padding
query then attends to itself rather than to nothing, so no row of the softmax is empty (its output is never
read). Columns past a row's length hold stale or zero keys; they are hidden, and reading all L costs
(L - length) wasted keys per step, which is why callers size L to what they need, rounded to a few lengths.

Nothing here reads a tensor's value into Python: lengths live on the device, and whoever drives the cache
(a runner, the serving loop) keeps its own count of the columns used.
"""

from __future__ import annotations

import torch

from tformer.core.errors import TformerError
from tformer.model.attention.sliding import in_window
from tformer.model.cache import CrossEntries
from tformer.model.masks import AttentionMask, positions_from_mask
from tformer.model.rolling_cache import layer_windows


class SlotCache(CrossEntries):
    """Preallocated keys and values of ``rows`` sequences (see the module docstring for the layout)."""

    recurrent = False  # as KVCache.recurrent: positions can be rewound (the measured decode step does)
    joinable = False  # as KVCache.joinable: serving's pool gives each request a row instead of joining batches

    def __init__(self, buffers: list, windows: tuple, lengths: torch.Tensor, positions: torch.Tensor,
                 keep: torch.Tensor, cross: list | None = None, pool=None):
        """buffers: per layer (k, v) of (N, H_kv, L, D); windows: per layer as ``layer_windows``; cross: per
        layer the encoder's projected (k, v) of an encoder-decoder model (set by its first forward), or None;
        pool(rows): buffers to move into when beam search changes the number of rows (compiled graphs read
        fixed addresses on CUDA), else select allocates anew."""
        self.buffers, self.windows = list(buffers), windows
        self.lengths, self.positions, self.keep = lengths, positions, keep
        self.n_layers = len(self.buffers)
        self._cross = list(cross) if cross is not None else [None] * self.n_layers
        self._pool = pool

    @classmethod
    def allocate(cls, config, n_layers: int, rows: int, length: int, dtype, device, buffers=None,
                 pool=None) -> SlotCache:
        """An empty cache of ``rows`` x ``length`` columns for a stack of ``n_layers`` of ``config``; buffers:
        per layer (k, v) to write into instead of allocating (a compiled step's, kept between generations)."""
        if buffers is None:
            shape = (rows, config.n_kv_heads, length, config.head_dim)
            buffers = [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                       for _ in range(n_layers)]
        zero = torch.zeros(rows, dtype=torch.long, device=device)
        keep = torch.ones(rows, length, dtype=torch.bool, device=device)
        return cls(buffers, layer_windows(config, n_layers), zero, zero.clone(), keep, pool=pool)

    @property
    def rows(self) -> int:
        return self.buffers[0][0].shape[0]

    @property
    def columns(self) -> int:
        return self.buffers[0][0].shape[2]

    # What a forward of T new tokens reads (the face every cache shows Stack: tformer.model.cache) ----------
    def span(self, t: int) -> None:
        """Positions after ``t`` more tokens, where known on the host: never here (the lengths stay on the device;
        the columns allocated bound them)."""
        return None

    def admit(self, t: int, attention_mask: torch.Tensor | None = None, device=None) -> torch.Tensor:
        """Take ``t`` new tokens of every row: their padding (``attention_mask``'s last t columns, 1 = real; None:
        all real) goes into ``keep`` at the columns they will be written to, and each row's next position moves
        past its real ones. Returns their position ids (N, t) (a padding token gets its row's next one)."""
        if attention_mask is None:
            ids = self.positions[:, None] + torch.arange(t, device=self.positions.device)
            self.positions.add_(t)
            return ids
        real = attention_mask[:, -t:].to(self.keep.device)
        q = self.lengths[:, None] + torch.arange(t, device=self.keep.device)  # (N, t): the columns written
        rows = torch.arange(q.shape[0], device=q.device)[:, None].expand_as(q)
        self.keep.index_put_((rows, q), real.bool())
        ids = self.positions[:, None] + positions_from_mask(real)
        self.positions.add_(real.long().sum(-1))
        return ids

    def masks(self, t: int, dtype: torch.dtype, device=None, *, causal: bool = True, score_bias=None, prefix=None,
              layers: int = 0) -> list:
        """Per layer the mask (AttentionMask.given: one additive bias (N, 1|H, T, L)) of ``t`` new queries: 0 where
        a query may attend, -inf elsewhere, plus the position bias (ALiBi, T5's buckets) of
        ``score_bias(q_cols, k_cols)``. Layers with the same window share one tensor."""
        if not causal or prefix is not None:
            raise TformerError("a preallocated KV cache keeps a causal decoder's keys; a bidirectional or prefix LM "
                               "mask is not held in it (decode it with the growing cache)")
        device = self.keep.device
        cols = torch.arange(self.columns, device=device)
        q = self.lengths[:, None] + torch.arange(t, device=device)  # (N, T): the columns the queries write
        delta = q[:, :, None] - cols  # (N, T, L)
        own = delta == 0
        base = (delta >= 0) & self.keep[:, None, :]
        position = None
        if score_bias is not None:  # (1, H, N*T, L) from flat query columns -> (N, H, T, L)
            flat = score_bias(q.reshape(-1), cols)
            position = flat.reshape(flat.shape[1], q.shape[0], t, -1).transpose(0, 1).to(dtype)
        zero = torch.zeros((), dtype=dtype, device=device)
        found: dict = {}
        for window in dict.fromkeys(self.windows):
            allowed = base if window is None else base & in_window(delta, window[0], window[1], causal=True)
            bias = torch.where(allowed | own, zero, float("-inf"))[:, None]  # (N, 1, T, L)
            found[window] = AttentionMask.given(bias if position is None else bias + position)
        return [found[w] for w in self.windows]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Write this forward's k, v (N, H_kv, T, D) at each row's next columns; return the whole buffers
        (N, H_kv, L, D). The last layer's write advances every row by T."""
        t = k.shape[2]
        q = self.lengths[:, None] + torch.arange(t, device=k.device)  # (N, T)
        rows = torch.arange(k.shape[0], device=k.device)[:, None].expand_as(q)
        kb, vb = self.buffers[layer]
        # (N, H, L, D) seen as (N, L, H, D): one (row, column) index pair writes a whole (H, D) slice
        kb.transpose(1, 2).index_put_((rows, q), k.transpose(1, 2))
        vb.transpose(1, 2).index_put_((rows, q), v.transpose(1, 2))
        if layer == self.n_layers - 1:
            self.lengths.add_(t)
        return kb, vb

    def cross_entries(self) -> list:
        return list(self._cross)

    # Row operations -----------------------------------------------------------------------------------
    def select(self, index: torch.Tensor) -> None:
        """Keep rows ``index`` (beam search's survivors, or the rows still running), in that order."""
        if self._pool is not None:
            into = self._pool(index.numel())
            for (k, v), (kb, vb) in zip(into, self.buffers):
                k.copy_(kb.index_select(0, index))
                v.copy_(vb.index_select(0, index))
            self.buffers = list(into)
        else:
            self.buffers = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.buffers]
        self.lengths, self.positions = self.lengths[index], self.positions[index]
        self.keep = self.keep[index]
        self._select_cross(index)

    def rewind(self, n: int) -> None:
        """Forget the last ``n`` columns of every row (the next forward writes them again)."""
        self.lengths.sub_(n)
        self.positions.sub_(n)

    # A pool of rows (serving's, tformer.generate.slot_pool): rows taken, given back, read in parts ------------
    def reset(self, row: int) -> None:
        """Row ``row`` empty again: nothing written, the next token at position 0, no padding."""
        self.lengths[row] = 0
        self.positions[row] = 0
        self.keep[row] = True

    def set_read(self, rows: torch.Tensor, counts: torch.Tensor) -> None:
        """Rows ``rows`` (n,) have read ``counts`` (n,) tokens each, no padding: put back the lengths of rows a
        step carried along (a free row's, or one still reading its prompt, written at a column it will rewrite)."""
        self.lengths.index_copy_(0, rows, counts)
        self.positions.index_copy_(0, rows, counts)

    def view(self, rows: slice, columns: int) -> SlotCache:
        """Rows ``rows`` and the first ``columns`` columns, as a cache whose writes land in this one."""
        buffers = [(k[rows, :, :columns], v[rows, :, :columns]) for k, v in self.buffers]
        return SlotCache(buffers, self.windows, self.lengths[rows], self.positions[rows], self.keep[rows, :columns])

    def gather(self, rows: torch.Tensor, columns: int) -> SlotCache:
        """A copy of rows ``rows`` (n,) over the first ``columns`` columns (a prefill of a few rows among many
        reads only theirs); ``scatter`` writes it back."""
        buffers = [(k[:, :, :columns].index_select(0, rows), v[:, :, :columns].index_select(0, rows))
                   for k, v in self.buffers]
        return SlotCache(buffers, self.windows, self.lengths.index_select(0, rows),
                         self.positions.index_select(0, rows), self.keep[:, :columns].index_select(0, rows))

    def scatter(self, rows: torch.Tensor, part: SlotCache, counts: torch.Tensor) -> None:
        """Write ``part`` (from ``gather(rows, ...)``) back into rows ``rows``, each having read ``counts``."""
        columns = part.columns
        for (k, v), (pk, pv) in zip(self.buffers, part.buffers):
            k[:, :, :columns].index_copy_(0, rows, pk)
            v[:, :, :columns].index_copy_(0, rows, pv)
        self.keep[:, :columns].index_copy_(0, rows, part.keep)  # a padded chunk's padding, as admitted in the copy
        self.set_read(rows, counts)

    def row_entries(self, row: int, n: int) -> list:
        """Copies of row ``row``'s first ``n`` columns: per layer (k, v) of (H_kv, n, D)."""
        return [(k[row, :, :n].clone(), v[row, :, :n].clone()) for k, v in self.buffers]

    def write_entries(self, row: int, entries: list, n: int) -> None:
        """Put ``entries`` (as ``row_entries`` gives, at least ``n`` columns) into the empty row ``row``: it has
        read those ``n`` tokens."""
        for (k, v), (ek, ev) in zip(self.buffers, entries):
            k[row, :, :n] = ek[:, :n]
            v[row, :, :n] = ev[:, :n]
        self.lengths[row] = n
        self.positions[row] = n

    def tensors(self):
        for entry in self.buffers + self._cross:
            if entry is not None:
                yield from entry

    @property
    def allocated_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    # Read back to the host (a sync on a GPU: for reports and checks, not for every step) --------------
    @property
    def length(self) -> int:
        """The most columns any row has written."""
        return int(self.lengths.max()) if self.rows else 0

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values written (each row's columns), plus the cross-attention entries."""
        k = self.buffers[0][0]
        per_column = 2 * self.n_layers * k.shape[1] * k.shape[3] * k.element_size()
        cross = sum(t.numel() * t.element_size() for e in self._cross if e is not None for t in e)
        return int(self.lengths.sum()) * per_column + cross


__all__ = ["SlotCache", "layer_windows"]
