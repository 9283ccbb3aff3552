"""The runner's base: the cache record generation keeps (with the row operations beam search and serving apply to it)
and the Runner every architecture's runner extends (tformer.model.runners maps each architecture to its runner).
A runner reads batches (tformer.data.batch) and scores them; it keeps the loss, prefill and step, nothing of
training's own (batches for timing live with the data, the chunked loss is asked for per call)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from tformer.core.errors import TformerError
from tformer.cost.architecture import describe
from tformer.data.batch import Batch
from tformer.model.base import IGNORE_INDEX, TransformerModel
from tformer.model.cache import KVCache
from tformer.model.masks import positions_from_mask  # noqa: F401 -- re-exported: runners and generate name it here


@dataclass
class Scored:
    """A batch's loss, and the right answers where the runner counts them (its ``accuracy_metric``)."""

    loss: torch.Tensor
    right: int = 0
    rows: int = 0  # rows whose answers were counted; 0: none (a language model's loss counts none)


@dataclass
class Cache:
    """What generation has read so far, and the row operations generation and serving apply to it; each
    runner's record adds its own fields and extends them (runners.py)."""

    rows: int  # N: sequences (beams count)
    kv: KVCache | None  # None: no KV cache, each step reruns every token read so far
    ids: torch.Tensor | None = None  # (N, t) tokens read so far; kept only without a KV cache
    read: int = 0  # tokens read per row, counted on the host (a compiled step never reads its cache's lengths back)
    compile_seconds: float = 0.0  # time spent compiling the step for this cache's shapes (0: eager, or reused)

    what: ClassVar[str] = "these"  # whose sequences, in the message of a refused join

    @property
    def nbytes(self) -> int:
        """Bytes of KV cache in use (0 without one)."""
        return self.kv.nbytes if self.kv is not None else 0

    def select(self, index: torch.Tensor, within_inputs: bool = False) -> None:
        """Keep rows ``index`` (N',), in that order, with everything each row carries: beam search's beams of
        each input (expanding), the rows still running in a serving batch. ``within_inputs``: ``index`` only
        moves rows among the beams of each input (beam search's survivors), so what all of an input's beams
        share (a seq2seq model's source) stays where it is."""
        if self.ids is not None:
            self.ids = self.ids[index]
        if self.kv is not None:
            self.kv.select(index)
        self.rows = index.numel()

    def rewind(self, n: int) -> None:
        """Forget the last ``n`` tokens read: the next step reads at that position again."""
        if n <= 0:
            return
        if self.kv is not None:
            self.kv.rewind(n)
        if self.ids is not None:
            self.ids = self.ids[:, :-n]
        self.read = max(self.read - n, 0)

    # Continuous batching: sequences that started apart share one batch ----------------------------
    @property
    def joinable(self) -> bool:
        """Whether ``join`` can take this cache's rows into a batch of others (a serving loop whose cache cannot
        admits a new group only when the batch has emptied)."""
        return False

    def join(self, other: Cache) -> Cache:
        """A new cache with the rows of this one then those of ``other``, which may have read different numbers
        of tokens; a step then advances all of them at once."""
        raise TformerError(f"{self.what} sequences cannot join a running batch; serve them one group at a time")

    def compact(self) -> None:
        """Drop what no row needs any more (left padding after the longer rows have left)."""


