"""Decoding: greedy, sampling and beam search, for decoder-only and encoder-decoder models.

Every strategy drives the model through its runner (tformer.model.runners) and a cache record:

    runner.prefill(cache, ...)       run the prompt (for an encoder-decoder also the encoder) -> logits (N, V)
    runner.step(cache, tokens)       feed one new token per row -> logits (N, V) for the next position
    cache.select(index)              keep rows ``index`` (beam search picks which hypotheses survive)

With the KV cache, ``step`` runs the model on the single new token and reads every earlier
key and value from the cache: O(n) work per token. Without it (``use_cache=False``) it runs the
whole sequence again and keeps only the last position's logits: O(n^2) work per token. The two
must give the same tokens; the tests hold them equal.

Batches of prompts of different lengths are left-padded, so every row's next token sits in the
last column. The prompt's mask goes to the cache once, which keeps it: each row's position ids count
only its real tokens, so learned and sinusoidal positions and RoPE see the same positions as the prompt
alone, and padding keys are masked out at every step (tformer.model.cache).

This file holds the entry points and a run's set-up; greedy and sampling step through the one decode loop
(tformer.generate.decode_loop, which serving steps through too) over a fixed batch (row_stores.BatchRows); beam
search is its own strategy (tformer.generate.beam) and the inputs are checked and shaped before the loop
(tformer.generate.inputs).
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable, Iterator, Sequence

import torch

from tformer.core.errors import TformerError
from tformer.core.inputs import number
from tformer.generate import sampling
from tformer.generate.beam import beam_search
from tformer.generate.decode_loop import DecodeLoop, Row
from tformer.generate.inputs import (
    check_size,
    check_stop_ids,
    filler_id,
    fit_prefix,
    fit_source,
    pad_batch,
    prompt_ids,
    prompt_rows,
    stop_matrix,
)
from tformer.generate.row_stores import BatchRows
from tformer.model.base import TransformerModel
from tformer.model.compiled import BACKENDS, compiled_runner
from tformer.model.path_choice import choose_paths
from tformer.model.runners import Cache, Runner, runner_for


@dataclass
class GenerationConfig:
    """How to pick tokens. Defaults: greedy, 32 new tokens, with the KV cache (its positions reserved up front)."""

    max_new_tokens: int = 32
    do_sample: bool = False  # False: greedy (or beam search when num_beams > 1)
    temperature: float = 1.0  # > 0; 0 means greedy (argmax), whatever do_sample says
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # in (0, 1]; 1 = off
    min_p: float = 0.0  # in [0, 1]; 0 = off
    repetition_penalty: float = 1.0  # > 0; 1 = off
    num_beams: int = 1
    length_penalty: float = 1.0  # beam score = sum log p / (generated length ** length_penalty)
    early_stopping: bool | str = False  # True, False or "never" (Hugging Face's three modes)
    # Stop tokens: an id, a list of ids for every sequence, or one list per sequence. None = the
    # model's eos_token_id (if any); [] = never stop early.
    stop_tokens: int | Sequence[int] | Sequence[Sequence[int]] | None = None
    pad_token_id: int | None = None  # fills finished rows; else the model's pad, the first stop token, 0 (in the vocabulary)
    use_cache: bool = True
    # Reserve prompt + max_new_tokens positions in the KV cache up front and write each step in place (the
    # compiled step: its preallocated cache, which it needs). False concatenates, copying the whole cache
    # every step: measured on GPT-2 at context 1000, 40.5 ms per step against 33 ms in place.
    reserve_cache: bool = True
    static_cache: bool | None = None  # the old name of reserve_cache, kept one release: a one-line notice
    # Decode steps through a torch.compile'd graph over a preallocated cache (tformer.model.compiled):
    # the same tokens; the first generation of a shape pays the compilation (compile_seconds, apart).
    # True = the inductor backend; a backend name ("inductor", "eager", "aot_eager") picks another.
    compile: bool | str = False
    seed: int | None = None  # seeds a private torch.Generator, so sampling is reproducible
    truncate: bool = False  # a prompt longer than the context window: keep its end instead of failing

    def validate(self) -> "GenerationConfig":
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise TformerError(f"max_new_tokens must be a whole number >= 1, got {self.max_new_tokens!r}")
        sampling.Sampling(self.temperature, self.top_k, self.top_p, self.min_p, self.repetition_penalty).validate()
        if not isinstance(self.compile, bool) and self.compile not in BACKENDS:
            raise TformerError(f"compile must be True, False or a backend ({', '.join(BACKENDS)}), got {self.compile!r}")
        if self.static_cache is not None:
            warnings.warn("static_cache is now reserve_cache (it reserves positions in the growing cache; the compiled "
                          "step's cache is the preallocated one); static_cache goes in the next release",
                          FutureWarning, stacklevel=3)
            self.reserve_cache, self.static_cache = bool(self.static_cache), None
        if self.compile and not (self.use_cache and self.reserve_cache):
            raise TformerError("compiled decoding writes a preallocated KV cache; drop --no-cache/--growing-cache "
                               "or drop --compile")
        if isinstance(self.num_beams, bool) or not isinstance(self.num_beams, int) or self.num_beams < 1:
            raise TformerError(f"num_beams must be a whole number >= 1, got {self.num_beams!r}")
        # Beam scores divide by length ** length_penalty: beyond ±10 a long output overflows float64 (and nan
        # or inf would make every score nan).
        number(self.length_penalty, "length_penalty", -10, 10, note="beam score = log p / length ** this")
        if self.num_beams > 1 and self.sampling:
            raise TformerError("beam search here is deterministic; use num_beams=1 to sample, or drop the sampling options")
        # torch.Generator.manual_seed takes a signed or unsigned 64-bit value; beyond it, a ValueError.
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not -(2 ** 63) <= self.seed < 2 ** 64):
            raise TformerError(f"seed must be a whole number in [-2**63, 2**64), got {self.seed!r}")
        if self.early_stopping not in (True, False, "never"):
            raise TformerError(f"early_stopping must be true, false or 'never', got {self.early_stopping!r}")
        return self

    @property
    def sampling(self) -> bool:
        return self.do_sample and self.temperature != 0

    def picker(self) -> sampling.Sampling:
        """The token pick these settings describe (the one record the serving batcher also uses): greedy
        unless do_sample with a temperature."""
        return sampling.Sampling(self.temperature if self.sampling else 0.0, self.top_k, self.top_p, self.min_p,
                                 self.repetition_penalty)


@dataclass
class GenerationOutput:
    sequences: list[list[int]]  # new tokens per input row, stop token included, no padding
    tokens: torch.Tensor  # (B, n) the same, padded with pad_token_id
    scores: torch.Tensor | None = None  # beam search: each returned sequence's length-normalised score
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    prefill_tokens: int = 0  # real prompt tokens processed by the prefill (source tokens too, for seq2seq)
    decode_tokens: int = 0  # tokens the model processed after the prefill, over all rows (beams count)
    decode_steps: int = 0
    hit_context_limit: bool = False  # generation stopped because the context window was full
    truncated: bool = False  # the prompt was cut to fit (GenerationConfig.truncate)
    cache_bytes: int = 0  # KV cache in use at the end (0 without a cache)
    compile_seconds: float = 0.0  # compiling the decode step (GenerationConfig.compile; 0 when reused)
    extras: dict = field(default_factory=dict)

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prefill_tokens / self.prefill_seconds if self.prefill_seconds > 0 else float("nan")

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.decode_seconds if self.decode_seconds > 0 else float("nan")


# Strategies ---------------------------------------------------------------------------------
@dataclass
class _Run:
    """What a strategy needs, and what it reports back."""

    runner: Runner
    cache: Cache
    prefill: Callable[[], torch.Tensor]  # reads the prompt into the cache -> (N, V) logits
    config: GenerationConfig
    max_new: int
    stop: torch.Tensor  # (B, V) bool
    pad: int
    generator: torch.Generator | None
    seen: torch.Tensor | None  # (B, V) bool, tokens so far (repetition penalty)
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    decode_steps: int = 0


def _token_steps(run: _Run) -> Iterator[torch.Tensor]:
    """Greedy or sampling: the decode loop (tformer.generate.decode_loop) over a fixed batch whose rows keep
    their places; yield each step's (B,) tokens, finished rows reading the pad token."""
    picker = run.config.picker()  # one record and one generator for the batch: its rows draw together
    rows = [Row(budget=run.max_new, stop=frozenset(run.stop[b].nonzero()[:, 0].tolist()), sampling=picker,
                generator=run.generator, seen=None if run.seen is None else run.seen[b])
            for b in range(run.stop.shape[0])]
    loop = DecodeLoop(BatchRows(run.runner, run.cache), run.pad)
    t0 = time.perf_counter()
    logits = run.prefill()
    run.runner.synchronize()
    t1 = time.perf_counter()
    run.prefill_seconds = t1 - t0
    paused = 0.0  # time spent in the consumer (a streaming callback), not in decoding
    tokens = loop.join(rows, logits)
    while True:
        p0 = time.perf_counter()
        yield tokens
        paused += time.perf_counter() - p0
        if not loop.live:
            break
        tokens = loop.step()
        run.decode_steps += 1
    run.runner.synchronize()
    run.decode_seconds = time.perf_counter() - t1 - paused - run.cache.compile_seconds  # compiling: apart


