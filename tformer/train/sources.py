"""Batch sources: where the training loop's batches come from, one per objective.

Protocol: ``next_batch(rows) -> Batch``, ``eval_batches(n, rows)`` (the same batches every time,
so validation losses are comparable across a run), ``tokens_per_row`` (for tokens/s), and
``state_dict()/load_state_dict()`` holding the sampler's RNG state, which makes resume exact.
"""

from __future__ import annotations

import numpy as np
import torch

from tformer.core.errors import TformerError
from tformer.data.pairs import check_pair_stream, pair_batch
from tformer.data.seq2seq import collate
from tformer.model.base import IGNORE_INDEX
from tformer.model.runners import Batch  # what a runner's loss reads: model inputs + targets

EVAL_SEED = 1234567  # fixed: every evaluation sees the same validation batches


class _Sampled:
    def __init__(self, seed: int):
        self.generator = torch.Generator().manual_seed(seed)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        if "generator" not in state:
            raise TformerError("checkpoint has no data-sampler state; it was not written by `tformer train`")
        self.generator.set_state(state["generator"])


class CausalLMSource(_Sampled):
    """Random windows of a token stream: x = tokens[s : s+T], targets = tokens[s+1 : s+T+1]."""

    def __init__(self, train_ids, val_ids, seq_len: int, seed: int):
        super().__init__(seed)
        self.train, self.val, self.seq_len = train_ids, val_ids, seq_len
        for name, ids in (("training", train_ids), ("validation", val_ids)):
            if len(ids) < seq_len + 2:
                raise TformerError(
                    f"the {name} split has {len(ids)} tokens, fewer than --seq-len {seq_len} + 2; "
                    "use a larger corpus or a shorter --seq-len"
                )
        self.tokens_per_row = seq_len

    def _windows(self, ids, rows: int, generator: torch.Generator) -> Batch:
        starts = torch.randint(0, len(ids) - self.seq_len - 1, (rows,), generator=generator).numpy()
        window = np.asarray(ids[starts[:, None] + np.arange(self.seq_len + 1)], dtype=np.int64)
        window = torch.from_numpy(window)
        return Batch({"input_ids": window[:, :-1]}, window[:, 1:])

    def next_batch(self, rows: int) -> Batch:
        return self._windows(self.train, rows, self.generator)

    def eval_batches(self, n: int, rows: int):
        generator = torch.Generator().manual_seed(EVAL_SEED)
        for _ in range(n):
            yield self._windows(self.val, rows, generator)


class MaskedLMSource(CausalLMSource):
    """Windows of a token stream with BERT-style corruption; targets only at the chosen positions."""

    def __init__(self, train_ids, val_ids, seq_len: int, seed: int, mask_fn):
        super().__init__(train_ids, val_ids, seq_len, seed)
        self.mask_fn = mask_fn  # (ids, generator) -> (corrupted ids, targets with -100 elsewhere)

    def _windows(self, ids, rows, generator):
        plain = super()._windows(ids, rows, generator).inputs["input_ids"]
        corrupted, targets = self.mask_fn(plain, generator)
        return Batch({"input_ids": corrupted}, targets)


class Seq2SeqSource(_Sampled):
    """Sentence pairs (lists of token ids), padded per batch by tformer.data.seq2seq.collate:
    the encoder reads source + [EOS], the decoder reads [BOS] + target and predicts target + [EOS]."""

    def __init__(self, train_pairs, val_pairs, pad_id: int, bos_id: int, eos_id: int, seed: int, max_len: int):
        super().__init__(seed)
        if not train_pairs or not val_pairs:
            raise TformerError("the translation data has no sentence pairs; check the corpus")
        clip = lambda pairs: [(s[: max_len - 1], t[: max_len - 1]) for s, t in pairs]  # room for BOS/EOS
        self.train, self.val = clip(train_pairs), clip(val_pairs)
        self.pad_id, self.bos_id, self.eos_id = pad_id, bos_id, eos_id
        self.tokens_per_row = int(np.mean([len(t) + 1 for _, t in self.train[:1000]]))

    def _collate(self, pairs) -> Batch:
        return seq2seq_batch(pairs, self.pad_id, self.bos_id, self.eos_id)

    def next_batch(self, rows: int) -> Batch:
        idx = torch.randint(0, len(self.train), (rows,), generator=self.generator).tolist()
        return self._collate([self.train[i] for i in idx])

    def eval_batches(self, n: int, rows: int):
        for k in range(n):
            yield self._collate([self.val[(k * rows + i) % len(self.val)] for i in range(rows)])


