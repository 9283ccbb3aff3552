"""Serving's KV pool: one preallocated cache (tformer.model.slot_cache) of S rows x L columns for the whole
server. A sequence takes a row (a slot) when it is admitted and gives it back when it ends, so sequences join
and leave a running batch without copying anyone's keys, and every row keeps column = position (no padding).

    pool = SlotPool(model, slots=32, columns=1024)
    slot = pool.take()
    read = pool.reuse_prefix(slot, prompt)               # columns copied from a stored prompt that starts alike
    logits = pool.prefill({slot: prompt[read:read + 64]})[slot]  # a chunk of the prompt, eagerly (several slots'
    logits = pool.prefill({slot: prompt[read + 64:]})[slot]      # chunks share one forward): (V,)
    pool.remember(slot, prompt)                          # its keys and values, for prompts that start alike
    logits = pool.step({slot: token, ...}, filler)       # one token for each decoding slot: {slot: (V,)}
    pool.give(slot)

A decode step runs the model's own forward over rows 0..R-1 and columns 0..C-1 of the pool, R and C rounded up
to a power of two (so the shapes repeat and a compiled forward is traced for few of them). Rows in that range
that are free or still reading their prompt are carried along with a filler token: their writes land in a
column the row has not used yet, and their lengths are put back after the step.

Prefix caching: the keys and values of recent prompts are kept by their tokens (``PrefixStore``); a prompt that
starts like one of them copies those columns into its row instead of computing them. Chat requests share
the system prompt and the template's first tokens, so those are computed once.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

import torch

from tformer.model.compiled import check_compilable, next_logits
from tformer.model.slot_cache import SlotCache

MIN_COLUMNS = 64


def bucket(n: int, most: int, least: int = 1) -> int:
    """The smallest power of two >= max(n, least), at most ``most``."""
    size = least
    while size < n:
        size *= 2
    return min(size, most)


def pool_serves(config) -> bool:
    """Whether a model decodes over the pool: decoder-only, exact or sliding-window attention (as compiled
    decoding). Others (encoder-decoder, recurrent states) are served by joining growing caches."""
    if config.traits.seq2seq:
        return False
    try:
        check_compilable(config)
    except Exception:  # noqa: BLE001 -- the refusal's text is for --compile; here it only means "not this path"
        return False
    return True


class PrefixStore:
    """Keys and values of recent prompts, by their tokens (copies, on the pool's device): the most recently used
    ones, at most ``max_tokens`` tokens of them in all (memory = tokens x layers x 2 x H_kv x D x bytes)."""

    def __init__(self, max_tokens: int, min_tokens: int = 8):
        self.max_tokens, self.min_tokens = max_tokens, min_tokens
        self.tokens = 0  # held now
        self._entries: OrderedDict[tuple[int, ...], list] = OrderedDict()
        self.hits = self.tokens_saved = 0

    def longest(self, prompt: list[int]) -> tuple[list | None, int]:
        """(per layer (k, v) of (H_kv, n, D), n): the longest stored start of ``prompt`` of at least
        ``min_tokens`` tokens, leaving at least its last token to compute (its logits pick the first token)."""
        best, best_n = None, 0
        for tokens, kv in self._entries.items():
            n = 0
            limit = min(len(tokens), len(prompt) - 1)
            while n < limit and tokens[n] == prompt[n]:
                n += 1
            if n > best_n:
                best, best_n = (tokens, kv), n
        if best is None or best_n < self.min_tokens:
            return None, 0
        self._entries.move_to_end(best[0])
        self.hits += 1
        self.tokens_saved += best_n
        return best[1], best_n

    def add(self, prompt: list[int], kv: list) -> None:
        key = tuple(prompt)
        if key in self._entries or len(key) > self.max_tokens:
            return
        self._entries[key] = kv
        self.tokens += len(key)
        while self.tokens > self.max_tokens:
            self.tokens -= len(self._entries.popitem(last=False)[0])


class SlotPool:
    def __init__(self, model, slots: int, columns: int, prefix_store: PrefixStore | None = None, step_fn=None):
        """step_fn(model, ids, kv) -> logits (R, V): the decode step (default: the model's eager forward; a
        compiled one, tformer.model.compiled.compiled_pool_step, is passed by the server's --compile)."""
        self.model, self.config = model, model.config
        param = next(model.parameters())
        self.slots, self.columns = slots, columns
        self.kv = SlotCache.allocate(self.config, len(model.decoder.order), slots, columns, param.dtype, param.device)
        self.used = [0] * slots  # columns each slot has written, counted on the host
        self._free = list(range(slots))  # a heap: the lowest free slot first keeps the live rows low
        self.prefixes = prefix_store
        self._step_fn = step_fn or next_logits  # the same forward as the prefill's, compiled or not

    @property
    def free(self) -> int:
        return len(self._free)

    def take(self) -> int:
        slot = heapq.heappop(self._free)
        self._reset(slot)
        return slot

    def give(self, slot: int) -> None:
        self._reset(slot)
        heapq.heappush(self._free, slot)

    def _reset(self, slot: int) -> None:
        self.used[slot] = 0
        self.kv.reset(slot)

    def reuse_prefix(self, slot: int, prompt: list[int]) -> int:
        """Copy the longest stored start of ``prompt`` into the empty ``slot``; return how many tokens it holds."""
        if self.prefixes is None or self.used[slot]:
            return 0
        kv, n = self.prefixes.longest(prompt)
        if n:
            self.kv.write_entries(slot, kv, n)
            self.used[slot] = n
        return n

    def prefill(self, chunks: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """Read each ``{slot: tokens}`` chunk into its slot after what it holds, all in one forward -> each slot's
        next-token logits (V,). The slots' rows are gathered, the chunks right-padded to the longest (a padding
        token sits after every real one, so no real query sees it, and its column is written again later), and
        the rows written back."""
        slots = list(chunks)
        t = max(len(c) for c in chunks.values())
        columns = bucket(max(self.used[s] for s in slots) + t, self.columns, MIN_COLUMNS)
        device = self.kv.lengths.device
        index = torch.tensor(slots, device=device)
        view = self.kv.gather(index, columns)
        ids = torch.tensor([c + [c[-1]] * (t - len(c)) for c in chunks.values()], dtype=torch.long, device=device)
        last = torch.tensor([len(c) - 1 for c in chunks.values()], device=device)  # each chunk's last real token
        logits = self.model(ids, past_key_values=view, logits_to_keep=last).logits[:, 0]  # (n, V)
        for slot, chunk in chunks.items():
            self.used[slot] += len(chunk)
        self.kv.scatter(index, view, torch.tensor([self.used[s] for s in slots], device=device))
        return {slot: logits[i] for i, slot in enumerate(slots)}

    def remember(self, slot: int, prompt: list[int]) -> None:
        """Keep the keys and values of ``slot``'s prompt (all of it read) for later prompts that start alike."""
        if self.prefixes is not None and len(prompt) >= self.prefixes.min_tokens:
            n = len(prompt)
            self.prefixes.add(prompt, self.kv.row_entries(slot, n))

    def step(self, tokens: dict[int, int], filler: int) -> torch.Tensor:
        """One token for each decoding slot, ``{slot: token}`` -> logits (R, V), row i = slot i (rows of slots
        not in ``tokens`` are carried along and mean nothing)."""
        top = max(tokens) + 1
        rows = bucket(top, self.slots)
        columns = bucket(max(self.used[:rows]) + 1, self.columns, MIN_COLUMNS)
        ids = torch.full((rows, 1), filler, dtype=torch.long)
        for slot, token in tokens.items():
            ids[slot, 0] = token
        logits = self._step_fn(self.model, ids.to(self.kv.lengths.device), self.kv.view(slice(0, rows), columns))
        for slot in tokens:
            self.used[slot] += 1
        passengers = [s for s in range(rows) if s not in tokens]
        if passengers:  # their lengths stepped on too: put them back
            index = torch.tensor(passengers, device=self.kv.lengths.device)
            self.kv.set_read(index, torch.tensor([self.used[s] for s in passengers], device=self.kv.lengths.device))
        return logits


__all__ = ["PrefixStore", "SlotPool", "bucket", "pool_serves"]
