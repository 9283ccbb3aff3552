"""Labelled text for sequence classification: a user's CSV or JSONL of (text, label) rows, or a named set built from
packaged data (``authorship``: tformer.data.authorship).

``LabelledText`` holds train / validation / test lists of (text, class id) and the class names. A user's file is
split by row, each class shuffled with the seed and cut 80/10/10, so every split keeps the class balance; the
named sets say how they split in ``note``.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tformer.core.errors import TformerError
from tformer.core.files import FileFormatError, described, read_text

SPLITS = ("train", "validation", "test")
HELD_OUT = 0.1  # validation and test each take this share of every class of a user's file
TEXT_COLUMN, LABEL_COLUMN = "text", "label"
MAX_FILE_BYTES = 1 << 30  # a labelled text file of a gigabyte is not a fine-tuning set this loader should hold
# A row's line: a text a classifier reads is cut to a few hundred tokens; this is also the csv module's own limit
# on a field, so CSV and JSONL files share one limit.
MAX_LINE_CHARS = 1 << 17
# How Python, pandas and JSON tools write a missing value into a text column: never a class.
MISSING_SPELLINGS = frozenset({"None", "nan", "NaN", "null", "NULL", "<NA>", "NaT"})


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
    as a LabelledText. Rows with empty text are skipped; classes are the labels as text, sorted (class 0 is the first).

    Every row's label is checked, not only the file's syntax: a row with no label, an empty or null one, a list,
    an object, a fractional number, a label spelled as a missing value ("nan", "None") or a label of another type
    than the others is refused, naming the line; so is a line over MAX_LINE_CHARS."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise TformerError(f"--data {path}: no such file; give a CSV or JSONL file of {TEXT_COLUMN},{LABEL_COLUMN} "
                           "rows, or --data authorship")
    raw = read_text(path, "labelled file", MAX_FILE_BYTES, fix="save it as UTF-8 text of text,label rows")
    text = raw.removeprefix("\ufeff")  # the byte-order mark Excel writes
    if not text.strip():
        raise FileFormatError(f"{path} is empty; give one {TEXT_COLUMN},{LABEL_COLUMN} row per example", path)
    _check_line_lengths(text, path)
    rows = _jsonl_rows(text, path) if path.suffix.lower() in (".jsonl", ".ndjson") else _csv_rows(text, path)
    _check_label_types(rows, path)
    rows = [(t.strip(), _class_name(y)) for _, t, y in rows if t.strip()]
    if not rows:
        raise FileFormatError(f"{path} has no row with text in its '{TEXT_COLUMN}' column; fill it in", path)
    classes = tuple(sorted({y for _, y in rows}))
    if len(classes) < 2:
        raise FileFormatError(f"{path} has one label ({classes[0]!r}) for every row; a classifier needs at least 2 "
                              "classes, so add rows of another label", path)
    index = {c: i for i, c in enumerate(classes)}
    texts, labels = [t for t, _ in rows], [index[y] for _, y in rows]
    digest = hashlib.sha256(raw.encode("utf-8")).hexdigest()[:12]
    return LabelledText(path.name, classes, split_rows(texts, labels, seed),
                        f"by row: each class shuffled (seed {seed}), {HELD_OUT:.0%} validation, {HELD_OUT:.0%} test",
                        f"file-{digest}-seed{seed}")


def _fail(path: Path, line: int, problem: str, fix: str) -> FileFormatError:
    return FileFormatError(f"{path} line {line}: {problem}; {fix}", path)


def _check_line_lengths(text: str, path: Path) -> None:
    # Lines split at "\n" only: str.splitlines would also split at U+2028 and \x85, which JSON strings and quoted
    # CSV fields may hold.
    for number, line in enumerate(text.split("\n"), 1):
        if len(line) > MAX_LINE_CHARS:
            raise _fail(path, number, f"is {len(line)} characters long, over the limit of {MAX_LINE_CHARS} a "
                        "labelled row may have", "shorten its text or split it into several rows")


def _csv_rows(text: str, path: Path) -> list[tuple[int, str, object]]:
    """(line, text, label) of every non-blank row."""
    reader = csv.reader(io.StringIO(text, newline=""))
    rows = []
    try:
        columns = next(reader, [])
        _check_columns(columns, path)
        for names in (TEXT_COLUMN, LABEL_COLUMN):
            if columns.count(names) > 1:
                raise _fail(path, 1, f"has {columns.count(names)} '{names}' columns", "keep one")
        at_text, at_label = columns.index(TEXT_COLUMN), columns.index(LABEL_COLUMN)
        for row in reader:
            if not any(cell.strip() for cell in row):  # a blank line, or a spreadsheet's empty row ",,"
                continue
            if len(row) > len(columns):  # an unquoted comma in the text: the label read would be a piece of it
                raise _fail(path, reader.line_num, f"has {len(row)} fields but the header names {len(columns)}",
                            "quote fields that hold commas")
            cells = row + [None] * (len(columns) - len(row))
            rows.append((reader.line_num, cells[at_text] or "", cells[at_label]))
    except csv.Error as exc:
        limit = csv.field_size_limit()
        if "field larger than field limit" in str(exc):
            raise _fail(path, reader.line_num, f"has a field longer than the CSV reader's limit of {limit} "
                        "characters", "shorten its text or split it into several rows") from None
        raise _fail(path, reader.line_num, f"is not valid CSV ({exc})",
                    "quote fields that hold commas or newlines") from None
    return rows


def _jsonl_rows(text: str, path: Path) -> list[tuple[int, str, object]]:
    """(line, text, label) of every non-blank line."""
    rows = []
    for number, line in enumerate(text.split("\n"), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise _fail(path, number, f"is not JSON ({exc.msg} at column {exc.colno})",
                        "write one object per line") from None
        except (ValueError, RecursionError) as exc:  # a number of over 4300 digits; brackets nested past the stack
            raise _fail(path, number, f"is not JSON that can be read ({type(exc).__name__})",
                        "write one object per line") from None
        if not isinstance(obj, dict):
            raise _fail(path, number, f"is {described(obj)}, not a JSON object",
                        f'write {{"{TEXT_COLUMN}": ..., "{LABEL_COLUMN}": ...}} per line')
        _check_columns(list(obj), path, f" line {number}", "key")
        if not isinstance(obj[TEXT_COLUMN], str):
            raise _fail(path, number, f"'{TEXT_COLUMN}' is {described(obj[TEXT_COLUMN])}, not a string",
                        "give each row its text as a string")
        for key in (TEXT_COLUMN, LABEL_COLUMN):
            bad = _surrogate(obj[key])
            if bad:  # "\\ud800" is valid JSON but no character: it cannot be tokenized or printed
                raise _fail(path, number, f"'{key}' holds a lone surrogate (U+{ord(bad):04X}), not UTF-8 text",
                            "write the text as UTF-8")
        rows.append((number, obj[TEXT_COLUMN], obj[LABEL_COLUMN]))
    return rows


def _surrogate(value) -> str | None:
    if isinstance(value, str):
        return next((c for c in value if "\ud800" <= c <= "\udfff"), None)
    return None


def _check_columns(columns: list[str], path: Path, where: str = "", what: str = "column") -> None:
    for needed in (TEXT_COLUMN, LABEL_COLUMN):
        if needed not in columns:
            shown = ", ".join(described(c) if len(c) > 40 or not c.isprintable() else c for c in columns[:20])
            raise FileFormatError(f"{path}{where} has no '{needed}' {what} (it has: {shown or 'none'}); name the "
                                  f"{what}s {TEXT_COLUMN} and {LABEL_COLUMN}", path)


def _label_kind(label) -> str | None:
    """"text", "whole number" or "true/false": the kinds of value a class can be named by; None for any other."""
    if isinstance(label, bool):
        return "true/false"
    if isinstance(label, int):
        return "whole number"
    if isinstance(label, str):
        return "text"
    return None


def _check_label_types(rows: list[tuple[int, str, object]], path: Path) -> None:
    """Every label names a class: never a missing value (it would become a class named "None" or "nan"), and all
    of one kind (1 and "1" would be one class, 1 and "one" two)."""
    first = None
    for line, _, label in rows:
        kind = _label_kind(label)
        if label is None or (isinstance(label, str) and not label.strip()):
            raise _fail(path, line, f"has {'no' if label is None else 'an empty'} label",
                        "give every row its label, or delete the row")
        if kind is None:
            hint = (" (a column of whole numbers with a missing value is written as floats)"
                    if isinstance(label, float) else "")
            raise _fail(path, line, f"has label {described(label)}, which is not a class name{hint}",
                        "give every row one label: text or a whole number")
        if kind == "text" and label.strip() in MISSING_SPELLINGS:
            raise _fail(path, line, f"has label {described(label)}, which is how a missing value is written",
                        "give the row its label, or delete the row")
        if first is None:
            first = (line, kind, label)
        elif kind != first[1]:
            raise _fail(path, line, f"has label {described(label)} ({kind}) but line {first[0]}'s label "
                        f"{described(first[2])} is {first[1]}", "give every label the same type")


def _class_name(label) -> str:
    return label.strip() if isinstance(label, str) else str(label)


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