def _prepare(model, input_ids, attention_mask, decoder_input_ids, config: GenerationConfig | None, overrides):
    """Check everything, build the cache and the run record. Returns (run, batch, info)."""
    if not isinstance(model, TransformerModel):
        raise TformerError(f"generate needs a tformer model, got {type(model).__name__}")
    runner = runner_for(model)
    mc = model.config
    if not runner.generates:
        raise TformerError(f"this checkpoint is a {mc.arch} model with no decoder; it cannot generate text. "
                           "Use a decoder or encoder-decoder checkpoint")
    cfg = replace(config or GenerationConfig(), **overrides).validate()
    if cfg.compile:
        runner = compiled_runner(model, backend="inductor" if cfg.compile is True else cfg.compile)
    device = runner.device
    rows = prompt_rows(input_ids, attention_mask)
    if any(len(r) == 0 for r in rows):
        raise TformerError("empty prompt: every sequence needs at least one token (give a BOS token to start from nothing)")
    bad = next((t for r in rows for t in r if isinstance(t, bool) or not isinstance(t, int)
                or not 0 <= t < mc.vocab_size), None)
    if bad is not None:
        raise TformerError(f"token id {bad!r} is outside the vocabulary [0, {mc.vocab_size}); "
                           "give ids the model's tokenizer produces")
    limit = mc.max_positions
    info = {"truncated": False, "hit_context_limit": False}
    if runner.takes_source:
        rows, start_rows = fit_source(rows, decoder_input_ids, mc, cfg, limit, info)
        prefix = len(start_rows[0])
    else:
        rows, prefix = fit_prefix(rows, cfg, limit, info)
    max_new = min(cfg.max_new_tokens, limit - prefix)
    info["hit_context_limit"] = max_new < cfg.max_new_tokens
    source = max(len(r) for r in rows) if runner.takes_source else 0
    check_size(model, cfg, len(rows), prefix, max_new, source, device)

    stop_tokens = cfg.stop_tokens if cfg.stop_tokens is not None else mc.eos_token_id
    stop = stop_matrix(stop_tokens, len(rows), mc.vocab_size, device)
    first = stop.nonzero()
    pad = filler_id(mc.vocab_size, cfg.pad_token_id, mc.pad_token_id, int(first[0, 1]) if len(first) else None)

    generator = None
    if cfg.seed is not None:
        generator = torch.Generator(device=device).manual_seed(cfg.seed)
    cache_length = prefix + max_new if cfg.use_cache and cfg.reserve_cache else None
    cache = runner.new_cache(len(rows), cache_length, kv=cfg.use_cache)
    # Each Linear's path, set before the first product.
    choose_paths(model)
    if runner.takes_source:
        src, src_mask = pad_batch(rows, filler_id(mc.vocab_size, mc.pad_token_id, pad), "right", device)
        start = torch.tensor(start_rows, dtype=torch.long, device=device)
        prefill = partial(runner.prefill, cache, start, source=src, source_mask=src_mask)
        prefill_tokens = int(src_mask.sum()) + start.numel()
        history, history_mask = start, None
    else:
        ids, mask = pad_batch(rows, pad, "left", device)
        prefill = partial(runner.prefill, cache, ids, mask)
        prefill_tokens = int(mask.sum())
        history, history_mask = ids, mask
    seen = None
    if cfg.repetition_penalty != 1.0:  # the penalty looks at the decoder's text so far, prompt included
        seen = sampling.seen_tokens(history, mc.vocab_size, history_mask)
    run = _Run(runner, cache, prefill, cfg, max_new, stop, pad, generator, seen)
    info["prefill_tokens"] = prefill_tokens
    return run, len(rows), info


