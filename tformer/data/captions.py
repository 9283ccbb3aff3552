"""Captions for labelled images, so a CLIP model can be trained on a classification set (digits, an image folder):
each image is paired with one of several paraphrases naming its class, drawn afresh every time it is seen.

    "a photo of the digit seven", "a handwritten 7", "an image of the number seven", ...

A class is named by its word (DIGIT_NAMES for digits, the folder name otherwise) and its numeral (the class name).
Captions are read by a character tokenizer built from every caption (pad id 0, end id 1); each caption ends in the
end token, where CLIP's text tower is pooled.
"""

from __future__ import annotations

import numpy as np

from tformer.core.errors import TformerError
from tformer.data.images import DIGIT_NAMES
from tformer.data.tokenizers import CharTokenizer

TEMPLATES = (
    "a photo of the digit {word}",
    "a handwritten {numeral}",
    "an image of the number {word}",
    "a picture of a {word}",
    "the number {numeral}",
    "a scan of a handwritten {word}",
    "a drawing of the digit {numeral}",
    "a small {word}",
)
SPECIALS = {"pad": "<pad>", "eos": "<eos>"}


def class_words(classes: tuple[str, ...]) -> tuple[str, ...]:
    """The word for each class: digits' names for the classes 0-9, else the class name itself."""
    if tuple(classes) == tuple(map(str, range(10))):
        return DIGIT_NAMES
    return tuple(c.replace("_", " ") for c in classes)


def captions(classes: tuple[str, ...], templates: tuple[str, ...] = TEMPLATES) -> list[list[str]]:
    """captions[class][template]: every paraphrase of every class."""
    words = class_words(classes)
    return [[t.format(word=w, numeral=c.replace("_", " ")) for t in templates] for c, w in zip(classes, words)]


def caption_tokenizer(table: list[list[str]]) -> CharTokenizer:
    """A character tokenizer over every caption's characters, with pad (id 0) and end (id 1) tokens."""
    return CharTokenizer.from_text("".join(s for row in table for s in row), specials=SPECIALS)


def encode_captions(tok: CharTokenizer, table: list[list[str]], length: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, mask), each (classes, templates, length) int64: every caption + its end token, right-padded with the
    pad id; mask 1 on real tokens. A caption longer than ``length`` - 1 is refused (it would lose its end token)."""
    ids = np.full((len(table), len(table[0]), length), tok.pad_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    for k, row in enumerate(table):
        for j, text in enumerate(row):
            row_ids = tok.encode(text) + [tok.eos_id]
            if len(row_ids) > length:
                raise TformerError(f"the caption {text!r} is {len(row_ids)} tokens with its end token, more than the "
                                   f"text tower's {length} positions; --set max_positions={len(row_ids)} or more")
            ids[k, j, : len(row_ids)] = row_ids
            mask[k, j, : len(row_ids)] = 1
    return ids, mask
