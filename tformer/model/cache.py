"""The KV cache: keys and values of past tokens, kept so each decode step computes only the new one.

Self-attention entries grow by one position per step; cross-attention entries (encoder-decoder)
are projected once from the encoder output and reused. Two layouts: "growing" concatenates,
"static" pre-allocates ``max_length`` positions and writes in place (no reallocation per step,
stable addresses for compiled graphs). Tensors are (B, H_kv, T, head_dim).

An attention kind that summarises the past in a fixed-size state (linear attention, Performer) keeps
that state per layer instead (``get_state`` / ``set_state``): a tuple of tensors whose first
dimension is the batch, so beam search can reorder it; it cannot be rewound.

A rolling cache (``window`` set: causal sliding-window attention) holds only the last ``window``
positions of each layer, whatever the length read: ``length`` still counts every position read (the
next token's position), ``held`` the positions kept, and the keys held start at position ``start``.
"""

from __future__ import annotations

import torch


class CrossEntries:
    """Per layer the encoder's projected keys and values (an encoder-decoder's cross-attention): set by the first
    forward that reads the source, read by every later one. Kept by both cache layouts (``_cross``: one per layer)."""

    _cross: list

    def has_cross(self, layer: int) -> bool:
        return self._cross[layer] is not None

    def get_cross(self, layer: int):
        return self._cross[layer]

    def set_cross(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self._cross[layer] = (k, v)


class KVCache(CrossEntries):
    def __init__(self, n_layers: int, max_length: int | None = None, window: int | None = None,
                 buffers: list | None = None, pool=None):
        """buffers: per layer (k, v) tensors of max_length positions to write into instead of allocating
        (a compiled step's preallocated cache, reused across generations); pool(rows) gives the buffers
        to move into when beam search changes the number of rows (else reorder allocates anew)."""
        self.n_layers = n_layers
        self.max_length = max_length  # None: growing layout
        self.window = window  # None: keep every position; else a rolling cache of this many
        self.length = 0  # positions read (same for every layer once a step completes)
        self.start = 0  # position of the first key held (> 0 once a rolling cache has dropped older ones)
        self._self: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_layers
        self._cross: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_layers
        self._state: list[tuple[torch.Tensor, ...] | None] = [None] * n_layers
        self._pool = pool
        if buffers is not None:
            if max_length is None or window is not None or len(buffers) != n_layers:
                raise ValueError("preallocated buffers need a static cache of max_length positions, one pair per layer")
            self._self = list(buffers)

    @property
    def static(self) -> bool:
        return self.max_length is not None

    @property
    def held(self) -> int:
        """Positions of self-attention keys held per layer (all read, or a rolling cache's last ``window``)."""
        return self.length - self.start

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Append this step's k, v (B, H_kv, t, D) for ``layer``; return the keys and values held
        before it followed by these (a rolling cache: positions ``start`` .. length + t - 1)."""
        start = self.length
        end = start + k.shape[2]
        entry = self._self[layer]
        if self.window is not None:
            return self._roll(layer, k, v, end)
        if self.static:
            if end > self.max_length:
                raise ValueError(f"static KV cache holds {self.max_length} positions; step needs {end}")
            if entry is None:
                shape = (k.shape[0], k.shape[1], self.max_length, k.shape[3])
                entry = (k.new_zeros(shape), v.new_zeros(shape))
                self._self[layer] = entry
            entry[0][:, :, start:end] = k
            entry[1][:, :, start:end] = v
            k_all, v_all = entry[0][:, :, :end], entry[1][:, :, :end]
        else:
            if entry is not None:
                k = torch.cat([entry[0], k], dim=2)
                v = torch.cat([entry[1], v], dim=2)
            self._self[layer] = (k, v)
            k_all, v_all = k, v
        if layer == self.n_layers - 1:
            self.length = end
        return k_all, v_all

    def _roll(self, layer: int, k: torch.Tensor, v: torch.Tensor, end: int):
        """Rolling layout: attend over what is held plus the new positions, keep the last ``window``.
        Static: one buffer of ``window`` positions per layer, rewritten in place."""
        if self.static and end > self.max_length:
            raise ValueError(f"static KV cache holds {self.max_length} positions; step needs {end}")
        held, entry = self.held, self._self[layer]
        if entry is not None:
            k = torch.cat([entry[0][:, :, :held], k], dim=2)
            v = torch.cat([entry[1][:, :, :held], v], dim=2)
        keep = min(k.shape[2], self.window)
        if self.static:
            if entry is None:
                shape = (k.shape[0], k.shape[1], self.window, k.shape[3])
                entry = self._self[layer] = (k.new_zeros(shape), v.new_zeros(shape))
            entry[0][:, :, :keep] = k[:, :, k.shape[2] - keep:]
            entry[1][:, :, :keep] = v[:, :, v.shape[2] - keep:]
        else:
            self._self[layer] = (k[:, :, k.shape[2] - keep:], v[:, :, v.shape[2] - keep:])
        if layer == self.n_layers - 1:
            self.length, self.start = end, end - keep
        return k, v

    def self_entries(self) -> list:
        """Per layer the self-attention (k, v) tensors as held (a static cache: the whole buffers)."""
        return list(self._self)

    def get_state(self, layer: int):
        return self._state[layer]

    def set_state(self, layer: int, state: tuple[torch.Tensor, ...], new_positions: int) -> None:
        """Keep ``layer``'s recurrent state after a step that read ``new_positions`` more tokens."""
        self._state[layer] = state
        if layer == self.n_layers - 1:
            self.length += new_positions

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (beam search picks which hypotheses survive)."""
        if self._pool is not None:  # stay in preallocated buffers: their addresses are what a compiled step reads
            into = self._pool(index.numel())
            for e, (k, v) in zip(self._self, into):
                k.copy_(e[0].index_select(0, index))
                v.copy_(e[1].index_select(0, index))
            self._self = list(into)
        else:
            self._self = [None if e is None else (e[0].index_select(0, index), e[1].index_select(0, index))
                          for e in self._self]
        self._cross = [None if e is None else (e[0].index_select(0, index), e[1].index_select(0, index)) for e in self._cross]
        self._state = [None if e is None else tuple(t.index_select(0, index) for t in e) for e in self._state]

    def rewind(self, n: int) -> None:
        """Forget the last ``n`` positions of self-attention (the next step overwrites them)."""
        if n and self.recurrent:
            raise ValueError("a recurrent attention state sums every position read; it cannot forget the last ones")
        if self.window is not None and n > 0:
            self._rewind_rolling(n)
            return
        self.length = max(self.length - n, 0)
        if not self.static:  # the growing layout appends to what it holds: cut it back
            self._self = [None if e is None else (e[0][:, :, : self.length], e[1][:, :, : self.length])
                          for e in self._self]

    def _rewind_rolling(self, n: int) -> None:
        """A rolling cache keeps one position more than a query's window reaches back, (w - 1)·d + 1
        positions for w - 1 past keys: it can forget one position (the measured decode step rewinds one
        to stay at a fixed context), or any number while nothing has been dropped yet."""
        first, length = self.start, max(self.length - n, 0)
        needed = max(length - (self.window - 1), 0)  # the first position the next query can reach
        if first > needed:
            most = max(self.length - (self.window - 1) - first, 0)
            raise ValueError(f"a rolling KV cache of {self.window} positions has dropped position {first - 1}, which "
                             f"rewinding {n} would need again; rewind at most {most} here")
        keep = length - first
        self.length = length
        if not self.static:
            self._self = [None if e is None else (e[0][:, :, :keep], e[1][:, :, :keep]) for e in self._self]

    @property
    def joinable(self) -> bool:
        """Plain per-position keys and values, nothing else: rows of two such caches can share one batch
        (``join_rows``). A rolling window, a recurrent state or cross-attention entries cannot. Ask it of a
        cache that has read tokens: an empty one holds no state yet to tell."""
        return self.window is None and not self.recurrent and all(e is None for e in self._cross)

    def drop_front(self, n: int) -> None:
        """Forget the first ``n`` positions of every row (columns no row needs any more: left padding)."""
        if n <= 0:
            return
        self._self = [None if e is None else (e[0][:, :, n:self.length], e[1][:, :, n:self.length]) for e in self._self]
        self.length -= n
        self.max_length = None  # what is left is the growing layout

    @property
    def recurrent(self) -> bool:
        """Some layer keeps a recurrent state (which ``rewind`` cannot cut back; ``snapshot`` can)."""
        return any(e is not None for e in self._state)

    def snapshot(self):
        """What ``restore`` needs to return the cache to now: the length and each layer's state (the
        state tensors are replaced, never written in place, so holding them is enough). Keys and
        values are not copied: rewind them instead."""
        return self.length, list(self._state)

    def restore(self, snapshot) -> None:
        self.length, states = snapshot
        self._state = list(states)

    def tensors(self):
        for entry in self._self + self._cross + self._state:
            if entry is not None:
                yield from entry

    @property
    def nbytes(self) -> int:
        """Bytes of the self-attention cache in use (positions held), plus the cross-attention cache."""
        total = 0
        for entry in self._self:
            if entry is not None:
                for t in entry:
                    total += t[:, :, : self.held].numel() * t.element_size()
        for entry in self._cross + self._state:
            if entry is not None:
                total += sum(t.numel() * t.element_size() for t in entry)
        return total

    @property
    def allocated_bytes(self) -> int:
        """Bytes actually allocated (a static cache reserves max_length positions up front)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())


def join_rows(a: KVCache, b: KVCache) -> KVCache:
    """One growing cache holding the rows of ``a`` then those of ``b``, right-aligned: the shorter is
    left-padded with zero keys and values up to the longer's length (the caller masks them out).
    (N_a, H, L_a, D) + (N_b, H, L_b, D) -> (N_a + N_b, H, max(L_a, L_b), D) per layer."""
    if not (a.joinable and b.joinable) or a.n_layers != b.n_layers:
        raise ValueError("only plain KV caches of the same model can share a batch (no rolling window, "
                         "recurrent state or cross-attention)")
    length = max(a.length, b.length)
    out = KVCache(a.n_layers)
    for i, (ea, eb) in enumerate(zip(a._self, b._self)):
        if ea is None or eb is None:
            continue
        pairs = []
        for x, y in zip(ea, eb):
            x, y = x[:, :, : a.length], y[:, :, : b.length]
            x = torch.nn.functional.pad(x, (0, 0, length - a.length, 0))
            y = torch.nn.functional.pad(y, (0, 0, length - b.length, 0))
            pairs.append(torch.cat([x, y], dim=0))
        out._self[i] = (pairs[0], pairs[1])
    out.length = length
    return out