@torch.no_grad()
def stream(model, input_ids, attention_mask=None, *, config: GenerationConfig | None = None,
           decoder_input_ids=None, **overrides) -> Iterator[torch.Tensor]:
    """Yield each step's new tokens, (B,) LongTensor, as soon as they are chosen (greedy or sampling).

    Rows that have stopped yield the pad token. Beam search cannot stream: which hypothesis wins
    is known only at the end.
    """
    run, _, _ = _prepare(model, input_ids, attention_mask, decoder_input_ids, config, overrides)
    if run.config.num_beams > 1:
        raise TformerError("streaming works with greedy decoding and sampling; beam search picks its output at the end")
    was_training = model.training
    model.eval()
    try:
        yield from _token_steps(run)
    finally:
        model.train(was_training)


@torch.no_grad()
def generate(model, input_ids, attention_mask=None, *, config: GenerationConfig | None = None,
             decoder_input_ids=None, streamer: Callable[[torch.Tensor], None] | None = None,
             **overrides) -> GenerationOutput:
    """Continue each prompt (decoder-only) or translate each source (encoder-decoder).

    input_ids: a (B, T) tensor (with ``attention_mask`` if padded, either side), a list of ids,
    or a list of lists of different lengths. For an encoder-decoder model these are the source
    tokens; the decoder starts from ``decoder_input_ids`` or the config's decoder_start_token_id.
    Settings come from ``config`` and/or keyword overrides of GenerationConfig fields, e.g.
    ``generate(model, ids, max_new_tokens=20, num_beams=4)``. ``streamer`` is called with each
    step's (B,) tokens (greedy and sampling only).
    """
    run, batch, info = _prepare(model, input_ids, attention_mask, decoder_input_ids, config, overrides)
    cfg = run.config
    if streamer is not None and cfg.num_beams > 1:
        raise TformerError("streaming works with greedy decoding and sampling; beam search picks its output at the end")
    was_training = model.training
    model.eval()
    try:
        scores = None
        if cfg.num_beams == 1:
            steps = []
            for tokens in _token_steps(run):
                steps.append(tokens)
                if streamer is not None:
                    streamer(tokens)
            tokens = torch.stack(steps, dim=1)
            sequences = []
            for b, row in enumerate(tokens.tolist()):
                ends = [i for i, t in enumerate(row) if bool(run.stop[b, t])]
                sequences.append(row[: ends[0] + 1] if ends else row)
        else:
            best, lengths, scores = beam_search(batch, run)
            sequences = [row[:n] for row, n in zip(best.tolist(), lengths.tolist())]
            width = max(len(s) for s in sequences)
            tokens = best[:, :width]
    finally:
        model.train(was_training)
    rows = batch * cfg.num_beams
    return GenerationOutput(
        sequences=sequences, tokens=tokens, scores=scores,
        prefill_seconds=run.prefill_seconds, decode_seconds=run.decode_seconds,
        prefill_tokens=info["prefill_tokens"], decode_tokens=run.decode_steps * rows, decode_steps=run.decode_steps,
        # The window cut the run short only where some row was still going when it filled up (not at its stop token).
        hit_context_limit=info["hit_context_limit"] and any(
            len(s) == run.max_new and not bool(run.stop[i * run.stop.shape[0] // len(sequences), s[-1]]) for i, s in enumerate(sequences)),
        truncated=info["truncated"],
        cache_bytes=run.cache.nbytes, compile_seconds=run.cache.compile_seconds,
    )


__all__ = ["GenerationConfig", "GenerationOutput", "check_stop_ids", "filler_id", "generate", "pad_batch",
           "prompt_ids", "stream"]