class Runner:
    """Training and profiling for every architecture, and the whole runner of those that neither generate nor train
    by a loss of their own (an encoder, an image classifier); the generating ones add prefill and step."""

    def __init__(self, model: TransformerModel):
        self.model, self.config = model, model.config

    # What it can do (from the config's ArchRecord, tformer.core.architectures) ------------------------------------------------
    @property
    def generates(self) -> bool:
        return self.config.traits.decoder

    @property
    def takes_source(self) -> bool:
        """Seq2seq: the prompt is a source for the encoder, and the decoder starts from start tokens."""
        return self.config.traits.seq2seq

    @property
    def objective(self) -> str:
        return self.config.traits.objective

    @property
    def phases(self) -> tuple[str, ...]:
        return self.config.traits.phases

    @property
    def label(self) -> str:
        return self.config.traits.label

    # A compiled decode step (tformer.model.compiled.CompiledStep, set by compiled_runner): the runner's caches are
    # then preallocated and each step runs its graph; None: eager.
    compiled = None

    @property
    def accuracy_metric(self) -> str:
        """What scored() counts: an image classifier's top class ("accuracy"), else NSP / SOP answers."""
        return "accuracy" if self.objective == "image-classification" else "pair_accuracy"

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def synchronize(self) -> None:
        """Wait until the device has done what was asked of it (a GPU runs ahead of Python): a timing ends here."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @property
    def loss_skips(self) -> tuple[str, ...]:
        """Name prefixes of the parameters the training loss never reaches (they get no gradient), as
        the ledger's architecture description says (BERT's pooler under the masked-token loss)."""
        return describe(self.config).loss_skips

    # The loss and plain forward passes --------------------------------------------------------
    chunks_loss = False  # whether loss(chunk=) applies: a plain LM head's next-token loss (DecoderRunner)

    def forward(self, batch: Batch, module=None):
        """The model's output on ``batch`` (ModelOutput). ``module``: the model wrapped for training
        (DDP, torch.compile), called in its place."""
        return (module if module is not None else self.model)(**batch.inputs)

    def loss(self, batch: Batch, module=None, label_smoothing: float = 0.0, autocast=None,
             stand_in: bool = False, chunk: int = 0) -> torch.Tensor:
        """Mean cross-entropy (nats) of the logits against ``batch.targets`` over scored positions; with
        ``batch.pair_targets`` (NSP / SOP) plus the pair head's mean cross-entropy, as BertForPreTraining's
        total loss.

        autocast: a context entered around the forward pass only; the loss is computed in fp32.
        stand_in: a model with no head (an encoder without lm_head) scores nothing; return the sum
        of its outputs instead, so a backward pass can still be run and timed.
        chunk: form an LM head's (rows, vocabulary) logits ``chunk`` rows at a time, forward and backward
        (tformer.model.chunked_loss: the same loss and gradients in a fraction of the memory; ``chunks_loss``
        runners only); 0: all at once.
        """
        return self._score(batch, module, label_smoothing, autocast, stand_in, chunk, count=False).loss

    def scored(self, batch: Batch, module=None, label_smoothing: float = 0.0, autocast=None,
               chunk: int = 0) -> Scored:
        """The loss as ``loss`` gives it, with the right answers of the predictions ``accuracy_metric`` names
        (evaluation: a pair head's, a classifier's)."""
        return self._score(batch, module, label_smoothing, autocast, False, chunk, count=True)

    def check_chunk(self, chunk: int) -> None:
        """Refuse in one line a ``chunk`` this runner's loss cannot take (a trainer asks before its first step)."""
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 0:
            raise TformerError(f"--loss-chunk is a number of rows (0: the whole logits at once), got {chunk!r}")
        if chunk and not self.chunks_loss:
            task = f", with a {self.config.task} head" if getattr(self.config, "task", "") else ""
            raise TformerError(f"--loss-chunk applies to a decoder-only language model's next-token loss; this one is "
                               f"{self.label}{task}, trained by {type(self).__name__}'s own loss; drop --loss-chunk")

    def _score(self, batch: Batch, module, label_smoothing, autocast, stand_in, chunk, count) -> Scored:
        """The loss (and with ``count`` the right answers): what a runner with a loss of its own overrides."""
        self.check_chunk(chunk)
        with autocast if autocast is not None else contextlib.nullcontext():
            out = self.forward(batch, module)
        logits = out.logits
        if logits is None:
            if not stand_in:
                raise TformerError("this model has no LM head, so there is nothing to score; "
                                   "build it with lm_head=true to train it")
            t = out.pooler_output if out.pooler_output is not None else out.last_hidden_state
            return Scored(t.float().sum())
        loss = F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch.targets.reshape(-1),
                               ignore_index=IGNORE_INDEX, label_smoothing=label_smoothing)
        scored = Scored(loss)
        if self.accuracy_metric == "accuracy" and count:
            scored = Scored(loss, int((logits.argmax(-1) == batch.targets).sum()), len(batch.targets))
        if batch.pair_targets is None:
            return scored
        if out.pair_logits is None:
            raise TformerError("this batch has sentence-pair labels but the model has no pair head; "
                               "build it with pooler=true and pair_head=true")
        pair = out.pair_logits.float()
        loss = loss + F.cross_entropy(pair, batch.pair_targets)
        if count:
            return Scored(loss, int((pair.argmax(-1) == batch.pair_targets).sum()), len(batch.pair_targets))
        return Scored(loss)

    # Generation: only the runners of models with a decoder implement these ----------------------
    def _no_decoder(self):
        return TformerError(f"this checkpoint is {self.label}; it cannot generate text. "
                            "Use a decoder or encoder-decoder checkpoint")

    def new_cache(self, rows: int, max_len: int | None = None, kv: bool = True) -> Cache:
        """An empty cache for ``rows`` sequences, which carries the row operations (select, rewind, join).
        max_len: the positions generation will need; the growing KV layers reserve them and write each step in
        place (a compiled runner: its preallocated length). None: grow by concatenation. kv=False: no KV cache."""
        raise self._no_decoder()

    def prefill(self, cache: Cache, ids: torch.Tensor, mask: torch.Tensor | None = None, *,
                source: torch.Tensor | None = None, source_mask: torch.Tensor | None = None,
                all_logits: bool = False) -> torch.Tensor | None:
        """Read the prompt into an empty ``cache``; return the next-token logits (N, V), or with
        ``all_logits`` every position's (N, t, V); None when ``ids`` has no tokens."""
        raise self._no_decoder()

    def step(self, cache: Cache, tokens: torch.Tensor) -> torch.Tensor:
        """Read one new token per row, (N,); return the logits for the next position, (N, V)."""
        raise self._no_decoder()

    def _check_rows(self, cache: Cache, ids: torch.Tensor) -> None:
        if ids.dim() != 2 or ids.shape[0] != cache.rows:
            raise TformerError(f"the cache was made for {cache.rows} rows; got ids of shape {tuple(ids.shape)}")

    def _check_prompt(self, cache: Cache, ids: torch.Tensor, source, what: str) -> None:
        """A model that continues its own prompt: no source, and ids with the cache's rows."""
        if source is not None:
            raise TformerError(f"{what} reads no source; give the prompt as its ids")
        self._check_rows(cache, ids)

    def _check_start(self, cache: Cache, ids: torch.Tensor, mask, source) -> None:
        """A model that reads a source: one is given, and the decoder's start tokens are unpadded."""
        if source is None:
            raise TformerError("an encoder-decoder model needs a source to read; pass source=")
        if mask is not None:
            raise TformerError("the decoder's start tokens are never padded; pass no mask for them")
        self._check_rows(cache, ids)
