"""Continuous batching: one decode step at a time over every active sequence, whenever each arrived.

Static batching waits for a whole batch to finish before starting the next, so one long answer holds
every short one's slot. Here each round runs one step of the decode loop over all active sequences (the loop
generate steps through too: tformer.generate.decode_loop); between two steps it reads what has arrived and adds
it to the running batch, and a sequence that ends leaves at once.

Decoder-only attention models decode over a preallocated KV pool (tformer.generate.slot_pool): a request
takes a row when admitted and gives it back when done; its prompt is read in chunks of at most
``PREFILL_CHUNK`` tokens between decode steps, newcomers' chunks together in one forward (a long prompt does
not stall the running requests), after the
longest start of it that an earlier prompt already computed (prefix caching). Other models (encoder-decoder,
recurrent states) prefill newcomers as one padded batch and join their growing caches to the running one
(tformer.model.runners: ``join``, ``compact``); those that cannot join are admitted only when the batch has emptied.

    batcher = ContinuousBatcher(model, max_batch=32)
    batcher.start()
    seq = batcher.submit(Request([5, 6, 7], max_new_tokens=20), on_event)   # on_event(seq, token, finish)
    ...
    batcher.shutdown(drain=True)    # finish what is queued and running, then stop

``on_event`` is called on the batcher's thread: once per generated token (``finish`` None), then once
with ``token`` None and ``finish`` in FINISH_REASONS. A stop token ends the sequence and is not reported.
``max_batch=1`` is one-request-at-a-time serving: the baseline that continuous batching is measured
against (bench/serve_load.py).
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tformer.core.errors import TformerError
from tformer.generate import sampling
from tformer.generate.decode_loop import DecodeLoop, Row
from tformer.generate.inputs import filler_id
from tformer.generate.row_stores import JoinedRows, PoolRows
from tformer.generate.sampling import Sampling
from tformer.generate.slot_pool import PrefixStore, SlotPool, pool_serves
from tformer.generate.workqueue import Closed, QueueFull, WorkQueue
from tformer.model.base import TransformerModel
from tformer.model.compiled import compiled_pool_step
from tformer.model.path_choice import choose_paths
from tformer.model.runners import runner_for

FINISH_REASONS = ("stop", "length", "timeout", "cancelled", "error")
PREFILL_CHUNK = 256  # prompt tokens read between two decode steps (chunked prefill), newcomers together


@dataclass
class Request:
    """One completion, already checked against the model (tformer.serve checks HTTP input)."""

    prompt: list[int]  # decoder-only: the text so far; encoder-decoder: the source
    max_new_tokens: int
    sampling: Sampling = Sampling()  # greedy unless a temperature is given (the same record generate uses)
    stop_tokens: tuple[int, ...] | None = None  # None = the model's eos_token_id
    seed: int | None = None  # seeds this request's own generator: its draws do not depend on the batch
    timeout: float | None = None  # seconds from submission; then it ends with finish "timeout"


@dataclass(eq=False)
class Sequence(Row):
    """A submitted request as it runs (a row of the decode loop): its tokens so far and its timings
    (time.monotonic())."""

    id: int
    request: Request
    on_event: Callable
    error: str | None = None
    submitted_at: float = 0.0
    first_token_at: float | None = None
    finished_at: float | None = None
    _cancelled: bool = False
    _stats: "StepStats | None" = None
    _read: int = 0  # prompt tokens read into it so far

    def cancel(self) -> None:
        """End it at the next step boundary (a client that went away); its rows are freed then."""
        self._cancelled = True

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    @property
    def _deadline(self) -> float | None:
        t = self.request.timeout
        return None if t is None else self.submitted_at + t

    # What the decode loop tells it (tformer.generate.decode_loop.Row) ----------------------------
    def ending(self, now: float) -> str | None:
        return "cancelled" if self._cancelled else None

    def expired(self, now: float) -> bool:
        return self._deadline is not None and now > self._deadline

    def took(self, token: int, now: float) -> None:
        if self.first_token_at is None:
            self.first_token_at = now
        self._stats.tokens += 1
        self._tell(token, None)

    def finished(self, reason: str) -> None:
        self.finished_at = time.monotonic()
        self._stats.finished[reason] += 1
        self._tell(None, reason)

    def _tell(self, token, finish) -> None:
        try:
            self.on_event(self, token, finish)
        except Exception:  # noqa: BLE001 -- a listener's failure (a client gone mid-write) must not stop the loop
            self._cancelled = True


@dataclass
class StepStats:
    """Decode steps by batch size: what batching buys, measured (tformer serve --report)."""

    steps: dict[int, list] = field(default_factory=dict)  # rows -> [steps, seconds, mean context]
    prefill_tokens: int = 0
    prefill_seconds: float = 0.0
    prefix_tokens: int = 0  # prompt tokens copied from an earlier prompt's keys (prefix caching), not computed
    tokens: int = 0  # generated tokens reported to clients
    finished: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FINISH_REASONS, 0))

    def add_step(self, rows: int, seconds: float, context: int) -> None:
        entry = self.steps.setdefault(rows, [0, 0.0, 0.0])
        entry[0] += 1
        entry[1] += seconds
        entry[2] += (context - entry[2]) / entry[0]


class ContinuousBatcher(WorkQueue):
    def __init__(self, model: TransformerModel, *, max_batch: int = 32, max_queue: int = 256,
                 slot_positions: int | None = None, compile: bool | str = False):
        """slot_positions: columns of each row of the KV pool (prompt + new tokens; default the context window,
        at most 1024); compile: decode steps through torch.compile'd graphs, one for a single row and one for any
        rows ("inductor", or True; a backend name), compiled by ``start`` before the first request (minutes on a
        small CPU)."""
        runner = runner_for(model)
        if not runner.generates:
            raise TformerError(f"this checkpoint is {runner.label}; it cannot generate. Serve a decoder or "
                               "encoder-decoder model for completions")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise TformerError(f"max_batch must be a whole number >= 1, got {max_batch!r}")
        super().__init__(max_queue, "tformer-batcher")
        if runner.takes_source and model.config.decoder_start_token_id is None:
            raise TformerError("decoder_start_token_id is not set in the model config; set it to serve this model")
        self.model, self.runner, self.config = model, runner, model.config
        self.max_batch = max_batch
        self.stats = StepStats()
        self._ids = itertools.count()
        self._active: list[Sequence] = []  # admitted and not ended: reading their prompt or decoding
        c = self.config
        self._pad = filler_id(c.vocab_size, c.pad_token_id, c.eos_token_id)
        self._pool, self._compiled = None, False
        if compile and not pool_serves(c):
            raise TformerError(f"--compile serves decoder-only attention models over the KV pool; this "
                               f"{self.runner.label} model is served eagerly: drop --compile")
        # Each Linear's path, set once here: a step of any rows and a prefill chunk take the same arithmetic.
        choose_paths(model)
        if pool_serves(c):
            columns = slot_positions or min(c.max_positions, 1024)
            if isinstance(columns, bool) or not isinstance(columns, int) or not 1 < columns <= c.max_positions:
                raise TformerError(f"slot_positions (--slot-positions) must be a whole number in [2, {c.max_positions}] (the context "
                                   f"window), got {slot_positions!r}")
            step_fn = compiled_pool_step(model, "inductor" if compile is True else compile) if compile else None
            # prefix caching keeps at most four rows' worth of prompt keys, whatever the number of rows
            self._pool = SlotPool(model, max_batch, columns, PrefixStore(4 * columns), step_fn)
            self._compiled = bool(compile)
            self._store = PoolRows(self._pool, self._pad)
            self._prefilling: list[Sequence] = []
        else:
            self._store = JoinedRows(runner)
        # The one decode loop (tformer.generate.decode_loop), its rows joining and leaving between steps.
        self._decode = DecodeLoop(self._store, self._pad, on_step=self._count_step)

    # Public -------------------------------------------------------------------------------------
    def start(self):
        """Start the loop; a compiled step is compiled first (a step over two empty rows and one over one, then
        forgotten: the two graphs serve every number of rows and columns), its seconds kept in ``compile_seconds``."""
        if self._pool is not None and self._compiled:
            t0 = time.perf_counter()
            slots = [self._pool.take() for _ in range(min(2, self._pool.slots))]
            with torch.no_grad():
                for n in sorted({len(slots), 1}, reverse=True):
                    self._pool.step({s: self._pad for s in slots[:n]}, self._pad)
            for slot in slots:
                self._pool.give(slot)
            self.compile_seconds = time.perf_counter() - t0
        return super().start()

    compile_seconds: float | None = None  # set by start() when the decode step is compiled

    @property
    def active(self) -> int:
        return len(self._active)

    def submit(self, request: Request, on_event: Callable) -> Sequence:
        """Queue ``request``; ``on_event(seq, token, finish)`` reports its progress (on the batcher's thread)."""
        request.sampling.validate()
        stop = request.stop_tokens if request.stop_tokens is not None else (
            () if self.config.eos_token_id is None else (self.config.eos_token_id,))
        seq = Sequence(next(self._ids), request, on_event, submitted_at=time.monotonic(), _stats=self.stats,
                       budget=self._budget(request), stop=frozenset(stop), sampling=request.sampling)
        device = self.runner.device
        if not request.sampling.greedy:
            seed = request.seed if request.seed is not None else random.getrandbits(63)
            seq.generator = torch.Generator(device=device).manual_seed(seed)
        if request.sampling.repetition_penalty != 1.0:  # the penalty looks at the text so far: prompt and reply
            text = torch.tensor([request.prompt], device=device)
            seq.seen = sampling.seen_tokens(text, self.config.vocab_size)[0]
        self._enqueue(seq)
        return seq

    # The loop -----------------------------------------------------------------------------------
    def _budget(self, request: Request) -> int:
        """New tokens it may have: its max_new_tokens, within the context window."""
        used = 1 if self.runner.takes_source else len(request.prompt)  # the decoder's start token, or the prompt
        window = self._pool.columns if self._pool is not None else self.config.max_positions
        room = window - used
        vocab = self.config.vocab_size
        bad = next((t for t in request.prompt if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab),
                   None)
        if bad is not None:
            raise TformerError(f"token id {bad!r} is outside the vocabulary [0, {vocab})")
        if room < 1 or not request.prompt:
            raise TformerError(f"a prompt of {len(request.prompt)} tokens leaves no room in the context window of "
                               f"{window}; shorten it")
        return min(request.max_new_tokens, room)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._pending or self._active or self._closing):
                    self._cond.wait()
                if self._closing and not self._drain:
                    for seq in list(self._pending) + self._active:
                        self._finish(seq, "cancelled")
                    self._pending.clear()
                    self._reset()
                    return
                if self._closing and not (self._pending or self._active):
                    return
                admit = self._take_admissible()
            try:
                with torch.no_grad():
                    self._round(admit)
            except Exception as exc:  # noqa: BLE001 -- one bad batch must not stop the server: end its sequences, go on
                detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                for seq in admit + self._active:
                    if not seq.done:
                        seq.error = detail
                        self._finish(seq, "error")
                self._reset()

    def _round(self, admit: list[Sequence]) -> None:
        """Newcomers are admitted (their prompts read, or a chunk of them); then one decode step for every row."""
        self._active += admit
        if self._pool is not None:
            self._read_prompts(admit)
        elif admit:
            logits, read = self._timed_prefill(lambda: self._store.prefill(
                [s.request.prompt for s in admit], self._pad, self.config.decoder_start_token_id))
            self.stats.prefill_tokens += read
            self._decode.join(admit, logits)
        if self._decode.rows:
            self._decode.step()
        self._active = [s for s in self._active if not s.done]

    def _read_prompts(self, admit: list[Sequence]) -> None:
        """The pool's admission: a newcomer takes a row (after the longest stored start of its prompt); up to
        PREFILL_CHUNK prompt tokens are read, the oldest prompts first, in one forward; a prompt read to its end
        joins the decode loop with its first token."""
        pool, slot = self._pool, self._store.slot  # slot[seq]: its row of the pool
        for seq in admit:
            self._store.take(seq)
            seq._read = pool.reuse_prefix(slot[seq], seq.request.prompt)
            self.stats.prefix_tokens += seq._read
            self._prefilling.append(seq)
        chunks, budget = {}, PREFILL_CHUNK
        for seq in self._prefilling:
            if budget <= 0:
                break
            chunks[slot[seq]] = seq.request.prompt[seq._read:seq._read + budget]
            budget -= len(chunks[slot[seq]])
        if not chunks:
            return
        logits = self._timed_prefill(lambda: pool.prefill(chunks))
        self.stats.prefill_tokens += sum(map(len, chunks.values()))
        for seq in [s for s in self._prefilling if slot[s] in chunks]:
            seq._read += len(chunks[slot[seq]])
            if seq._read < len(seq.request.prompt):
                continue  # the rest of it after the next decode step
            self._prefilling.remove(seq)
            pool.remember(slot[seq], seq.request.prompt)
            self._decode.join([seq], logits[slot[seq]][None])

    def _timed_prefill(self, read):
        t0 = time.perf_counter()
        out = read()
        self.stats.prefill_seconds += time.perf_counter() - t0
        return out

    def _count_step(self, rows: int, seconds: float) -> None:
        self.stats.add_step(rows, seconds, self._store.context(self._decode.rows))

    def _take_admissible(self) -> list[Sequence]:
        """Queued requests that may start now (called under the lock): ended ones leave the queue."""
        now = time.monotonic()
        for seq in [s for s in self._pending if s._cancelled or (s._deadline is not None and now > s._deadline)]:
            self._pending.remove(seq)
            self._finish(seq, "cancelled" if seq._cancelled else "timeout")
        joinable = self._pool is not None or self._store.joinable
        room = self.max_batch - len(self._active) if joinable else 0
        return [self._pending.popleft() for _ in range(min(room, len(self._pending)))]

    def _reset(self) -> None:
        """Every admitted row gives its place back (after an error, or when stopping)."""
        self._decode.reset()
        if self._pool is not None:  # the rows still reading their prompt, and any a failed round left placed
            self._store.leave(list(self._store.slot))
            self._prefilling = []
        self._active = []

    @staticmethod
    def _finish(seq: Sequence, reason: str) -> None:
        """End a sequence outside the decode loop (in the queue, on an error, at shutdown)."""
        seq.finish_reason = reason
        seq.finished(reason)


__all__ = ["FINISH_REASONS", "Closed", "ContinuousBatcher", "QueueFull", "Request", "Sequence", "StepStats"]
