"""Batches for encoder-decoder training: synthetic copy/reverse tasks and translation pairs.

Every batch is a `Seq2SeqBatch` in Hugging Face's naming, which is what the encoder-decoder
model takes: source ``input_ids`` + ``attention_mask`` (1 = real token), teacher-forcing
``decoder_input_ids`` = [BOS] + target, and ``labels`` = target + [EOS] with ``ignore_index``
on padding, so the loss skips pad positions. The source ends in [EOS] too, so the encoder sees
where the sentence stops even without the mask.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from tformer.core.errors import TformerError
from tformer.data.tokenizers import ByteBPETokenizer, CharTokenizer

IGNORE_INDEX = -100

# Synthetic tasks reserve the first ids for specials; symbols are 3 .. vocab_size - 1.
SYNTH_PAD, SYNTH_BOS, SYNTH_EOS = 0, 1, 2
SYNTH_FIRST_SYMBOL = 3


@dataclass
class Seq2SeqBatch:
    input_ids: torch.Tensor  # (B, S) source, padded with pad_id
    attention_mask: torch.Tensor  # (B, S) 1 = real token, 0 = padding
    decoder_input_ids: torch.Tensor  # (B, T) [BOS] + target, padded with pad_id
    decoder_attention_mask: torch.Tensor  # (B, T)
    labels: torch.Tensor  # (B, T) target + [EOS], IGNORE_INDEX on padding

    def to(self, device) -> Seq2SeqBatch:
        return Seq2SeqBatch(**{f.name: getattr(self, f.name).to(device) for f in fields(self)})

    @property
    def num_target_tokens(self) -> int:
        return int((self.labels != IGNORE_INDEX).sum())


def collate(sources: list[list[int]], targets: list[list[int]], pad_id: int, bos_id: int, eos_id: int,
            ignore_index: int = IGNORE_INDEX, src_pad_id: int | None = None,
            src_eos_id: int | None = None) -> Seq2SeqBatch:
    """Pad a list of (source ids, target ids) into one batch, right-padded to the longest.

    pad/bos/eos are the target tokenizer's; the source uses ``src_pad_id``/``src_eos_id`` when
    its tokenizer differs (they default to the target's).
    """
    src_pad_id = pad_id if src_pad_id is None else src_pad_id
    src_eos_id = eos_id if src_eos_id is None else src_eos_id
    if not sources or len(sources) != len(targets):
        raise TformerError("a seq2seq batch needs at least one pair and as many targets as sources")
    src = [list(s) + [src_eos_id] for s in sources]
    dec = [[bos_id] + list(t) for t in targets]
    lab = [list(t) + [eos_id] for t in targets]
    S, T = max(map(len, src)), max(map(len, dec))

    def pad(rows, width, value):
        out = torch.full((len(rows), width), value, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        return out

    def mask(rows, width):
        return (torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long()

    return Seq2SeqBatch(pad(src, S, src_pad_id), mask(src, S), pad(dec, T, pad_id), mask(dec, T),
                        pad(lab, T, ignore_index))


# ---------------------------------------------------------------------------------------------
# Synthetic tasks: the smallest problems an encoder-decoder must solve exactly

TASKS = ("copy", "reverse")


def synthetic_batch(task: str, batch_size: int, generator: torch.Generator | None = None, vocab_size: int = 16,
                    min_len: int = 1, max_len: int = 10) -> Seq2SeqBatch:
    """Random symbol strings; the target is the source (copy) or the source reversed (reverse)."""
    if task not in TASKS:
        raise TformerError(f"unknown synthetic task {task!r}; choose one of {', '.join(TASKS)}")
    if vocab_size <= SYNTH_FIRST_SYMBOL:
        raise TformerError(f"synthetic vocab_size must exceed {SYNTH_FIRST_SYMBOL} (pad, bos, eos); got {vocab_size}")
    if not 1 <= min_len <= max_len:
        raise TformerError(f"need 1 <= min_len <= max_len, got {min_len}, {max_len}")
    lengths = torch.randint(min_len, max_len + 1, (batch_size,), generator=generator)
    symbols = torch.randint(SYNTH_FIRST_SYMBOL, vocab_size, (batch_size, max_len), generator=generator)
    sources = [symbols[i, :n].tolist() for i, n in enumerate(lengths.tolist())]
    targets = [s if task == "copy" else s[::-1] for s in sources]
    return collate(sources, targets, SYNTH_PAD, SYNTH_BOS, SYNTH_EOS)


# ---------------------------------------------------------------------------------------------
# Translation pairs


def pair_tokenizers(train_pairs, kind: str = "bpe", vocab_size: int = 8000, all_pairs=None):
    """Separate source and target tokenizers, each with pad/bos/eos (and mask) specials.

    ``bpe`` trains byte-level BPE on the training pairs only (it has no unknown tokens, so
    held-out text still encodes); ``char`` needs every character it will meet, so it is built
    from ``all_pairs`` (all splits: only the character set leaks, not sentences).
    """
    if kind == "bpe":
        return tuple(ByteBPETokenizer.train((p[side] for p in train_pairs), vocab_size=vocab_size) for side in (0, 1))
    if kind == "char":
        specials = {"pad": "<pad>", "bos": "<s>", "eos": "</s>"}
        pairs = all_pairs if all_pairs is not None else train_pairs
        return tuple(CharTokenizer({c for p in pairs for c in p[side]}, specials) for side in (0, 1))
    raise TformerError(f"unknown pair tokenizer {kind!r}; choose bpe or char")


class PairBatcher:
    """Tokenized translation pairs served as padded batches, shuffled per epoch, resumable.

    Pairs longer than ``max_len`` tokens on either side (counting [EOS]/[BOS]) are dropped and
    counted in ``dropped``. Within each pool of 50 batches, pairs are sorted by length before
    batching, so a batch pads to a similar length (less compute wasted on padding) while batch
    order stays random.
    """

    POOL = 50

    def __init__(self, pairs, src_tok, tgt_tok, batch_size: int, max_len: int = 128, seed: int = 0,
                 shuffle: bool = True):
        if batch_size < 1:
            raise TformerError(f"batch size must be at least 1, got {batch_size}")
        for tok in (src_tok, tgt_tok):
            if None in (tok.pad_id, tok.bos_id, tok.eos_id):
                raise TformerError(f"the {tok.kind} tokenizer lacks pad/bos/eos tokens; build it with pair_tokenizers")
        self.src_tok, self.tgt_tok = src_tok, tgt_tok
        src_ids = src_tok.encode_batch([p[0] for p in pairs])
        tgt_ids = tgt_tok.encode_batch([p[1] for p in pairs])
        keep = [(s, t) for s, t in zip(src_ids, tgt_ids) if len(s) + 1 <= max_len and len(t) + 1 <= max_len]
        self.dropped = len(pairs) - len(keep)
        if not keep:
            raise TformerError(f"no pair fits max_len={max_len} tokens; raise the maximum length")
        self.examples = keep
        self.batch_size, self.seed, self.shuffle = batch_size, seed, shuffle
        self.epoch, self.index = 0, 0
        self._plan_epoch()

    def __len__(self) -> int:
        return len(self._batches)

    def _plan_epoch(self) -> None:
        n, B = len(self.examples), self.batch_size
        if not self.shuffle:
            order = list(range(n))
            self._batches = [order[i:i + B] for i in range(0, n, B)]
            return
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(n, generator=g).tolist()
        pool = B * self.POOL
        batches = []
        for i in range(0, n, pool):
            chunk = sorted(order[i:i + pool], key=lambda j: len(self.examples[j][0]) + len(self.examples[j][1]))
            batches += [chunk[k:k + B] for k in range(0, len(chunk), B)]
        perm = torch.randperm(len(batches), generator=g).tolist()
        self._batches = [batches[k] for k in perm]

    def __iter__(self):
        return self

    def __next__(self) -> Seq2SeqBatch:
        if self.index >= len(self._batches):
            if not self.shuffle:  # an evaluation pass ends; training epochs go on forever
                self.index = 0
                raise StopIteration
            self.epoch, self.index = self.epoch + 1, 0
            self._plan_epoch()
        rows = [self.examples[j] for j in self._batches[self.index]]
        self.index += 1
        tgt = self.tgt_tok
        return collate([s for s, _ in rows], [t for _, t in rows], tgt.pad_id, tgt.bos_id, tgt.eos_id,
                       src_pad_id=self.src_tok.pad_id, src_eos_id=self.src_tok.eos_id)

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "index": self.index, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        if state["batch_size"] != self.batch_size:
            raise TformerError(f"the saved data position was for batch size {state['batch_size']}, this run has "
                               f"{self.batch_size}; resume with the same batch size")
        self.seed, self.epoch, self.index = state["seed"], state["epoch"], state["index"]
        self._plan_epoch()
