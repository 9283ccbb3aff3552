"""The KV cache: what each layer keeps of the past tokens, so a decode step computes only the new one.

    cache = model.new_cache()                    # one layout per layer, from that layer's attention
    positions = cache.admit(t, attention_mask)   # Stack: take t new tokens (padding kept) -> their position ids
    masks = cache.masks(t, dtype, device, causal=True)  # Stack: per layer, these queries over what it holds
    k, v = cache.update(layer, k, v)             # attention: append this step's keys, read all held
    cache.select(index)                          # keep rows ``index`` (beam search, serving)
    cache.rewind(n)                              # forget the last n positions
    both = cache.join(other)                     # the rows of two caches in one batch, right-aligned

The container holds one layout object per layer, chosen by what that layer's attention needs
(``layer_layout``), so a model whose layers differ (sliding-window layers beside global ones) simply gets a
different object per layer:

    GrowingKV       (growing_cache.py)   every position's keys and values, (B, H_kv, T, head_dim)
    RollingKV       (rolling_cache.py)   a causal sliding-window layer's last (w - 1)·d + 1 positions
    RecurrentState  (recurrent_state.py) linear attention's / Performer's fixed-size state instead of keys

Each layout implements the row operations generation and serving need (select, rewind, snapshot / restore;
the growing one also joins and drops leading columns); the container applies them to every layer and keeps
``length``, the positions read (the next token's position), and per layer the encoder's projected keys and
values of an encoder-decoder's cross-attention (``CrossEntries``, shared with the preallocated SlotCache).

The face Stack sees (``span``, ``admit``, ``masks``, then ``update`` in attention) is every cache's: this one,
the preallocated SlotCache (tformer.model.slot_cache) and ``Uncached`` (a forward that keeps nothing), so the
forward never asks which it holds. A left-padded batch's padding is kept here (``keep``, every position read),
and each row's positions are read off it (real tokens before each): nothing outside the cache tracks them.

There is no eager preallocated layout: asking for ``reserve`` positions makes the growing layers
allocate them at the first write and write each later step in place, which was all the static layout bought
an eager step (no copy of the whole cache per token). Fixed addresses and fixed shapes, what a compiled
graph needs, are the SlotCache's (tformer.model.slot_cache), which the compiled step and serving's pool use.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tformer.model.attention.registry import attention_fn
from tformer.model.growing_cache import GrowingKV
from tformer.model.masks import positions_from_mask, self_attention_mask, tracing
from tformer.model.recurrent_state import RecurrentState
from tformer.model.rolling_cache import RollingKV, layer_window


class CrossEntries:
    """Per layer the encoder's projected keys and values (an encoder-decoder's cross-attention): set by the first
    forward that reads the source, read by every later one. Kept by both cache kinds (``_cross``: one per layer)."""

    _cross: list

    def has_cross(self, layer: int) -> bool:
        return self._cross[layer] is not None

    def get_cross(self, layer: int):
        return self._cross[layer]

    def set_cross(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        self._cross[layer] = (k, v)

    def clear_cross(self) -> None:
        """Forget them: the next forward projects them from the encoder's output again."""
        self._cross = [None] * len(self._cross)

    def _select_cross(self, index: torch.Tensor) -> None:
        self._cross = [None if e is None else (e[0].index_select(0, index), e[1].index_select(0, index))
                       for e in self._cross]


def layer_layout(config, layer: int, reserve: int = 0):
    """What layer ``layer`` of a causal stack under ``config`` keeps: a recurrent state when its attention kind
    decodes from one (it defines ``step``), a rolling window when it is a sliding-window layer, else every
    position (with ``reserve`` positions allocated up front)."""
    options = config.attention_options(layer)
    if hasattr(attention_fn(options.kind), "step"):
        return RecurrentState()
    window = layer_window(config, layer)
    if window is not None:
        return RollingKV.for_window(*window)
    return GrowingKV(reserve)


class Uncached:
    """The face of a cache (``span``, ``admit``, ``masks``) for a forward that keeps nothing: an encoder, a
    training step, a prompt scored once. Every key is this forward's own."""

    keep = None

    def span(self, t: int) -> int:
        return t

    def admit(self, t: int, attention_mask: torch.Tensor | None = None, device=None) -> torch.Tensor:
        self.keep = attention_mask
        return torch.arange(t, device=device)[None]

    def masks(self, t: int, dtype, device, *, causal: bool, score_bias=None, prefix=None, layers: int = 1) -> list:
        return [self_attention_mask(t, 0, 0, self.keep, causal=causal, score_bias=score_bias, prefix=prefix,
                                    dtype=dtype, device=device)] * layers


