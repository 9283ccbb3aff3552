"""The one loop that steps a model: `generate` and the serving batcher both decode through it.

    loop = DecodeLoop(store, filler)         # store: where the rows' keys live (tformer.generate.row_stores)
    first = loop.join(rows, logits)          # rows whose prompt the store has read, with its last logits (N, V)
    while loop.live:
        tokens = loop.step()                 # one model step over every row -> the tokens picked (N,)

One step: the store runs the model once over its rows (``store.step``: runner.step on a cache, or the serving
pool's step, compiled or not), each row's next token is picked, and each row is told it (``Row.took``). A row
ends at a stop token ("stop"), when its budget of new tokens is spent ("length"), or when the row itself says so
(serving: "cancelled", "timeout"); the store then lets it go, or, for a batch whose rows must keep their places
(generate's), carries it along reading the filler token so nobody else's arithmetic changes.

Generation is this loop with a fixed set of rows, all joining at once; serving is the same loop with rows
joining between steps and leaving as soon as they end; a compiled step is the same step, compiled inside the
store. Beam search keeps its own loop (tformer.generate.beam): its rows are hypotheses that are reordered,
not sequences that end.

Picking: rows that share one Sampling record and one generator are picked together in one call (generate's
batch: one draw for all B rows, the same random numbers as before), every other row alone with its own
generator (a served request draws what it would draw alone); plain greedy rows share one argmax.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tformer.generate.sampling import Sampling


@dataclass(eq=False, kw_only=True)
class Row:
    """One sequence as it decodes. ``tokens`` holds its new tokens, the stop token left out."""

    budget: int = 0  # new tokens it may have
    stop: frozenset = frozenset()  # token ids that end it
    sampling: Sampling = Sampling()
    generator: torch.Generator | None = None
    seen: torch.Tensor | None = None  # (V,) bool: the text so far, for the repetition penalty
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    next: int = 0  # the token it reads at the next step

    def ending(self, now: float) -> str | None:
        """A reason to end before taking this step's token (serving: the client went away); None goes on."""
        return None

    def expired(self, now: float) -> bool:
        """Whether it has run past its time after taking a token (serving's timeout)."""
        return False

    def took(self, token: int, now: float) -> None:
        """Told of each new token it keeps (serving streams it)."""

    def finished(self, reason: str) -> None:
        """Told once when it ends."""


class DecodeLoop:
    def __init__(self, store, filler: int, on_step: Callable[[int, float], None] | None = None):
        """store: the rows' cache (``join(rows)``, ``step(rows) -> logits (N, V)``, ``leave(rows)``,
        ``keeps_places``); filler: the token a finished row reads where it must keep its place;
        on_step(rows, seconds): told after each model step (serving's statistics)."""
        self.store, self.filler, self.on_step = store, filler, on_step
        self.rows: list[Row] = []  # in the store's order

    @property
    def live(self) -> bool:
        return any(r.finish_reason is None for r in self.rows)

    def join(self, rows: list[Row], logits: torch.Tensor) -> torch.Tensor:
        """Rows whose prompt the store has just read, with their next-token logits (N, V): pick each one's first
        token; those still going join the loop (the store is asked to place them). Returns the tokens (N,)."""
        tokens = self._take(rows, logits)
        self.store.join(rows)
        self.rows += rows if self.store.keeps_places else [r for r in rows if r.finish_reason is None]
        return tokens

    def step(self) -> torch.Tensor:
        """One model step over every row -> the tokens picked (N,), the filler for rows that had ended."""
        t0 = time.perf_counter()
        logits = self.store.step(self.rows)
        if self.on_step is not None:
            self.on_step(len(self.rows), time.perf_counter() - t0)
        tokens = self._take(self.rows, logits)
        ended = [r for r in self.rows if r.finish_reason is not None]
        if ended and not self.store.keeps_places:
            self.store.leave(ended)
            self.rows = [r for r in self.rows if r.finish_reason is None]
        return tokens

    def reset(self) -> None:
        """Drop every row (the store frees their places)."""
        if self.rows:
            self.store.leave(self.rows)
        self.rows = []

    def _take(self, rows: list[Row], logits: torch.Tensor) -> torch.Tensor:
        """Pick, then end or keep each row; a row that had ended reads the filler."""
        tokens = _pick(rows, logits)
        now = time.monotonic()
        values = tokens.tolist()
        filled = False
        for i, (row, token) in enumerate(zip(rows, values)):
            if row.finish_reason is not None:
                values[i], filled = self.filler, True
                continue
            reason = row.ending(now)
            if reason is None and token in row.stop:
                reason = "stop"
            if reason is None:
                row.tokens.append(token)
                row.took(token, now)
                if len(row.tokens) >= row.budget:
                    reason = "length"
                elif row.expired(now):
                    reason = "timeout"
            if row.seen is not None:
                row.seen[token] = True
            row.next = token if reason is None else self.filler
            if reason is not None:
                row.finish_reason = reason
                row.finished(reason)
        if filled:
            tokens = torch.tensor(values, dtype=tokens.dtype, device=tokens.device)
        return tokens


def _pick(rows: list[Row], logits: torch.Tensor) -> torch.Tensor:
    """(N, V) logits -> (N,) tokens: plain greedy rows by one argmax, the others grouped by (Sampling record,
    generator) and picked a group at a time, so a batch that shares one generator draws as one batch."""
    logits = logits.float()
    tokens = logits.argmax(dim=-1)
    groups: dict[tuple[int, int], list[int]] = {}
    for i, row in enumerate(rows):
        if not (row.sampling.greedy and row.seen is None):
            groups.setdefault((id(row.sampling), id(row.generator)), []).append(i)
    for index in groups.values():
        row = rows[index[0]]
        whole = len(index) == len(rows)
        part = logits if whole else logits[index]
        seen = None
        if row.seen is not None:
            seen = torch.stack([rows[i].seen for i in index])
        picked = row.sampling.pick(part, row.generator, seen)
        if whole:
            tokens = picked
        else:
            tokens[index] = picked
    return tokens


__all__ = ["DecodeLoop", "Row"]
