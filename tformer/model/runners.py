"""Runners: the one object through which a model is trained, generated with and profiled.

Code above model/ never asks which architecture a model is; it asks the model's runner:

    runner = runner_for(model)
    loss = runner.loss(batch)                         # batch: model inputs + targets (tformer.data.batch.Batch)
    scored = runner.scored(batch)                     # the loss and the right answers, for evaluation
    cache = runner.new_cache(rows, max_len)           # what generation has read so far
    logits = runner.prefill(cache, ids, mask)         # the prompt -> (N, V) next-token logits
    logits = runner.step(cache, tokens)               # (N,) new tokens -> (N, V)

and for what it can do: ``generates``, ``takes_source``, ``objective``, ``phases``, ``label``
(the config's ArchRecord, tformer.core.architectures, tformer.core.config). ``runner_for`` is the one place that maps an
architecture to its runner. What generation and serving do to the rows of a cache is the cache's
own (tformer.model.runner_base.Cache), not the runner's:

    cache.select(index)                               # keep rows ``index`` (beam search, serving)
    cache.select(index, within_inputs=True)           # beam search's survivors: the source stays put
    cache.rewind(n)                                   # forget the last n positions
    both = a.join(b)                                  # rows of two caches in one batch (if ``a.joinable``)
    cache.compact()                                   # drop left padding no row needs any more

The cache record holds the KV cache and what a step needs besides it: the attention mask of a
left-padded batch, the position ids (each row counts only its real tokens), the encoder's output
for a seq2seq model. Without a KV cache (``new_cache(..., kv=False)``) it keeps the tokens read
so far, and each step runs the whole sequence again (O(n^2) work per token instead of O(n)).
Each record extends the row operations with its own fields (a padded batch's mask and positions follow
the rows; a seq2seq source follows them unless only beams of one input are moved).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tformer.core.errors import TformerError
from tformer.model.base import TransformerModel
from tformer.model.chunked_loss import autocast_dtype, chunked_lm_loss, lm_head_parts
from tformer.model.clip import contrastive_loss
from tformer.model.records import runner_class
from tformer.model.rnn import select_state
from tformer.model.runner_base import Batch, Cache, Runner, Scored, positions_from_mask
from tformer.model.task_heads import TaskRunner


@dataclass
class DecoderCache(Cache):
    """A decoder-only model's: its KV cache holds the padding and positions of a left-padded batch itself
    (tformer.model.cache); without one, ``mask`` keeps them to rerun the whole prefix every step."""

    mask: torch.Tensor | None = None  # (N, t) 1 = real token; only without a KV cache, None when no row is padded

    def select(self, index, within_inputs=False):
        super().select(index, within_inputs)
        if self.mask is not None:
            self.mask = self.mask[index]

    def rewind(self, n):
        super().rewind(n)
        if self.mask is not None and n > 0:
            self.mask = self.mask[:, :-n]

    @property
    def joinable(self):
        return self.kv is not None and self.kv.joinable

    def join(self, other):
        """Right-aligned rows, as a left-padded prompt batch: each row keeps its own positions, and the
        padding in front of the shorter rows is masked out. The result holds a growing KV cache."""
        if not (self.joinable and other.joinable):
            raise TformerError("only decoder caches with plain keys and values can share a batch")
        return DecoderCache(self.rows + other.rows, self.kv.join(other.kv))

    def compact(self):
        if self.kv is not None and self.rows:
            self.kv.compact()


@dataclass
class Seq2SeqCache(Cache):
    memory: torch.Tensor | None = None  # (N, S, d_model) the encoder's output
    source_mask: torch.Tensor | None = None  # (N, S) 1 = real token; None when no source is padded

    what = "encoder-decoder"  # each row reads its own source: rows of two batches have no common columns

    def select(self, index, within_inputs=False):
        if not within_inputs and self.memory is not None:  # beams of one input share its memory
            self.memory = self.memory[index]
            if self.source_mask is not None:
                self.source_mask = self.source_mask[index]
        super().select(index, within_inputs)

    def rewind(self, n):
        super().rewind(n)
        if n > 0 and self.kv is not None and self.kv.length == 0:
            # No decoder token left: drop the cross-attention K/V as well, so the next step projects them
            # from the memory again, as the first step after a prefill does.
            self.kv.clear_cross()


class DecoderRunner(Runner):
    """Decoder-only (GPT-2, LLaMA): the prompt is the decoder's own prefix, left-padded in a batch
    so every row's next token sits in the last column."""

    def new_cache(self, rows, max_len=None, kv=True) -> DecoderCache:
        if self.compiled is not None:
            return DecoderCache(rows, self.compiled.new_kv(rows, max_len, kv))
        return DecoderCache(rows, self.model.new_cache(reserve=max_len) if kv else None)

    chunks_loss = True

    def check_chunk(self, chunk: int) -> None:
        super().check_chunk(chunk)
        if chunk:
            lm_head_parts(self.model)  # a head it cannot chunk is refused up front, not at the first step

    def _score(self, batch, module, label_smoothing, autocast, stand_in, chunk, count) -> Scored:
        if not chunk:
            return super()._score(batch, module, label_smoothing, autocast, stand_in, chunk, count)
        self.check_chunk(chunk)
        # The model stops at the final hidden states (B, T, d); the head runs inside the loss, a chunk of rows at a
        # time, in the dtype autocast would have given it.
        with autocast if autocast is not None else contextlib.nullcontext():
            h = (module if module is not None else self.model)(**batch.inputs, skip_head=True).last_hidden_state
            dtype = autocast_dtype(h.device)
        weight, bias, softcap = lm_head_parts(self.model)
        return Scored(chunked_lm_loss(h, weight, batch.targets, chunk, bias, label_smoothing=label_smoothing,
                                      softcap=softcap, compute_dtype=dtype))

    def _run(self, cache: DecoderCache, ids, mask=None, all_logits=False):
        positions = None if mask is None or cache.kv is not None else positions_from_mask(mask)
        out = self.model(ids, attention_mask=mask, position_ids=positions, past_key_values=cache.kv,
                         logits_to_keep=0 if all_logits else 1)
        return out.logits if all_logits else out.logits[:, -1]

    def prefill(self, cache, ids, mask=None, *, source=None, source_mask=None, all_logits=False):
        self._check_prompt(cache, ids, source, "a decoder-only model")
        if ids.shape[1] == 0:
            return None
        # A left-padded prompt's mask goes to the KV cache once, which keeps it (and each row's positions) from
        # then on; without padding no mask is passed at all, and positions are 0, 1, ...
        mask = mask if mask is not None and not bool(mask.all()) else None
        if cache.kv is None:
            cache.ids, cache.mask = ids, mask
        if self.compiled is not None:
            self.compiled.check_room(cache, ids.shape[1])
        cache.read = ids.shape[1]
        return self._run(cache, ids, mask, all_logits)

    def step(self, cache, tokens):
        if self.compiled is not None:
            return self.compiled.advance(cache, tokens)
        new = tokens[:, None]
        cache.read += 1
        if cache.kv is not None:
            return self._run(cache, new)
        cache.ids = torch.cat([cache.ids, new], dim=1)  # no cache: the whole prefix again
        if cache.mask is not None:
            cache.mask = F.pad(cache.mask, (0, 1), value=1)  # the new token is real in every row
        return self._run(cache, cache.ids, cache.mask)


