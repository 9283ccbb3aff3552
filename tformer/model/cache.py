"""The KV cache: keys and values of past tokens, kept so each decode step computes only the new one.

Self-attention entries grow by one position per step; cross-attention entries (encoder-decoder)
are projected once from the encoder output and reused. Two layouts: "growing" concatenates,
"static" pre-allocates ``max_length`` positions and writes in place (no reallocation per step,
stable addresses for compiled graphs). Tensors are (B, H_kv, T, head_dim).

An attention kind that summarises the past in a fixed-size state (linear attention, Performer) keeps
that state per layer instead (``get_state`` / ``set_state``): a tuple of tensors whose first
dimension is the batch, so beam search can reorder it; it cannot be rewound.
"""

from __future__ import annotations

import torch


class KVCache:
    def __init__(self, n_layers: int, max_length: int | None = None):
        self.n_layers = n_layers
        self.max_length = max_length  # None: growing layout
        self.length = 0  # positions held (same for every layer once a step completes)
        self._self: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_layers
        self._cross: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * n_layers
        self._state: list[tuple[torch.Tensor, ...] | None] = [None] * n_layers

    @property
    def static(self) -> bool:
        return self.max_length is not None

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Append this step's k, v (B, H_kv, t, D) for ``layer``; return all keys and values so far."""
        start = self.length
        end = start + k.shape[2]
        entry = self._self[layer]
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

    def get_state(self, layer: int):
        return self._state[layer]

    def set_state(self, layer: int, state: tuple[torch.Tensor, ...], new_positions: int) -> None:
        """Keep ``layer``'s recurrent state after a step that read ``new_positions`` more tokens."""
        self._state[layer] = state
        if layer == self.n_layers - 1:
            self.length += new_positions

    def has_cross(self, layer: int) -> bool:
        return self._cross[layer] is not None

    def get_cross(self, layer: int):
        return self._cross[layer]

    def set_cross(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self._cross[layer] = (k, v)

    def reorder(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (beam search picks which hypotheses survive)."""
        self._self = [None if e is None else (e[0].index_select(0, index), e[1].index_select(0, index)) for e in self._self]
        self._cross = [None if e is None else (e[0].index_select(0, index), e[1].index_select(0, index)) for e in self._cross]
        self._state = [None if e is None else tuple(t.index_select(0, index) for t in e) for e in self._state]

    def rewind(self, n: int) -> None:
        """Forget the last ``n`` positions of self-attention (the next step overwrites them)."""
        if n and any(e is not None for e in self._state):
            raise ValueError("a recurrent attention state sums every position read; it cannot forget the last ones")
        self.length = max(self.length - n, 0)
        if not self.static:  # the growing layout appends to what it holds: cut it back
            self._self = [None if e is None else (e[0][:, :, : self.length], e[1][:, :, : self.length])
                          for e in self._self]

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
                    total += t[:, :, : self.length].numel() * t.element_size()
        for entry in self._cross + self._state:
            if entry is not None:
                total += sum(t.numel() * t.element_size() for t in entry)
        return total

    @property
    def allocated_bytes(self) -> int:
        """Bytes actually allocated (a static cache reserves max_length positions up front)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())
