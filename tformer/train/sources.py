"""Batch sources: where the training loop's batches come from, one per objective.

Protocol: ``next_batch(rows) -> Batch``, ``eval_batches(n, rows)`` (the same batches every time,
so validation losses are comparable across a run), ``tokens_per_row`` (for tokens/s), and
``state_dict()/load_state_dict()`` holding the sampler's RNG state, which makes resume exact.
"""

from __future__ import annotations

import numpy as np
import torch

from tformer.core.errors import TformerError
from tformer.data.batch import Batch  # what a runner's loss reads: model inputs + targets
from tformer.data.pairs import check_pair_stream, pair_batch
from tformer.data.seq2seq import collate
from tformer.model.base import IGNORE_INDEX

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


class ImageSource(_Sampled):
    """Labelled images (tformer.data.images.ImageSet: (N, C, H, W) in [0, 1]) drawn at random with replacement, each
    shifted by up to ``shift`` pixels each way (zero fill); targets are the classes (B,). Off by default: on the 8x8
    digits a 1-pixel shift (an eighth of the image) cost held-out accuracy (94% -> 83% after 800 steps of vit-digits).
    Validation walks the held-out set once in order, unshifted (at most n batches of ``rows``)."""

    def __init__(self, train, val, seed: int, tokens_per_row: int, shift: int = 0):
        super().__init__(seed)
        for name, part in (("training", train), ("held-out", val)):
            if len(part) == 0:
                raise TformerError(f"the {name} split of {train.name} has no images; add images to every class "
                                   "(a fifth of each class is held out)")
        self.train, self.val, self.shift, self.tokens_per_row = train, val, shift, tokens_per_row
        self._train_x, self._train_y = torch.from_numpy(train.images), torch.from_numpy(train.labels)
        self.val_labels = torch.from_numpy(val.labels)  # (N,) the held-out classes, in eval_batches' order

    def _shifted(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        s = self.shift
        if s == 0:
            return x
        _, _, h, w = x.shape
        padded = torch.nn.functional.pad(x, (s, s, s, s))
        offsets = torch.randint(0, 2 * s + 1, (x.shape[0], 2), generator=generator).tolist()
        return torch.stack([p[:, dy:dy + h, dx:dx + w] for p, (dy, dx) in zip(padded, offsets)])

    def _draw(self, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(index (B,), shifted images, labels) of ``rows`` random training images."""
        idx = torch.randint(0, len(self.train), (rows,), generator=self.generator)
        return idx, self._shifted(self._train_x[idx], self.generator), self._train_y[idx]

    def next_batch(self, rows: int) -> Batch:
        _, x, y = self._draw(rows)
        return Batch({"pixel_values": x}, y)

    def _val_slices(self, n: int, rows: int):
        for start in range(0, min(n * rows, len(self.val)), rows):
            yield slice(start, min(start + rows, len(self.val)))

    def eval_batches(self, n: int, rows: int):
        for part in self._val_slices(n, rows):
            yield Batch({"pixel_values": torch.from_numpy(self.val.images[part])}, self.val_labels[part])


class ImageTextSource(ImageSource):
    """Image-caption pairs for CLIP: each drawn image with one caption of its class, the paraphrase drawn at random
    (tformer.data.captions). caption_ids / caption_mask: (classes, paraphrases, T). Targets: 0..B-1 (text i describes
    image i). Validation: each held-out image with a paraphrase fixed by EVAL_SEED."""

    def __init__(self, train, val, seed: int, tokens_per_row: int, caption_ids, caption_mask, shift: int = 0):
        super().__init__(train, val, seed, tokens_per_row, shift)
        self.caption_ids, self.caption_mask = torch.from_numpy(caption_ids), torch.from_numpy(caption_mask)
        self.text_len = self.caption_ids.shape[-1]  # tokens per caption, end token and padding included
        paraphrases = self.caption_ids.shape[1]
        fixed = torch.Generator().manual_seed(EVAL_SEED)
        self.val_paraphrase = torch.randint(0, paraphrases, (len(val),), generator=fixed)

    def _pairs(self, x: torch.Tensor, labels: torch.Tensor, paraphrase: torch.Tensor) -> Batch:
        return Batch({"pixel_values": x, "input_ids": self.caption_ids[labels, paraphrase],
                      "attention_mask": self.caption_mask[labels, paraphrase]}, torch.arange(len(labels)))

    def next_batch(self, rows: int) -> Batch:
        _, x, y = self._draw(rows)
        return self._pairs(x, y, torch.randint(0, self.caption_ids.shape[1], (rows,), generator=self.generator))

    def eval_batches(self, n: int, rows: int):
        for part in self._val_slices(n, rows):
            yield self._pairs(torch.from_numpy(self.val.images[part]), torch.from_numpy(self.val.labels[part]),
                              self.val_paraphrase[part])

    def held_out_pairs(self) -> Batch:
        """Every held-out image with its fixed caption, in one batch (for recall and zero-shot)."""
        return next(self.eval_batches(1, len(self.val)))