class EncoderDecoderRunner(Runner):
    """Encoder-decoder (the 2017 paper, BART, T5): the source is encoded once at prefill; the
    decoder reads the encoder's output (memory) at every step."""

    def new_cache(self, rows, max_len=None, kv=True) -> Seq2SeqCache:
        if self.compiled is not None:
            return Seq2SeqCache(rows, self.compiled.new_kv(rows, max_len, kv))
        return Seq2SeqCache(rows, self.model.new_cache(reserve=max_len) if kv else None)

    def _run(self, cache: Seq2SeqCache, ids, all_logits=False):
        logits, _, _, _ = self.model.decode(ids, cache.memory, cache.source_mask, cache=cache.kv,
                                            logits_to_keep=0 if all_logits else 1)
        return logits if all_logits else logits[:, -1]

    def prefill(self, cache, ids, mask=None, *, source=None, source_mask=None, all_logits=False):
        """ids: the decoder's first tokens (N, t), usually the start token; source: (N, S)."""
        self._check_start(cache, ids, mask, source)
        cache.source_mask = None if source_mask is None or bool(source_mask.all()) else source_mask
        cache.memory, _ = self.model.encode(source, cache.source_mask)
        if ids.shape[1] == 0:
            return None
        if cache.kv is None:
            cache.ids = ids
        if self.compiled is not None:
            self.compiled.check_room(cache, ids.shape[1])
        cache.read = ids.shape[1]
        return self._run(cache, ids, all_logits)

    def step(self, cache, tokens):
        if self.compiled is not None:
            return self.compiled.advance(cache, tokens, cache.memory, cache.source_mask)
        new = tokens[:, None]
        cache.read += 1
        if cache.kv is not None:
            return self._run(cache, new)
        cache.ids = torch.cat([cache.ids, new], dim=1)
        return self._run(cache, cache.ids)


