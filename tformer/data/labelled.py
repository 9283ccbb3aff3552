"""Labelled text for sequence classification: a user's CSV or JSONL of (text, label) rows, or a named set built from
packaged data (``authorship``: tformer.data.authorship).

``LabelledText`` holds train / validation / test lists of (text, class id) and the class names. A user's file is
split by row, each class shuffled with the seed and cut 80/10/10, so every split keeps the class balance; the
named sets say how they split in ``note``.
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tformer.core.errors import TformerError

SPLITS = ("train", "validation", "test")
HELD_OUT = 0.1  # validation and test each take this share of every class of a user's file
TEXT_COLUMN, LABEL_COLUMN = "text", "label"
MAX_FILE_BYTES = 1 << 30  # a labelled text file of a gigabyte is not a fine-tuning set this loader should hold


@dataclass
class LabelledText:
    """Split name -> (texts, class ids); class ids index ``classes``."""

    name: str
    classes: tuple[str, ...]
    splits: dict[str, tuple[list[str], list[int]]] = field(default_factory=dict)
    note: str = ""
    key: str = ""  # identifies the content (what was read and how it was split), for caches derived from it

    def texts(self, split: str) -> list[str]:
        return self.splits[split][0]

    def labels(self, split: str) -> list[int]:
        return self.splits[split][1]

    def counts(self) -> dict[str, list[int]]:
        """Split -> rows per class."""
        return {s: np.bincount(np.asarray(y, dtype=np.int64), minlength=len(self.classes)).tolist()
                for s, (_, y) in self.splits.items()}

    def to_json(self) -> dict:
        return {"name": self.name, "classes": list(self.classes), "note": self.note, "key": self.key,
                "splits": {s: {"texts": t, "labels": y} for s, (t, y) in self.splits.items()}}

    @classmethod
    def from_json(cls, data: dict) -> LabelledText:
        return cls(data["name"], tuple(data["classes"]),
                   {s: (list(v["texts"]), [int(i) for i in v["labels"]]) for s, v in data["splits"].items()},
                   data.get("note", ""), data.get("key", ""))


def read_labelled(path, seed: int = 0) -> LabelledText:
    """A CSV (header row with ``text`` and ``label`` columns) or JSONL (one object per line with those keys) file
    as a LabelledText. Rows with empty text are skipped; labels are strings (sorted: class 0 is the first)."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise TformerError(f"--data {path}: no such file; give a CSV or JSONL file of {TEXT_COLUMN},{LABEL_COLUMN} "
                           "rows, or --data authorship")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise TformerError(f"{path} is over {MAX_FILE_BYTES >> 30} GB; give a smaller labelled file")
    try:
        raw = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise TformerError(f"{path} is not UTF-8 text (bad byte at offset {exc.start}); save it as UTF-8") from None
    if not raw.strip():
        raise TformerError(f"{path} is empty; give one {TEXT_COLUMN},{LABEL_COLUMN} row per example")
    rows = _jsonl_rows(raw, path) if path.suffix.lower() in (".jsonl", ".ndjson") else _csv_rows(raw, path)
    rows = [(t.strip(), str(y).strip()) for t, y in rows if t is not None and str(t).strip()]
    if not rows:
        raise TformerError(f"{path} has no row with text in its '{TEXT_COLUMN}' column; fill it in")
    classes = tuple(sorted({y for _, y in rows}))
    if len(classes) < 2:
        raise TformerError(f"{path} has one label ({classes[0]!r}) for every row; a classifier needs at least 2 "
                           "classes, so add rows of another label")
    index = {c: i for i, c in enumerate(classes)}
    texts, labels = [t for t, _ in rows], [index[y] for _, y in rows]
    digest = hashlib.sha256(raw.encode("utf-8")).hexdigest()[:12]
    return LabelledText(path.name, classes, split_rows(texts, labels, seed),
                        f"by row: each class shuffled (seed {seed}), {HELD_OUT:.0%} validation, {HELD_OUT:.0%} test",
                        f"file-{digest}-seed{seed}")


def _csv_rows(raw: str, path: Path) -> list[tuple]:
    reader = csv.DictReader(raw.splitlines())
    columns = reader.fieldnames or []
    _check_columns(columns, path)
    try:
        return [(r.get(TEXT_COLUMN), r.get(LABEL_COLUMN)) for r in reader if r.get(LABEL_COLUMN) not in (None, "")]
    except csv.Error as exc:
        raise TformerError(f"{path} is not valid CSV ({exc}); quote fields that hold commas or newlines") from None


def _jsonl_rows(raw: str, path: Path) -> list[tuple]:
    rows = []
    for number, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise TformerError(f"{path} line {number} is not JSON ({exc.msg}); write one object per line") from None
        if not isinstance(obj, dict):
            raise TformerError(f"{path} line {number} is not a JSON object; write "
                               f'{{"{TEXT_COLUMN}": ..., "{LABEL_COLUMN}": ...}} per line')
        _check_columns(list(obj), path, f" (line {number})")
        rows.append((obj[TEXT_COLUMN], obj[LABEL_COLUMN]))
    return rows


def _check_columns(columns: list[str], path: Path, where: str = "") -> None:
    for needed in (TEXT_COLUMN, LABEL_COLUMN):
        if needed not in columns:
            raise TformerError(f"{path}{where} has no '{needed}' column (it has: {', '.join(columns) or 'none'}); "
                               f"name the columns {TEXT_COLUMN} and {LABEL_COLUMN}")


def shuffled(texts: list[str], labels: list[int], index, rng) -> tuple[list[str], list[int]]:
    """The rows at ``index`` in an order drawn from ``rng``: a split read from its start (an evaluation of its
    first batches) then sees every class, not the first class's rows only."""
    order = rng.permutation(np.sort(np.asarray(index, dtype=np.int64))).tolist()
    return [texts[i] for i in order], [int(labels[i]) for i in order]


def split_rows(texts: list[str], labels: list[int], seed: int) -> dict[str, tuple[list[str], list[int]]]:
    """Each class shuffled with ``seed``, HELD_OUT of it to validation and to test (at least one row each where the
    class has 3 or more), the rest to train; each split in a seeded order, so its first rows mix the classes."""
    rng = np.random.default_rng(seed)
    labels_arr = np.asarray(labels)
    parts = {s: [] for s in SPLITS}
    for c in np.unique(labels_arr):
        members = rng.permutation(np.flatnonzero(labels_arr == c))
        k = max(round(len(members) * HELD_OUT), 1 if len(members) >= 3 else 0)
        parts["validation"].append(members[:k])
        parts["test"].append(members[k:2 * k])
        parts["train"].append(members[2 * k:])
    out = {}
    for s, chunks in parts.items():
        out[s] = shuffled(texts, labels, np.concatenate(chunks), rng)
    if not out["validation"][0] or not out["train"][0]:
        raise TformerError(f"{len(texts)} rows are too few to hold out validation and test rows; give at least "
                           "3 rows of each class")
    return out
