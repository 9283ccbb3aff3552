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
last column. Each row's position ids count only its real tokens (cumsum(mask) - 1), so learned
and sinusoidal positions and RoPE see the same positions as the prompt alone; ALiBi and T5's
relative bias depend only on distances, which padding does not change. Padding keys are masked
out at every step (the mask grows by one column per step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Callable, Iterator, Sequence

import torch

from tformer.core import fmt
from tformer.core.errors import TformerError
from tformer.core.inputs import number
from tformer.cost.memory import generation_bytes
from tformer.generate import sampling
from tformer.machine import available_memory_bytes
from tformer.model.base import TransformerModel
from tformer.model.compiled import BACKENDS, compiled_runner
from tformer.model.path_choice import choose_paths
from tformer.model.runners import Cache, Runner, runner_for

# The "impossible" score of beam search. A large finite number rather than -inf, because the
# reference (Hugging Face `generate`) uses exactly this and its edge cases (a batch item whose
# best candidates all ended at once) depend on the arithmetic; matching it keeps outputs equal.
IMPOSSIBLE = -1.0e9
# Sequences decoded at once (batch x beams). Beyond this a request is a typo, not a workload: a
# 1-layer model with a 16-token vocabulary already takes minutes and gigabytes for a million beams.
MAX_ROWS = 65536


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
    static_cache: bool = True
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
        if self.compile and not (self.use_cache and self.static_cache):
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


# Preparing inputs ---------------------------------------------------------------------------
def _rows(input_ids, attention_mask) -> list[list[int]]:
    """Any accepted prompt form -> one list of real token ids per row."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 1:
            input_ids = input_ids[None]
        if input_ids.dim() != 2:
            raise TformerError(f"input_ids must be (batch, length), got shape {tuple(input_ids.shape)}")
        ids = input_ids.tolist()
        if attention_mask is None:
            return ids
        mask = attention_mask.tolist()
        return [[t for t, m in zip(r, mr) if m] for r, mr in zip(ids, mask)]
    if isinstance(input_ids, (list, tuple)):
        if len(input_ids) == 0:
            raise TformerError("no prompt given; pass at least one token id")
        if all(isinstance(t, int) for t in input_ids):
            return [list(input_ids)]
        return [list(r) for r in input_ids]
    raise TformerError(f"input_ids must be a tensor or a list of token ids, got {type(input_ids).__name__}")


def filler_id(vocab_size: int, *candidates) -> int:
    """The id that fills padding and finished rows: the first candidate (int or None) inside the vocabulary, else 0.
    Padding is masked, but the embedding still looks the id up: a config that keeps another model's pad or end id
    (a GPT-2 config cut to a small vocabulary keeps 50256) would fail at the first padded batch."""
    for c in candidates:
        if isinstance(c, int) and not isinstance(c, bool) and 0 <= c < vocab_size:
            return c
    return 0


def prompt_ids(tokenizer, text: str) -> list[int]:
    """The ids a text prompt starts generation from: its tokens, after BOS where the tokenizer says its model
    expects one (a GGUF file's add_bos: Gemma's does, SmolLM2's does not), as llama.cpp prompts. Without it a
    model trained with BOS first reads the prompt as the middle of a document (Gemma 3 repeats itself)."""
    ids = list(tokenizer.encode(text))
    bos = getattr(tokenizer, "bos_id", None)
    if getattr(tokenizer, "add_bos", False) and bos is not None and ids[:1] != [bos]:
        ids.insert(0, bos)
    return ids


def pad_batch(rows: list[list[int]], pad: int, side: str, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of different lengths -> (ids, mask), padded on the ``side`` ("left" or "right")."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        sl = slice(width - len(r), width) if side == "left" else slice(0, len(r))
        ids[i, sl] = torch.tensor(r, dtype=torch.long)
        mask[i, sl] = 1
    return ids.to(device), mask.to(device)


def _stop_matrix(stop_tokens, batch: int, vocab: int, device) -> torch.Tensor:
    """(B, V) bool: True where token v ends row b. Accepts an id, a list, or one list per row."""
    if stop_tokens is None:
        stop_tokens = []
    if isinstance(stop_tokens, int):
        stop_tokens = [stop_tokens]
    per_row = len(stop_tokens) > 0 and all(isinstance(s, (list, tuple)) for s in stop_tokens)
    if per_row and len(stop_tokens) != batch:
        raise TformerError(f"got {len(stop_tokens)} lists of stop tokens for {batch} sequences; give one per sequence")
    rows = [list(s) for s in stop_tokens] if per_row else [list(stop_tokens)] * batch
    matrix = torch.zeros(batch, vocab, dtype=torch.bool)
    for b, ids in enumerate(rows):
        for t in check_stop_ids(ids, vocab):
            matrix[b, t] = True
    return matrix.to(device)


def check_stop_ids(ids, vocab: int) -> list[int]:
    """``ids`` as a list if every one is a token id of the vocabulary, else one TformerError naming the first not."""
    ids = list(ids)
    bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab), None)
    if bad is not None:
        raise TformerError(f"stop token {bad!r} is outside the vocabulary [0, {vocab})")
    return ids


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


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pick(logits: torch.Tensor, run: _Run) -> torch.Tensor:
    """The next token of each row: argmax, or a draw from the processed distribution."""
    return run.config.picker().pick(logits, run.generator, run.seen)


def _token_steps(run: _Run) -> Iterator[torch.Tensor]:
    """Greedy or sampling: yield each step's (B,) tokens; finished rows get the pad token."""
    device = run.runner.device
    t0 = time.perf_counter()
    logits = run.prefill()
    _sync(device)
    t1 = time.perf_counter()
    run.prefill_seconds = t1 - t0
    rows = torch.arange(logits.shape[0], device=device)
    finished = torch.zeros(logits.shape[0], dtype=torch.bool, device=device)
    paused = 0.0  # time spent in the consumer (a streaming callback), not in decoding
    for step in range(run.max_new):
        tokens = _pick(logits, run).masked_fill(finished, run.pad)
        if run.seen is not None:
            run.seen[rows, tokens] |= ~finished
        finished = finished | run.stop[rows, tokens]
        p0 = time.perf_counter()
        yield tokens
        paused += time.perf_counter() - p0
        if step == run.max_new - 1 or bool(finished.all()):
            break
        logits = run.runner.step(run.cache, tokens)
        run.decode_steps += 1
    _sync(device)
    run.decode_seconds = time.perf_counter() - t1 - paused - run.cache.compile_seconds  # compiling: apart


def _beam_search(batch: int, run: _Run):
    """Beam search with Hugging Face's rules, so outputs can be compared token for token.

    - Each step ranks all beams x vocabulary continuations by summed log-probability and keeps
      the best 2K (K = beams; more with several stop tokens) so K unfinished ones always remain.
    - A candidate that ends (stop token, or the last allowed step) can become a finished
      hypothesis only if it ranks among the best K; its score is sum log p / L ** length_penalty,
      L = tokens generated including the stop token (the prompt does not count).
    - At most K finished hypotheses are kept per input, the best by that score.
    - early_stopping=True: an input is done once it has K finished hypotheses.
      False: done when the best running beam, scored at its current length, cannot beat the
      worst finished one. "never": the same test, but with a positive length penalty assuming
      the running beam could grow to the maximum length (the exact bound).
    Returns (best tokens (B, max_new), their lengths (B,), their scores (B,)).
    """
    cfg, K, max_new = run.config, run.config.num_beams, run.max_new
    runner, cache = run.runner, run.cache
    device = runner.device
    t0 = time.perf_counter()
    logits = run.prefill()  # prefill once per input, then copy each row to its K beams
    _sync(device)
    t1 = time.perf_counter()
    run.prefill_seconds = t1 - t0
    expand = torch.arange(batch, device=device).repeat_interleave(K)
    cache.select(expand)  # each input's rows, its source included, for its K beams
    logits = logits[expand]
    if run.seen is not None:
        run.seen = run.seen[expand]
    V = logits.shape[-1]

    n_stop = int(run.stop.sum(-1).max())
    n_cand = min(max(2, 1 + n_stop) * K, K * V)  # a stop set covering most of the vocabulary: all there are
    top_k_rank = torch.arange(n_cand, device=device) < K  # only the best K candidates may finish
    stop = run.stop  # (B, V)

    running_scores = torch.zeros(batch, K, device=device)
    running_scores[:, 1:] = IMPOSSIBLE  # all beams start equal: let only the first one expand at step 1
    running = torch.full((batch, K, max_new), run.pad, dtype=torch.long, device=device)
    done_tokens = running.clone()
    done_scores = torch.full((batch, K), IMPOSSIBLE, device=device)
    done_lengths = torch.zeros(batch, K, dtype=torch.long, device=device)
    done_flags = torch.zeros(batch, K, dtype=torch.bool, device=device)
    improvable = torch.ones(batch, dtype=torch.bool, device=device)
    group = (torch.arange(batch, device=device) * K)[:, None]

    for step in range(max_new):
        length = step + 1  # tokens generated by each candidate, this one included
        logp = torch.log_softmax(logits.float(), dim=-1)
        if run.seen is not None:
            logp = sampling.repetition_penalty(logp, run.seen, cfg.repetition_penalty)
        total = (logp.view(batch, K, V) + running_scores[:, :, None]).view(batch, K * V)
        cand_scores, cand_index = torch.topk(total, n_cand, dim=-1)  # (B, 2K), best first
        cand_beam, cand_token = cand_index // V, cand_index % V
        cand_seqs = running.gather(1, cand_beam[:, :, None].expand(-1, -1, max_new)).clone()
        cand_seqs[:, :, step] = cand_token
        ends = stop.gather(1, cand_token) | (length >= max_new)

        # The K best candidates that go on.
        live_scores = cand_scores + ends.float() * IMPOSSIBLE
        keep = torch.topk(live_scores, K, dim=-1).indices
        running_scores = live_scores.gather(1, keep)
        running = cand_seqs.gather(1, keep[:, :, None].expand(-1, -1, max_new))
        source_beam = cand_beam.gather(1, keep)

        # Candidates that ended join the finished hypotheses if they earn a place.
        eligible = ends & top_k_rank
        scores = cand_scores / (length ** cfg.length_penalty)
        full = done_flags.all(-1, keepdim=True) & (cfg.early_stopping is True)
        scores = scores + full.float() * IMPOSSIBLE + (~improvable[:, None]).float() * IMPOSSIBLE
        scores = scores + (~eligible).float() * IMPOSSIBLE
        merged_scores = torch.cat([done_scores, scores], dim=1)
        best = torch.topk(merged_scores, K, dim=-1).indices
        done_scores = merged_scores.gather(1, best)
        done_tokens = torch.cat([done_tokens, cand_seqs], 1).gather(1, best[:, :, None].expand(-1, -1, max_new))
        lengths = torch.full_like(cand_token, length)
        done_lengths = torch.cat([done_lengths, lengths], 1).gather(1, best)
        done_flags = torch.cat([done_flags, eligible], 1).gather(1, best)

        # Can the running beams still beat the worst finished hypothesis?
        if cfg.early_stopping == "never" and cfg.length_penalty > 0:
            best_length = max_new
        else:
            best_length = length
        best_possible = running_scores[:, :1] / (best_length ** cfg.length_penalty)
        worst_done = torch.where(done_flags, done_scores.min(-1, keepdim=True).values, IMPOSSIBLE)
        improvable = improvable & (best_possible > worst_done).any(-1)

        if bool(ends.all()) or not bool(improvable.any()):
            break
        if cfg.early_stopping is True and bool(done_flags.all()):
            break
        index = (group + source_beam).view(-1)
        cache.select(index, within_inputs=True)
        if run.seen is not None:
            run.seen = run.seen[index]
            run.seen[torch.arange(index.numel(), device=device), running[:, :, step].reshape(-1)] = True
        logits = runner.step(cache, running[:, :, step].reshape(-1))
        run.decode_steps += 1
    _sync(device)
    run.decode_seconds = time.perf_counter() - t1 - run.cache.compile_seconds  # compiling: apart
    return done_tokens[:, 0], done_lengths[:, 0], done_scores[:, 0]


# Entry points -------------------------------------------------------------------------------
def _fit_prefix(rows, cfg: GenerationConfig, limit: int, info: dict) -> tuple[list[list[int]], int]:
    """A decoder-only prompt continues the decoder's own text: keep its end if it is too long.
    Returns (rows, decoder tokens before the first new one)."""
    longest = max(len(r) for r in rows)
    if longest > limit:
        if not cfg.truncate:
            raise TformerError(f"prompt of {longest} tokens is longer than the context window of {limit}; "
                               "shorten it or pass --truncate to keep its last tokens")
        keep = max(1, limit - cfg.max_new_tokens)
        rows = [r[-keep:] for r in rows]
        info["truncated"] = True
    prefix = max(len(r) for r in rows)  # the padded batch shares one cache length
    if limit - prefix < 1:
        raise TformerError(f"the prompt fills the whole context window of {limit} tokens; nothing can be "
                           "generated. Shorten it or pass --truncate")
    return rows, prefix


def _fit_source(rows, decoder_input_ids, mc, cfg: GenerationConfig, limit: int, info: dict):
    """A seq2seq prompt is the source (keep its start if too long); the decoder starts from
    ``decoder_input_ids`` or the start token. Returns (source rows, decoder start rows)."""
    longest = max(len(r) for r in rows)
    if longest > limit:
        if not cfg.truncate:
            raise TformerError(f"source of {longest} tokens is longer than the context window of {limit}; "
                               "shorten it or pass --truncate to keep its first tokens")
        rows = [r[:limit] for r in rows]
        info["truncated"] = True
    if decoder_input_ids is not None:
        start_rows = _rows(decoder_input_ids, None)
        if len(start_rows) == 1 and len(rows) > 1:
            start_rows = start_rows * len(rows)
        if len({len(r) for r in start_rows}) != 1 or len(start_rows) != len(rows) or not start_rows[0]:
            raise TformerError("decoder_input_ids must give one non-empty row per source, all the same length")
    else:
        if mc.decoder_start_token_id is None:
            raise TformerError("decoder_start_token_id is not set in the model config; pass decoder_input_ids")
        start_rows = [[mc.decoder_start_token_id]] * len(rows)
    if limit - len(start_rows[0]) < 1:
        raise TformerError(f"decoder_input_ids already fill the context window of {limit} tokens")
    return rows, start_rows


def _free_bytes(device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return available_memory_bytes() if device.type == "cpu" else None


def _check_size(model, cfg: GenerationConfig, batch: int, prefix: int, max_new: int, source: int, device) -> None:
    """Refuse, before anything is allocated, a request that cannot finish: more beams than tokens to
    choose from, more sequences than any real workload, or more memory than the device has free."""
    mc = model.config
    if cfg.num_beams > mc.vocab_size:
        raise TformerError(f"--num-beams {cfg.num_beams} is more than the {mc.vocab_size} tokens of the vocabulary; "
                           f"use at most {mc.vocab_size} (4 to 8 is usual)")
    rows = batch * cfg.num_beams
    if rows > MAX_ROWS:
        raise TformerError(f"{batch} sequences x {cfg.num_beams} beams = {rows:,} rows decoded at once, more than "
                           f"{MAX_ROWS:,}; lower --batch or --num-beams")
    param = next(model.parameters(), None)
    need = generation_bytes(mc, rows, prefix + max_new, prefix, source=source, use_cache=cfg.use_cache,
                            bytes_per=param.element_size() if param is not None else 4)
    free = _free_bytes(device)
    if free is not None and need["total"] > free:
        fix = "drop --no-cache, or " if not cfg.use_cache else ""
        raise TformerError(
            f"generating {rows:,} rows of {prefix + max_new} tokens needs at least {fmt.si(need['total'], 'B')} "
            f"(KV cache {fmt.si(need['kv_cache'], 'B')}) but {device.type} memory has {fmt.si(free, 'B')} free; "
            f"{fix}lower --batch, --num-beams or --max-new-tokens")


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
    rows = _rows(input_ids, attention_mask)
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
        rows, start_rows = _fit_source(rows, decoder_input_ids, mc, cfg, limit, info)
        prefix = len(start_rows[0])
    else:
        rows, prefix = _fit_prefix(rows, cfg, limit, info)
    max_new = min(cfg.max_new_tokens, limit - prefix)
    info["hit_context_limit"] = max_new < cfg.max_new_tokens
    source = max(len(r) for r in rows) if runner.takes_source else 0
    _check_size(model, cfg, len(rows), prefix, max_new, source, device)

    stop_tokens = cfg.stop_tokens if cfg.stop_tokens is not None else mc.eos_token_id
    stop = _stop_matrix(stop_tokens, len(rows), mc.vocab_size, device)
    first = stop.nonzero()
    pad = filler_id(mc.vocab_size, cfg.pad_token_id, mc.pad_token_id, int(first[0, 1]) if len(first) else None)

    generator = None
    if cfg.seed is not None:
        generator = torch.Generator(device=device).manual_seed(cfg.seed)
    cache_length = prefix + max_new if cfg.use_cache and cfg.static_cache else None
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
            best, lengths, scores = _beam_search(batch, run)
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