@dataclass
class RecurrentCache(Cache):
    """An RNN's cache is its state: h (layers, N, d_hidden), and c for an LSTM. Its size does not grow
    with the tokens read. ``stateful`` False: keep the ids (and their padding) and rerun them every step."""

    stateful: bool = True
    state: object | None = None
    mask: torch.Tensor | None = None  # (N, t) 1 = real token; kept only when rerunning a padded batch

    recurrent = True  # as KVCache.recurrent: a step folds the token in, so snapshot/restore, never rewind

    def select(self, index, within_inputs=False):
        super().select(index, within_inputs)
        if self.state is not None:
            self.state = select_state(self.state, index)
        if self.mask is not None:
            self.mask = self.mask[index]

    def rewind(self, n):
        if n > 0 and self.stateful:
            raise TformerError("an RNN's state cannot forget tokens it has read (it folds them all in); "
                               "rewinding needs a Transformer's KV cache, or a cache made with kv=False")
        super().rewind(n)
        if self.mask is not None and n > 0:
            self.mask = self.mask[:, :-n]

    @property
    def joinable(self):
        return self.stateful  # the state is all a step reads: no length to line up

    def join(self, other):
        if not (self.joinable and other.joinable):
            raise TformerError("only recurrent caches that keep their state can share a batch")
        cat = (lambda x, y: torch.cat([x, y], dim=1))  # states are (layers, N, d_hidden)
        s, o = self.state, other.state
        state = tuple(map(cat, s, o)) if isinstance(s, tuple) else cat(s, o)
        return RecurrentCache(self.rows + other.rows, None, stateful=True, state=state)

    def snapshot(self):
        return self.state

    def restore(self, state) -> None:
        self.state = state  # a step builds new tensors, so the old ones are intact

    @property
    def nbytes(self) -> int:
        parts = self.state if isinstance(self.state, tuple) else (self.state,) if self.state is not None else ()
        return sum(p.numel() * p.element_size() for p in parts)


class RecurrentRunner(Runner):
    """A recurrent LM (arch='rnn'): prefill runs the prompt through the recurrence once, each step
    one token from the state left by the last; the prompt's padding (left) leaves the state as it was."""

    def new_cache(self, rows, max_len=None, kv=True) -> RecurrentCache:
        return RecurrentCache(rows, None, stateful=kv)

    def _run(self, cache: RecurrentCache, ids, mask, state, all_logits=False):
        out = self.model(ids, attention_mask=mask, past_key_values=state, logits_to_keep=0 if all_logits else 1)
        if cache.stateful:
            cache.state = out.past_key_values
        return out.logits if all_logits else out.logits[:, -1]

    def prefill(self, cache, ids, mask=None, *, source=None, source_mask=None, all_logits=False):
        self._check_prompt(cache, ids, source, "a recurrent language model")
        if ids.shape[1] == 0:
            return None
        mask = mask if mask is not None and not bool(mask.all()) else None
        if not cache.stateful:
            cache.ids, cache.mask = ids, mask
        return self._run(cache, ids, mask, None, all_logits)

    def step(self, cache, tokens):
        new = tokens[:, None]
        if cache.stateful:
            return self._run(cache, new, None, cache.state)
        cache.ids = torch.cat([cache.ids, new], dim=1)
        if cache.mask is not None:
            cache.mask = F.pad(cache.mask, (0, 1), value=1)
        return self._run(cache, cache.ids, cache.mask, None)  # no state kept: the whole prefix again


