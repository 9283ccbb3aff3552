"""Labelled text: the authorship builder (balanced, split by passage with no overlap, deterministic) on small made-up
works, and a user's CSV / JSONL file (columns, empty file, one class)."""

import json

import pytest

from tformer.core.errors import TformerError
from tformer.data import authorship as A
from tformer.data.labelled import read_labelled


def _works(prefix, n_works, lines_each):
    return {f"{prefix}{w}": "\n".join(f"{prefix} work {w} line {i} with enough letters in it, surely." for i in
                                      range(lines_each + w)) + "\nSHORT\nEnter HAMLET and HORATIO, with many others.\n"
            for w in range(n_works)}


WORKS = {"shakespeare": _works("s", 12, 40), "milton": _works("m", 4, 30)}


def test_authorship_is_balanced_split_by_passage_and_deterministic():
    data = A.build(WORKS, seed=3, passage=10)
    for split, (texts, labels) in data.splits.items():
        assert texts and labels.count(0) == labels.count(1), split
    # a line "m work 2 line 17 ..." sits in passage (m work 2, 1): each passage goes to one split whole
    passage_of = lambda line: (line.split(" line ")[0], int(line.split(" line ")[1].split()[0]) // 10)
    seen = {s: {passage_of(t) for t in data.texts(s)} for s in A.SPLITS}
    assert not seen["train"] & seen["validation"] and not seen["train"] & seen["test"]
    assert not seen["validation"] & seen["test"]
    assert all(not t.startswith(("Enter", "SHORT")) for s in A.SPLITS for t in data.texts(s))
    again = A.build(WORKS, seed=3, passage=10)
    assert again.splits == data.splits and again.note == data.note
    assert A.build(WORKS, seed=4, passage=10).splits != data.splits
    # one author's works reach several splits: a split measures the author, not the kinds of works it was given
    milton_works = {s: {t.split(" line ")[0] for t, y in zip(*data.splits[s]) if y == 1} for s in A.SPLITS}
    assert len(milton_works["train"] & (milton_works["validation"] | milton_works["test"])) >= 1


def test_a_line_in_two_works_is_kept_once():
    works = {"shakespeare": {**_works("s", 3, 10), "dup": "s0 work 0 line 1 with enough letters in it, surely."},
             "milton": _works("m", 3, 10)}
    data = A.build(works, seed=0)
    every = [t for s in A.SPLITS for t in data.texts(s)]
    assert len(every) == len(set(every))


def test_clean_line_drops_numbers_dots_headings_and_directions():
    line = "Of Cerberus and blackest Midnight born"
    assert A.clean_line("............" + line) == line
    assert A.clean_line("The Son of God, and added thus in scorn:--                  550") == \
        "The Son of God, and added thus in scorn:--"
    assert A.clean_line("THE FIRST BOOK OF THE POEM IN CAPITAL LETTERS") is None
    assert A.clean_line("[Exit Ghost, slowly, to the back of the stage.]") is None
    assert A.clean_line("too short") is None


def test_too_few_passages_is_one_line():
    with pytest.raises(TformerError, match="at least 3"):
        A.build({"shakespeare": _works("s", 5, 5), "milton": _works("m", 2, 5)})


def test_csv_and_jsonl_files_split_by_class(tmp_path):
    rows = [(f"text number {i}, with a comma", "pos" if i % 3 else "neg") for i in range(60)]
    csv_file = tmp_path / "d.csv"
    csv_file.write_text("label,text\n" + "".join(f'{y},"{t}"\n' for t, y in rows))
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t, "label": y}) + "\n" for t, y in rows))
    a, b = read_labelled(csv_file, seed=1), read_labelled(jsonl, seed=1)
    assert a.classes == b.classes == ("neg", "pos") and a.splits == b.splits
    assert sum(map(sum, a.counts().values())) == 60 and all(c[0] and c[1] for c in a.counts().values())
    assert not set(a.texts("train")) & set(a.texts("test"))


@pytest.mark.parametrize("content, message", [
    ("", "is empty"),
    ("words,label\nhello there,a\n", "no 'text' column"),
    ("text,label\nhello there,a\nagain here,a\n", "one label"),
])
def test_bad_files_are_one_line(tmp_path, content, message):
    path = tmp_path / "bad.csv"
    path.write_text(content)
    with pytest.raises(TformerError, match=message):
        read_labelled(path)
