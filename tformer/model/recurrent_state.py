"""One layer's recurrent attention state: a kind that summarises the past in a fixed-size state (linear
attention, Performer: tformer.model.attention.kernelized) keeps that instead of keys and values.

    state    a tuple of tensors, each (B, ...): the batch first, so rows can be selected
    length   positions folded into it

Its size does not grow with the positions read, and it cannot forget one: the state is a sum over every
position. The measured decode step takes a ``snapshot`` and puts it back instead of rewinding.
"""

from __future__ import annotations

import torch


class RecurrentState:
    joinable = False  # a sum over a row's positions has no columns to line up with another batch's
    recurrent = True
    start = 0  # the state stands for every position from the first

    def __init__(self):
        self.state: tuple[torch.Tensor, ...] | None = None
        self.length = 0

    @property
    def held(self) -> int:
        return self.length

    def update(self, k, v):
        raise ValueError("this layer keeps a recurrent attention state, not keys and values; "
                         "its attention kind writes the state (set_state)")

    def set(self, state: tuple[torch.Tensor, ...], new_positions: int) -> None:
        """The state after a step that folded in ``new_positions`` more positions (a new tuple: the old one
        is left intact, which is what makes ``snapshot`` free)."""
        self.state = state
        self.length += new_positions

    # Row operations ---------------------------------------------------------------------------------
    def select(self, index: torch.Tensor) -> None:
        if self.state is not None:
            self.state = tuple(t.index_select(0, index) for t in self.state)

    def check_rewind(self, n: int) -> None:
        if n > 0 and self.state is not None:
            raise ValueError("a recurrent attention state sums every position read; it cannot forget the last ones")

    def rewind(self, n: int) -> None:
        self.check_rewind(n)

    def snapshot(self):
        return self.state, self.length

    def restore(self, snapshot) -> None:
        self.state, self.length = snapshot

    def tensors(self):
        if self.state is not None:
            yield from self.state

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())


__all__ = ["RecurrentState"]