@dataclass
class RecurrentSeq2SeqCache(RecurrentCache):
    """arch='rnn-seq2seq': the encoded source (outputs, mask, precomputed keys: tformer.model.rnn_seq2seq.Memory)
    and the decoder's state (its RNN state and Luong's input-feed vector: DecoderState). None grows with the
    tokens generated; the memory is the source's size."""

    memory: object | None = None

    what = "recurrent encoder-decoder"

    def select(self, index, within_inputs=False):
        if not within_inputs and self.memory is not None:  # each input's beams share its source
            self.memory = self.memory.select(index)
        Cache.select(self, index, within_inputs)
        if self.state is not None:
            s = self.state
            self.state = type(s)(select_state(s.rnn, index), None if s.feed is None else s.feed[index])

    @property
    def joinable(self):
        return False  # each row reads its own source

    def join(self, other):
        return Cache.join(self, other)

    @property
    def nbytes(self) -> int:
        m, s = self.memory, self.state
        parts = [] if m is None else [m.outputs] + ([m.keys] if m.keys is not None and m.keys is not m.outputs else [])
        if s is not None:
            parts += list(s.rnn) if isinstance(s.rnn, tuple) else [s.rnn]
            parts += [s.feed] if s.feed is not None else []
        return sum(p.numel() * p.element_size() for p in parts)


class RecurrentSeq2SeqRunner(EncoderDecoderRunner):
    """arch='rnn-seq2seq': prefill encodes the source once (outputs, mask, the keys' source-side projection) and
    starts the decoder from the encoder's final state; each step is one decoder step with attention. As an
    RNN's, the state cannot forget tokens (rewind refuses); kv=False keeps the ids and reruns the decoder."""

    def new_cache(self, rows, max_len=None, kv=True) -> RecurrentSeq2SeqCache:
        return RecurrentSeq2SeqCache(rows, None, stateful=kv)

    def _run(self, cache, ids, all_logits=False):
        state = cache.state if cache.stateful else self.model.start(cache.memory)
        logits, state, _ = self.model.decode(ids, cache.memory, state, logits_to_keep=0 if all_logits else 1)
        if cache.stateful:
            cache.state = state
        return logits if all_logits else logits[:, -1]

    def prefill(self, cache, ids, mask=None, *, source=None, source_mask=None, all_logits=False):
        self._check_start(cache, ids, mask, source)
        cache.memory = self.model.encode(source, source_mask)
        cache.state = self.model.start(cache.memory)
        if ids.shape[1] == 0:
            return None
        if not cache.stateful:
            cache.ids = ids
        return self._run(cache, ids, all_logits)

    def step(self, cache, tokens):
        if cache.stateful:
            return self._run(cache, tokens[:, None])
        cache.ids = torch.cat([cache.ids, tokens[:, None]], dim=1)
        return self._run(cache, cache.ids)  # no state kept: the whole target again


class ContrastiveRunner(Runner):
    """arch='clip': batches of N image-text pairs (``pixel_values``, ``input_ids``, ``attention_mask``); text i
    describes image i, so the targets are 0..N-1 both ways."""

    def _score(self, batch, module, label_smoothing, autocast, stand_in, chunk, count) -> Scored:
        """The symmetric contrastive loss over the batch's N x N similarity; label_smoothing applies both ways."""
        self.check_chunk(chunk)
        with autocast if autocast is not None else contextlib.nullcontext():
            out = self.forward(batch, module)
        return Scored(contrastive_loss(out.logits_per_text, label_smoothing))


def runner_for(model) -> Runner:
    """The runner of ``model`` (any tformer model): its task head's, else the one its arch's record names."""
    if not isinstance(model, TransformerModel):
        raise TformerError(f"a runner needs a tformer model, got {type(model).__name__}")
    if model.config.task:  # a task head in place of the LM head: trained on labels, generates nothing
        return TaskRunner(model)
    return runner_class(model.config.arch)(model)


__all__ = [
    "Batch",
    "Cache",
    "ContrastiveRunner",
    "DecoderCache",
    "DecoderRunner",
    "EncoderDecoderRunner",
    "RecurrentCache",
    "RecurrentRunner",
    "RecurrentSeq2SeqCache",
    "RecurrentSeq2SeqRunner",
    "Runner",
    "Scored",
    "Seq2SeqCache",
    "positions_from_mask",
    "runner_for",
]
