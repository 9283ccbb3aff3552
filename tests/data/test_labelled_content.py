"""Labelled files of the right syntax and the wrong content (issue 37): a row whose label is missing, empty, null,
a list, an object, a fraction or spelled as a missing value ("nan", "None") is refused naming its line, never turned
into a class; labels of mixed types, texts that are not strings, lines over the limit and bytes that are not UTF-8
are one line naming the file and where."""

from __future__ import annotations

import csv
import io
import json

import pytest
from hostile_values import HOSTILE, examples, one_line
from hypothesis import given
from hypothesis import strategies as st

from tformer.data.labelled import MAX_LINE_CHARS, MISSING_SPELLINGS, read_labelled

GOOD = [(f"row number {i} says something", "ab"[i % 2]) for i in range(20)]


def not_a_label(label) -> bool:
    """What must never become a class (a spec of its own: null, a fraction, a container, blank, a missing value)."""
    if label is None or isinstance(label, (float, list, dict)):
        return True
    return isinstance(label, str) and (not label.strip() or label.strip() in MISSING_SPELLINGS)


def assert_valid(data, n_rows: int) -> None:
    assert len(data.classes) >= 2 and all(isinstance(c, str) and c.strip() for c in data.classes)
    assert not set(data.classes) & MISSING_SPELLINGS and "None" not in data.classes
    rows = 0
    for texts, labels in data.splits.values():
        assert all(isinstance(t, str) and t.strip() for t in texts)
        assert all(type(y) is int and 0 <= y < len(data.classes) for y in labels)
        rows += len(texts)
    assert rows <= n_rows


def read(path, bad_lines: set[int]):
    try:
        data = read_labelled(path)
    except Exception as exc:  # noqa: BLE001 - the property: a TformerError of one line, nothing else
        message = one_line(exc, str(path))
        assert "line" in message or "not UTF-8" in message or "binary" in message, message  # where in the file
        return None
    assert not bad_lines, f"lines {sorted(bad_lines)} were read as rows"
    return data


ROW_VALUES = st.one_of(HOSTILE, st.sampled_from(["a", "b", "c", 0, 1, 7, True]))


@examples(250)
@given(st.lists(st.tuples(st.integers(0, len(GOOD)), ROW_VALUES, ROW_VALUES, st.sampled_from(["both", "no text",
                                                                                                  "no label"])),
                min_size=1, max_size=3),
       st.booleans())
def test_jsonl_rows_of_any_content_read_as_classes_or_are_one_line(tmp_path_factory, inserted, ascii_only):
    rows = [{"text": t, "label": y} for t, y in GOOD]
    for at, text, label, keys in inserted:
        row = {"text": text, "label": label}
        row.pop({"no text": "text", "no label": "label"}.get(keys, ""), None)
        rows.insert(at, row)
    path = tmp_path_factory.mktemp("jsonl") / "rows.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=ascii_only) + "\n" for r in rows), encoding="utf-8",
                    errors="surrogatepass")
    bad = {n for n, r in enumerate(rows, 1) if "label" not in r or not_a_label(r["label"])}
    data = read(path, bad)
    if data is not None:
        assert_valid(data, len(rows))


CELLS = st.one_of(st.text(max_size=12), st.sampled_from(["", " ", "nan", "None", "NaN", "null", "a", "b", "1, 2",
                                                         'say "hi"', "two\nlines", "a\u2028b", "x" * 200_000]))


@examples(150)
@given(st.lists(st.tuples(st.integers(0, len(GOOD)), st.lists(CELLS, min_size=0, max_size=3)), min_size=1,
                max_size=3))
def test_csv_rows_of_any_content_read_as_classes_or_are_one_line(tmp_path_factory, inserted):
    rows = [[t, y] for t, y in GOOD]
    for at, cells in inserted:
        rows.insert(at, cells)
    out = io.StringIO(newline="")
    writer = csv.writer(out)
    writer.writerow(["text", "label"])
    writer.writerows(rows)
    path = tmp_path_factory.mktemp("csv") / "rows.csv"
    path.write_text(out.getvalue(), encoding="utf-8", errors="surrogatepass")
    # A row is bad when it has cells but its label cell is missing, blank or spells a missing value.
    bad = {0} if any(len(r) >= 2 and not_a_label(r[1]) or len(r) == 1 and r[0].strip() or len(r) > 2
                     for r in rows if any(c.strip() for c in r)) else set()
    data = read(path, bad)
    if data is not None:
        assert_valid(data, len(rows))


