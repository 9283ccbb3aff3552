"""One layer's rolling KV cache: a causal sliding-window layer keeps only the positions its next query can reach.

A query at position p with window w and dilation d reads keys p, p - d, ..., p - (w - 1)·d, so the layer keeps
the last span = (w - 1)·d + 1 positions (tformer.cost.attention_sliding.cache_positions, what the ledger
costs), whatever the length read: its memory is capped by the window, not the sequence.

    k, v     (B, H_kv, held, D)   positions start .. length - 1, held = min(length, span)
    length   positions read (the next token's position)
    start    the position of the first key held (> 0 once older ones were dropped)

The span is one more than the next query reaches back ((w - 1)·d of the w - 1 past keys), so one position
can be forgotten (the measured decode step rewinds one to stay at a fixed context), or any number while
nothing has been dropped yet. Rows cannot join another batch: their positions are not columns.
"""

from __future__ import annotations

import torch

from tformer.cost.attention_sliding import cache_positions


def layer_window(config, layer: int) -> tuple[int, int] | None:
    """(window, dilation) of layer ``layer`` when it runs causal sliding-window attention (the config's kind, or the
    layer's own where layer_types gives each layer one), else None."""
    options = config.attention_options(layer)
    if options.kind != "sliding":
        return None
    return options.window, options.dilation


def layer_windows(config, n_layers: int) -> tuple[tuple[int, int] | None, ...]:
    """Per layer of a stack of ``n_layers``: (window, dilation) of a causal sliding-window layer, else None."""
    return tuple(layer_window(config, i) for i in range(n_layers))


class RollingKV:
    """The last ``span`` positions' keys and values of one layer."""

    joinable = False
    recurrent = False

    def __init__(self, span: int):
        self.span = span
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.length = 0
        self.start = 0

    @classmethod
    def for_window(cls, window: int, dilation: int = 1) -> RollingKV:
        return cls(cache_positions(window, dilation))

    @property
    def held(self) -> int:
        return self.length - self.start

    def update(self, k: torch.Tensor, v: torch.Tensor):
        """Attend over what is held plus k, v (B, H_kv, t, D): returns positions start .. length + t - 1;
        then keep the last ``span`` of them."""
        if self.k is not None:
            k, v = torch.cat([self.k, k], dim=2), torch.cat([self.v, v], dim=2)
        end = self.start + k.shape[2]
        keep = min(k.shape[2], self.span)
        self.k, self.v = k[:, :, k.shape[2] - keep:], v[:, :, v.shape[2] - keep:]
        self.length, self.start = end, end - keep
        return k, v

    # Row operations ---------------------------------------------------------------------------------
    def select(self, index: torch.Tensor) -> None:
        if self.k is not None:
            self.k, self.v = self.k.index_select(0, index), self.v.index_select(0, index)

    def check_rewind(self, n: int) -> None:
        """Raise unless the next query after forgetting ``n`` positions reaches only keys still held."""
        length = max(self.length - n, 0)
        needed = max(length - (self.span - 1), 0)  # the first position the next query can reach
        if n > 0 and self.start > needed:
            most = max(self.length - (self.span - 1) - self.start, 0)
            raise ValueError(f"a rolling KV cache of {self.span} positions has dropped position {self.start - 1}, "
                             f"which rewinding {n} would need again; rewind at most {most} here")

    def rewind(self, n: int) -> None:
        self.check_rewind(n)
        self.length = max(self.length - n, 0)
        if self.k is not None:
            keep = self.length - self.start
            self.k, self.v = self.k[:, :, :keep], self.v[:, :, :keep]

    # A step replaces the tensors, never writes into them: holding them is a snapshot ------------------
    def snapshot(self):
        return self.k, self.v, self.length, self.start

    def restore(self, snapshot) -> None:
        self.k, self.v, self.length, self.start = snapshot

    def tensors(self):
        if self.k is not None:
            yield from (self.k, self.v)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


__all__ = ["RollingKV", "layer_window", "layer_windows"]