class KVCache(CrossEntries):
    def __init__(self, layers):
        """layers: a number of layers, each keeping every position (GrowingKV), or one layout object per layer."""
        self.layers = [GrowingKV() for _ in range(layers)] if isinstance(layers, int) else list(layers)
        self.n_layers = len(self.layers)
        self.length = 0  # positions read (every layer agrees once a step completes)
        # (N, length) bool, True = a real token, over every position read; None while no row has padding. A
        # left-padded batch's padding and each row's positions (real tokens before it) are read off it.
        self.keep: torch.Tensor | None = None
        self._columns = None  # ((length, t, device), (t,) columns): the write positions one step shares
        self._cross: list[tuple[torch.Tensor, torch.Tensor] | None] = [None] * self.n_layers

    @classmethod
    def for_config(cls, config, n_layers: int, reserve: int = 0) -> KVCache:
        """The cache of a causal stack of ``n_layers`` under ``config``: each layer's layout from its own settings."""
        return cls([layer_layout(config, i, reserve) for i in range(n_layers)])

    # What a forward of T new tokens reads (the face every cache shows Stack) ---------------------------------
    def span(self, t: int) -> int:
        """Positions read once ``t`` more are (checked against a learned position table's size)."""
        return self.length + t

    def admit(self, t: int, attention_mask: torch.Tensor | None = None, device=None) -> torch.Tensor:
        """Take ``t`` new tokens per row: ``attention_mask`` (N, length + t) 1 = real (Hugging Face's: every position
        read and these), or (N, t) for these alone, or None (all real). Returns their position ids (1|N, t): each
        row counts its real tokens only, so a left-padded row sees the positions it would alone."""
        past = self.length
        if attention_mask is not None:
            width = attention_mask.shape[-1]
            if width == t and past:
                attention_mask = torch.cat([self._keep_or_ones(attention_mask.shape[0], attention_mask.device),
                                            attention_mask.bool()], dim=1)
            elif width != past + t:
                raise ValueError(f"attention mask covers {width} keys but there are {past + t}")
            padded = tracing() or not bool(attention_mask.all())
            self.keep = attention_mask.bool() if padded else None
        elif self.keep is not None:
            self.keep = F.pad(self.keep, (0, t), value=True)
        if self.keep is None:
            return torch.arange(past, past + t, device=device)[None]
        return positions_from_mask(self.keep)[:, past:]

    @property
    def positions(self) -> torch.Tensor | None:
        """(N, length) the position id of every column held (padding: its row's next), None while none is padded."""
        return None if self.keep is None else positions_from_mask(self.keep)

    def _keep_or_ones(self, rows: int, device) -> torch.Tensor:
        return self.keep if self.keep is not None else torch.ones(rows, self.length, dtype=torch.bool, device=device)

    def masks(self, t: int, dtype, device, *, causal: bool, score_bias=None, prefix=None, layers: int = 0) -> list:
        """Per layer the mask of ``t`` new queries over what that layer holds (a rolling layer's keys start later):
        one mask per distinct first position."""
        past = self.length
        found = {start: self_attention_mask(t, past, start, self.keep, causal=causal, score_bias=score_bias,
                                            prefix=prefix, dtype=dtype, device=device)
                 for start in dict.fromkeys(self.starts)}
        return [found[start] for start in self.starts]

    # What attention reads and writes --------------------------------------------------------------------
    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor):
        """Append this step's k, v (B, H_kv, t, D) for ``layer``; return the keys and values it holds followed
        by these: positions ``starts[layer]`` .. length + t - 1."""
        layout = self.layers[layer]
        if getattr(layout, "reserve", 0):  # the columns this step writes, made once for every layer
            key = (self.length, k.shape[2], k.device)
            if self._columns is None or self._columns[0] != key:
                self._columns = (key, torch.arange(self.length, self.length + k.shape[2], device=k.device))
            out = layout.update(k, v, self._columns[1])
        else:
            out = layout.update(k, v)
        if layer == self.n_layers - 1:
            self.length += k.shape[2]
        return out

    def get_state(self, layer: int):
        return getattr(self.layers[layer], "state", None)

    def set_state(self, layer: int, state: tuple[torch.Tensor, ...], new_positions: int) -> None:
        """Keep ``layer``'s recurrent state after a step that read ``new_positions`` more tokens. A cache built
        without the model's per-layer answer (``KVCache(n)``) turns an empty layer into a state here."""
        if not isinstance(self.layers[layer], RecurrentState):
            if self.layers[layer].length:
                raise ValueError(f"layer {layer} of this cache holds keys and values; it cannot take a recurrent state")
            self.layers[layer] = RecurrentState()
        self.layers[layer].set(state, new_positions)
        if layer == self.n_layers - 1:
            self.length += new_positions

    @property
    def starts(self) -> tuple[int, ...]:
        """Per layer the position of the first key it holds (> 0 where a rolling layer has dropped older ones)."""
        return tuple(layout.start for layout in self.layers)

    @property
    def start(self) -> int:
        """The first position any layer still holds."""
        return min(self.starts, default=0)

    @property
    def held(self) -> int:
        """The most positions of keys any layer holds (all read, or a rolling layer's last ones)."""
        return self.length - self.start

    @property
    def recurrent(self) -> bool:
        """Some layer keeps a recurrent state (which ``rewind`` cannot cut back; ``snapshot`` can)."""
        return any(layout.recurrent for layout in self.layers)

    @property
    def reserved(self) -> int:
        """Positions the growing layers allocate up front (0: they concatenate)."""
        return max((getattr(layout, "reserve", 0) for layout in self.layers), default=0)

    # Row operations -------------------------------------------------------------------------------------
    def select(self, index: torch.Tensor) -> None:
        """Keep batch rows ``index`` (N',), in that order: beam search's survivors or its beams of each input,
        the rows of a serving batch still running."""
        for layout in self.layers:
            layout.select(index)
        self._select_cross(index)
        if self.keep is not None:
            self.keep = self.keep.index_select(0, index)

    def rewind(self, n: int) -> None:
        """Forget the last ``n`` positions (the next step reads at that position again); a layer that cannot
        (a rolling one that dropped what it would need, a recurrent state) refuses before any layer changes."""
        if n <= 0:
            return
        for layout in self.layers:
            layout.check_rewind(n)
        for layout in self.layers:
            layout.rewind(n)
        self.length = max(self.length - n, 0)
        if self.keep is not None:
            self.keep = self.keep[:, :self.length]

    @property
    def joinable(self) -> bool:
        """Plain per-position keys and values in every layer, nothing else: rows of two such caches can share one
        batch (``join``). A rolling window, a recurrent state or cross-attention entries cannot."""
        return all(layout.joinable for layout in self.layers) and all(e is None for e in self._cross)

    def join(self, other: KVCache) -> KVCache:
        """A new cache holding the rows of this one then those of ``other``, right-aligned: the shorter is
        left-padded with zero keys up to the longer's length (the caller masks them out)."""
        if not (self.joinable and other.joinable) or self.n_layers != other.n_layers:
            raise ValueError("only plain KV caches of the same model can share a batch (no rolling window, "
                             "recurrent state or cross-attention)")
        length = max(self.length, other.length)
        out = KVCache([GrowingKV.joined(a, b, length) for a, b in zip(self.layers, other.layers)])
        out.length = length
        keeps = [F.pad(c._keep_or_ones(c.rows, c.device), (length - c.length, 0), value=False) for c in (self, other)]
        out.keep = torch.cat(keeps)
        return out

    @property
    def rows(self) -> int:
        """Rows held (0 before the first write)."""
        found = next(self.tensors(), None)
        return 0 if found is None else found.shape[0]

    def compact(self) -> None:
        """Drop the leading columns that are padding in every row (left after the longer rows have left)."""
        if self.keep is None or not self.joinable or self.keep.shape[0] == 0:
            return
        unused = int(self.keep.any(0).long().argmax())
        if unused:
            self.drop_front(unused)

    def drop_front(self, n: int) -> None:
        """Forget the first ``n`` columns of every row (columns no row needs any more: left padding)."""
        if n <= 0:
            return
        if not self.joinable:
            raise ValueError("only a cache of plain keys and values has columns to drop")
        for layout in self.layers:
            layout.drop_front(n)
        self.length -= n
        if self.keep is not None:
            self.keep = self.keep[:, n:]

    def snapshot(self):
        """What ``restore`` needs to return the cache to now: the length and what each layer needs (its state,
        its length; tensors a step replaces rather than writes into are held, not copied)."""
        return self.length, self.keep, [layout.snapshot() for layout in self.layers]

    def restore(self, snapshot) -> None:
        self.length, self.keep, layers = snapshot
        for layout, saved in zip(self.layers, layers):
            layout.restore(saved)

    # Size -------------------------------------------------------------------------------------------------
    def tensors(self):
        for layout in self.layers:
            yield from layout.tensors()
        for entry in self._cross:
            if entry is not None:
                yield from entry

    @property
    def device(self) -> torch.device | None:
        return next((t.device for t in self.tensors()), None)

    @property
    def nbytes(self) -> int:
        """Bytes of the positions each layer holds (or its state), plus the cross-attention entries."""
        cross = sum(t.numel() * t.element_size() for e in self._cross if e is not None for t in e)
        return sum(layout.nbytes for layout in self.layers) + cross

    @property
    def allocated_bytes(self) -> int:
        """Bytes actually allocated (a reserve counts in full from the first write)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())


__all__ = ["CrossEntries", "KVCache", "layer_layout"]
