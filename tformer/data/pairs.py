"""Sentence-pair pretraining rows: BERT's next-sentence prediction (NSP, Devlin et al. 2018, section 3.1)
and ALBERT's sentence-order prediction (SOP, Lan et al. 2019, section 4.2), cut from a plain token stream.

A row of ``length`` tokens is ``[CLS] first [SEP] second [SEP]``: the two segments share the
``length - 3`` content tokens at a random split point (1 .. n-1 tokens for the first), so every row
fills the window exactly, as BERT's pretraining data does. Segment ids are 0 over [CLS] first [SEP],
1 over second [SEP].

NSP: with probability 0.5 the second segment is the text that follows the first in the stream
(label 0, IsNext: Hugging Face's ``next_sentence_label``), else a segment of the same length from a
random place elsewhere in the stream, overlapping neither (label 1, NotNext).
SOP: the two segments are always consecutive in the stream; with probability 0.5 they are swapped
(label 1, Hugging Face's ``sentence_order_label``), else in order (label 0). NSP can be solved by
telling topics apart; SOP cannot, which is ALBERT's point.

Every draw comes from a torch.Generator, so a seed fixes the rows and a sampler's state makes resume exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from tformer.core.errors import TformerError

TASKS = ("nsp", "sop")
SPECIALS_PER_ROW = 3  # [CLS], [SEP], [SEP]


@dataclass(frozen=True)
class PairDraw:
    """Where one row's segments come from: (start, end) in the stream of the segment after [CLS] and of
    the one after the first [SEP], and the row's label."""

    first: tuple[int, int]
    second: tuple[int, int]
    label: int


@dataclass(frozen=True)
class PairBatch:
    input_ids: torch.Tensor  # (R, L) [CLS] first [SEP] second [SEP]
    token_type_ids: torch.Tensor  # (R, L) 0 up to and with the first [SEP], 1 after
    labels: torch.Tensor  # (R,) 0 = IsNext / in order, 1 = NotNext / swapped
    draws: tuple[PairDraw, ...]


def check_pair_stream(stream_len: int, length: int, what: str = "the stream") -> None:
    """Refuse a window too short for two segments, or a stream too short to draw a NotNext segment from."""
    if length < SPECIALS_PER_ROW + 2:
        raise TformerError(f"sentence-pair rows need --seq-len of at least {SPECIALS_PER_ROW + 2} "
                           f"([CLS] A [SEP] B [SEP] with a token in each segment); got {length}")
    if stream_len < 3 * length:
        raise TformerError(f"{what} has {stream_len} tokens, fewer than 3 x --seq-len {length} that sentence pairs "
                           "need; use a larger corpus or a shorter --seq-len")


def _randint(low: int, high: int, generator: torch.Generator) -> int:
    """One integer uniform in [low, high)."""
    return int(torch.randint(low, high, (1,), generator=generator).item())


def draw_pair(stream_len: int, length: int, task: str, generator: torch.Generator) -> PairDraw:
    """One row's segments and label (see the module docstring)."""
    if task not in TASKS:
        raise TformerError(f"unknown sentence-pair task {task!r}; choose nsp or sop")
    check_pair_stream(stream_len, length)
    n = length - SPECIALS_PER_ROW
    split = _randint(1, n, generator)  # tokens in the text's first part
    start = _randint(0, stream_len - n + 1, generator)
    label = int(torch.rand((), generator=generator).item() < 0.5)
    a, b = (start, start + split), (start + split, start + n)
    if task == "sop":
        return PairDraw(b, a, 1) if label else PairDraw(a, b, 0)
    if not label:
        return PairDraw(a, b, 0)
    # NotNext: a segment of B's length that overlaps neither A nor the true continuation.
    size = n - split
    left = max(start - size + 1, 0)  # starts r with r + size <= start
    right = max(stream_len - size - (start + n) + 1, 0)  # starts r >= start + n
    k = _randint(0, left + right, generator)
    other = k if k < left else start + n + (k - left)
    return PairDraw(a, (other, other + size), 1)


def pair_row(stream, draw: PairDraw, cls_id: int, sep_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids (L,), segment ids (L,)) of one draw from ``stream`` (a 1-D array or tensor of token ids)."""
    # np.array copies: a memory-mapped stream is read-only, and the row must not alias it
    first = torch.from_numpy(np.array(stream[draw.first[0]:draw.first[1]], dtype=np.int64))
    second = torch.from_numpy(np.array(stream[draw.second[0]:draw.second[1]], dtype=np.int64))
    cls, sep = torch.tensor([cls_id]), torch.tensor([sep_id])
    ids = torch.cat([cls, first, sep, second, sep])
    types = torch.cat([torch.zeros(len(first) + 2, dtype=torch.long), torch.ones(len(second) + 1, dtype=torch.long)])
    return ids, types


def pair_batch(stream, rows: int, length: int, task: str, generator: torch.Generator, cls_id: int,
               sep_id: int) -> PairBatch:
    """``rows`` sentence-pair rows of exactly ``length`` tokens from ``stream`` (task: "nsp" or "sop")."""
    draws = tuple(draw_pair(len(stream), length, task, generator) for _ in range(rows))
    built = [pair_row(stream, d, cls_id, sep_id) for d in draws]
    return PairBatch(torch.stack([ids for ids, _ in built]), torch.stack([t for _, t in built]),
                     torch.tensor([d.label for d in draws], dtype=torch.long), draws)