@examples(60)
@given(st.integers(0, 2 * len(GOOD)), st.sampled_from([b"\xff", b"\x80", b"\xc3(", b"\xed\xa0\x80"]),
       st.sampled_from(["rows.csv", "rows.jsonl"]))
def test_bytes_that_are_not_utf8_name_the_file_and_the_byte(tmp_path_factory, line, bad, name):
    if name.endswith(".csv"):
        lines = ["text,label"] + [f"{t},{y}" for t, y in GOOD]
    else:
        lines = [json.dumps({"text": t, "label": y}) for t, y in GOOD]
    data = "\n".join(lines).encode()
    cut = sum(len(x) + 1 for x in lines[: line % len(lines)])  # at the start of a line: no character is split
    path = tmp_path_factory.mktemp("bytes") / name
    path.write_bytes(data[:cut] + bad + data[cut:])
    with pytest.raises(Exception) as exc:
        read_labelled(path)
    one_line(exc.value, str(path), "not UTF-8", f"byte {cut}")


@pytest.mark.parametrize("name, lines, found", [
    ("null.jsonl", [{"text": "x", "label": None}], "line 21: has no label"),
    ("nan.jsonl", [{"text": "x", "label": float("nan")}], "line 21: has label NaN"),
    ("float.jsonl", [{"text": "x", "label": 1.0}], "line 21: has label 1.0"),
    ("list.jsonl", [{"text": "x", "label": ["a"]}], "line 21: has label a list of 1 item"),
    ("empty.jsonl", [{"text": "x", "label": " "}], "line 21: has an empty label"),
    ("none.jsonl", [{"text": "x", "label": "None"}], 'line 21: has label "None", which is how a missing value'),
    ("mixed.jsonl", [{"text": "x", "label": 3}], "line 21: has label 3 (whole number) but line 1's label"),
    ("text.jsonl", [{"text": 5, "label": "a"}], "line 21: 'text' is 5, not a string"),
    ("nolabel.jsonl", [{"text": "x"}], "line 21 has no 'label' key"),
    ("surrogate.jsonl", [{"text": "x\ud800", "label": "a"}], "line 21: 'text' holds a lone surrogate (U+D800)"),
    ("long.jsonl", [{"text": "x" * MAX_LINE_CHARS, "label": "a"}], f"over the limit of {MAX_LINE_CHARS}"),
    ("blank.csv", ["x,"], "line 22: has an empty label"),
    ("short.csv", ["x"], "line 22: has no label"),
    ("nan.csv", ["x,nan"], 'line 22: has label "nan"'),
    ("comma.csv", ["x, y,a"], "line 22: has 3 fields but the header names 2"),
    ("long.csv", ["x" * MAX_LINE_CHARS + ",a"], f"over the limit of {MAX_LINE_CHARS}"),
    ("field.csv", ['"' + "x\n" * (MAX_LINE_CHARS // 2 + 1) + '",a'], f"limit of {MAX_LINE_CHARS} characters"),
])
def test_each_wrong_row_is_named(tmp_path, name, lines, found):
    path = tmp_path / name
    if name.endswith(".csv"):
        path.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in GOOD) + "\n".join(lines) + "\n")
    else:
        rows = [{"text": t, "label": y} for t, y in GOOD] + lines
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(Exception) as exc:
        read_labelled(path)
    one_line(exc.value, str(path), found)


def test_whole_number_and_boolean_labels_are_classes_and_u2028_stays_in_its_row(tmp_path):
    path = tmp_path / "ints.jsonl"
    path.write_text("".join(json.dumps({"text": f"t{i}\u2028more", "label": i % 3}, ensure_ascii=False) + "\n"
                            for i in range(30)))
    data = read_labelled(path)
    assert data.classes == ("0", "1", "2") and any("\u2028" in t for t in data.texts("train"))
    path.write_text("".join(json.dumps({"text": f"t{i}", "label": i % 2 == 0}) + "\n" for i in range(30)))
    assert read_labelled(path).classes == ("False", "True")
