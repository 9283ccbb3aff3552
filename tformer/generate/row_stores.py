"""Where the decode loop's rows keep their keys and values (tformer.generate.decode_loop): three stores, one face.

    store.join(rows)          rows that have read their prompt: place those still going (``finish_reason`` None),
                              free the others
    store.step(rows) -> (N, V) one model step, row i reading ``rows[i].next``
    store.leave(rows)         rows that ended: free their places
    store.keeps_places        True: ended rows stay in the batch, reading the filler (generate's fixed batch)

- ``BatchRows``: generate's batch, one cache from ``runner.new_cache`` (growing, reserved, or the compiled
  runner's preallocated one), prefilled once for every row; rows keep their places to the end.
- ``PoolRows``: serving's KV pool (tformer.generate.slot_pool): a row takes a slot when admitted, reads its
  prompt in chunks, and gives the slot back when it ends; the step runs over the pool's bucketed rows.
- ``JoinedRows``: serving's other models (encoder-decoder, recurrent states): newcomers are prefilled as one
  padded batch in a cache of their own, which joins the running one; rows that end are selected away.
"""

from __future__ import annotations

import torch

from tformer.generate.inputs import pad_batch
from tformer.generate.slot_pool import SlotPool
from tformer.model.runners import Cache, Runner


class BatchRows:
    keeps_places = True

    def __init__(self, runner: Runner, cache: Cache):
        self.runner, self.cache = runner, cache

    def join(self, rows) -> None:
        """The prefill put every row in the cache already."""

    def step(self, rows) -> torch.Tensor:
        return _runner_step(self.runner, self.cache, rows)

    def leave(self, rows) -> None:
        """Rows keep their places; nothing to free."""


class PoolRows:
    keeps_places = False

    def __init__(self, pool: SlotPool, filler: int):
        self.pool, self.filler = pool, filler
        self.slot: dict = {}  # row -> its slot, from take() until it ends

    def take(self, row) -> int:
        """A slot for a newcomer (its prompt is then read into it, chunk by chunk, by the batcher)."""
        self.slot[row] = self.pool.take()
        return self.slot[row]

    def join(self, rows) -> None:
        self.leave([r for r in rows if r.finish_reason is not None])

    def step(self, rows) -> torch.Tensor:
        slots = [self.slot[r] for r in rows]
        logits = self.pool.step({s: r.next for s, r in zip(slots, rows)}, self.filler)
        return logits.index_select(0, torch.tensor(slots, device=logits.device))

    def leave(self, rows) -> None:
        for row in rows:
            self.pool.give(self.slot.pop(row))

    def context(self, rows) -> int:
        """The longest row's columns (the step's statistics)."""
        return max(self.pool.used[self.slot[r]] for r in rows)


class JoinedRows:
    keeps_places = False

    def __init__(self, runner: Runner):
        self.runner = runner
        self.cache: Cache | None = None  # the running rows', in the order of ``rows``
        self.rows: list = []
        self._new: Cache | None = None  # the newcomers', from prefill() until join()

    @property
    def joinable(self) -> bool:
        """Whether newcomers can join now (a recurrent state cannot line up with another batch's)."""
        return self.cache is None or self.cache.joinable

    def prefill(self, prompts: list[list[int]], pad: int, start_token: int | None) -> tuple[torch.Tensor, int]:
        """Read the newcomers' prompts (an encoder-decoder's sources, its decoder at ``start_token``) as one padded
        batch -> (their next-token logits (N, V), the real tokens read)."""
        runner, device = self.runner, self.runner.device
        self._new = runner.new_cache(len(prompts), None)
        if runner.takes_source:
            src, src_mask = pad_batch(prompts, pad, "right", device)
            start = torch.full((len(prompts), 1), start_token, dtype=torch.long, device=device)
            return runner.prefill(self._new, start, source=src, source_mask=src_mask), int(src_mask.sum()) + len(prompts)
        ids, mask = pad_batch(prompts, pad, "left", device)
        return runner.prefill(self._new, ids, mask), int(mask.sum())

    def join(self, rows) -> None:
        new, self._new = self._new, None
        keep = [i for i, r in enumerate(rows) if r.finish_reason is None]
        if not keep:
            return
        if len(keep) < len(rows):
            new.select(torch.tensor(keep, device=self.runner.device))
        self.cache = new if self.cache is None else self.cache.join(new)
        self.rows += [rows[i] for i in keep]

    def step(self, rows) -> torch.Tensor:
        return _runner_step(self.runner, self.cache, rows)

    def leave(self, rows) -> None:
        ended = set(map(id, rows))
        keep = [i for i, r in enumerate(self.rows) if id(r) not in ended]
        if not keep:
            self.cache, self.rows = None, []
            return
        self.cache.select(torch.tensor(keep, device=self.runner.device))
        self.cache.compact()
        self.rows = [self.rows[i] for i in keep]

    def context(self, rows) -> int:
        kv = getattr(self.cache, "kv", None)
        return kv.length if kv is not None else 0


def _runner_step(runner: Runner, cache: Cache, rows) -> torch.Tensor:
    """The runner's step on a cache whose row i is ``rows[i]``: (N,) tokens -> (N, V) logits."""
    return runner.step(cache, torch.tensor([r.next for r in rows], dtype=torch.long, device=runner.device))


__all__ = ["BatchRows", "JoinedRows", "PoolRows"]