def seq2seq_batch(pairs, pad_id: int, bos_id: int, eos_id: int) -> Batch:
    """(source, target) id lists -> one padded teacher-forcing batch (tformer.data.seq2seq.collate)."""
    b = collate([s for s, _ in pairs], [t for _, t in pairs], pad_id, bos_id, eos_id)
    inputs = {"input_ids": b.input_ids, "attention_mask": b.attention_mask,
              "decoder_input_ids": b.decoder_input_ids, "decoder_attention_mask": b.decoder_attention_mask}
    return Batch(inputs, b.labels)


class PrefixLMSource(CausalLMSource):
    """Causal windows, each with a prefix of p tokens (p uniform in 1..T-1, per row) that the decoder reads
    bidirectionally (the batch's ``prefix_length``, (B,)); only the tokens after the prefix are scored:
    position i predicts token i+1, so targets before position p-1 are ignored."""

    def __init__(self, train_ids, val_ids, seq_len: int, seed: int):
        if seq_len < 2:
            raise TformerError("prefix-lm needs --seq-len of at least 2 (a prefix and a token after it)")
        super().__init__(train_ids, val_ids, seq_len, seed)

    def _windows(self, ids, rows, generator):
        plain = super()._windows(ids, rows, generator)
        prefix = torch.randint(1, self.seq_len, (rows,), generator=generator)
        before = torch.arange(self.seq_len)[None, :] < prefix[:, None] - 1
        return Batch({"input_ids": plain.inputs["input_ids"], "prefix_length": prefix},
                     plain.targets.masked_fill(before, IGNORE_INDEX))


class CorruptedTextSource(CausalLMSource):
    """Windows of a token stream turned into (source, target) pairs for an encoder-decoder by
    ``corrupt(row (T,), generator) -> (source ids, target ids)`` (span corruption, denoising), then
    padded as translation pairs are: the encoder reads source + [EOS], the decoder [BOS] + target."""

    def __init__(self, train_ids, val_ids, seq_len: int, seed: int, corrupt, pad_id: int, bos_id: int, eos_id: int,
                 target_len: int):
        super().__init__(train_ids, val_ids, seq_len, seed)
        self.corrupt, self.pad_id, self.bos_id, self.eos_id = corrupt, pad_id, bos_id, eos_id
        self.tokens_per_row = target_len + 1  # decoder tokens per row: the target and its EOS

    def _windows(self, ids, rows, generator):
        plain = super()._windows(ids, rows, generator).inputs["input_ids"]
        pairs = [tuple(t.tolist() for t in self.corrupt(row, generator)) for row in plain]
        return seq2seq_batch(pairs, self.pad_id, self.bos_id, self.eos_id)


class SentencePairSource(CausalLMSource):
    """BERT's pretraining rows (tformer.data.pairs): [CLS] A [SEP] B [SEP] filling the window, segment
    ids, BERT masking on top (``mask_fn``, which never picks [CLS]/[SEP]) and one NSP / SOP label per row."""

    def __init__(self, train_ids, val_ids, seq_len: int, seed: int, task: str, cls_id: int, sep_id: int, mask_fn):
        super().__init__(train_ids, val_ids, seq_len, seed)
        check_pair_stream(len(train_ids), seq_len, "the training split")
        check_pair_stream(len(val_ids), seq_len, "the validation split")
        self.task, self.cls_id, self.sep_id, self.mask_fn = task, cls_id, sep_id, mask_fn

    def _windows(self, ids, rows, generator):
        pairs = pair_batch(ids, rows, self.seq_len, self.task, generator, self.cls_id, self.sep_id)
        corrupted, targets = self.mask_fn(pairs.input_ids, generator)
        return Batch({"input_ids": corrupted, "token_type_ids": pairs.token_type_ids}, targets, pairs.labels)
