"""Tokenizer files of the right syntax and the wrong content (issue 37): tformer's descriptor (tformer-tokenizer.json),
the Hugging Face tokenizer.json beside it, BERT's vocab.txt and a .tiktoken ranks file. A field of the wrong type, a
special id that is out of range or names another token, a vocab_size the files disagree with, a file name that leads
out of the folder, a tokenizer.json the library panics on and a ranks file tiktoken would panic on are each one line
naming the file and the key or line; a tokenizer that loads has the types it declares."""

from __future__ import annotations

import base64
import json
import shutil

import pytest
from hostile_values import DELETE, HOSTILE, examples, one_line
from hypothesis import given
from hypothesis import strategies as st

from tformer.data import tokenizers as tk


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A saved character tokenizer and a saved byte-level BPE, each in a folder of its own."""
    root = tmp_path_factory.mktemp("tokenizers")
    tk.CharTokenizer.from_text("hello world", specials={"pad": "<pad>", "eos": "</s>"}).save(root / "char")
    tk.ByteBPETokenizer.train(["hello world, the quick brown fox"] * 20, vocab_size=300).save(root / "bpe")
    return root


def assert_typed(tok) -> None:
    assert type(tok.vocab_size) is int and tok.vocab_size >= 1
    assert all(isinstance(r, str) and type(i) is int and 0 <= i < tok.vocab_size for r, i in tok.special_ids.items())
    assert isinstance(tok.decode(tok.encode("hello")), str)


def load(folder) -> None:
    try:
        tok = tk.load(folder)
    except Exception as exc:  # noqa: BLE001 - the property: a TformerError of one line, nothing else
        one_line(exc, str(folder))
    else:
        assert_typed(tok)


KEYS = ["format", "version", "kind", "vocab_size", "special_ids", "chars", "specials", "file", "source"]
ROLES = st.sampled_from(["pad", "bos", "eos", "mask", "unk", "", "x" * 50])
IDS = st.one_of(HOSTILE, st.integers(-2, 320))


@examples(250)
@given(st.sampled_from(["char", "bpe"]),
       st.lists(st.tuples(st.sampled_from(KEYS), st.one_of(HOSTILE, st.just(DELETE))), max_size=2),
       st.dictionaries(ROLES, IDS, max_size=2))
def test_a_descriptor_of_any_content_loads_typed_or_is_one_line(saved, tmp_path_factory, kind, changes, ids):
    folder = tmp_path_factory.mktemp("desc") / kind
    shutil.copytree(saved / kind, folder)
    desc = json.loads((folder / tk.DESCRIPTOR).read_text())
    for key, value in changes:
        if value is DELETE:
            desc.pop(key, None)
        else:
            desc[key] = value
    if ids:
        desc["special_ids"] = {**desc.get("special_ids", {}), **ids} if isinstance(desc.get("special_ids"),
                                                                                    dict) else ids
    (folder / tk.DESCRIPTOR).write_text(json.dumps(desc))
    load(folder)


def _paths(obj, path=()):
    """Every key path into ``obj`` (lists: their first two items), for setting a value anywhere in a tokenizer.json."""
    yield path
    items = obj.items() if isinstance(obj, dict) else enumerate(obj[:2]) if isinstance(obj, list) else ()
    for key, value in items:
        if key not in ("vocab",) or len(path) < 1:
            yield from _paths(value, (*path, key))


@examples(200)
@given(st.data())
def test_a_tokenizer_json_of_any_content_loads_or_is_one_line(saved, tmp_path_factory, data):
    folder = tmp_path_factory.mktemp("hf") / "bpe"
    shutil.copytree(saved / "bpe", folder)
    doc = json.loads((folder / "tokenizer.json").read_text())
    where = data.draw(st.sampled_from([p for p in _paths(doc) if p]))
    value = data.draw(st.one_of(HOSTILE, st.sampled_from(["xxxxx", "##", "BPE", "WordPiece", "ByteLevel"])))
    target = doc
    for key in where[:-1]:
        target = target[key]
    target[where[-1]] = value
    (folder / "tokenizer.json").write_text(json.dumps(doc))
    load(folder)


@pytest.mark.parametrize("kind, change, found", [
    ("char", {"chars": ""}, "key 'chars' is an empty string"),
    ("char", {"chars": ["h", "e"]}, "key 'chars' is a list of 2 items"),
    ("char", {"chars": "helo wr\ud800"}, "key 'chars'"),
    ("char", {"specials": ["<pad>"]}, "key 'specials' is a list of 1 item"),
    ("char", {"vocab_size": 99}, "key 'vocab_size' is 99, expected 10"),
    ("char", {"vocab_size": "10"}, "key 'vocab_size' is \"10\""),
    ("char", {"special_ids": {"pad": 1, "eos": 1}}, "key 'special_ids.pad' is 1, expected 0"),
    ("char", {"special_ids": {"pad": True, "eos": 1}}, "key 'special_ids.pad' is true"),
    ("char", {"kind": "sentencepiece"}, "key 'kind' is \"sentencepiece\", expected one of char"),
    ("char", {"kind": None}, "key 'kind' is null"),
    ("char", {"version": 2}, "key 'version' is 2"),
    ("char", {"format": "other"}, "key 'format'"),
    ("bpe", {"file": "../bpe/tokenizer.json"}, "key 'file' is \"../bpe/tokenizer.json\""),
    ("bpe", {"file": "/etc/passwd"}, "key 'file'"),
    ("bpe", {"special_ids": {"pad": 5}}, "key 'special_ids.pad' is 5, expected the id of <pad>"),
    ("bpe", {"special_ids": {"pad": 10 ** 30}}, "key 'special_ids.pad'"),
    ("bpe", {"special_ids": {"pad": 0.0}}, "key 'special_ids' is an object"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 30 else "")
def test_each_wrong_descriptor_field_is_named(saved, tmp_path, kind, change, found):
    folder = tmp_path / kind
    shutil.copytree(saved / kind, folder)
    desc = json.loads((folder / tk.DESCRIPTOR).read_text())
    (folder / tk.DESCRIPTOR).write_text(json.dumps({**desc, **change}))
    with pytest.raises(Exception) as exc:
        tk.load(folder)
    one_line(exc.value, str(folder / tk.DESCRIPTOR), found)


def test_a_tokenizer_json_the_library_panics_on_and_one_not_utf8_are_one_line(saved, tmp_path):
    folder = tmp_path / "bpe"
    shutil.copytree(saved / "bpe", folder)
    doc = json.loads((folder / "tokenizer.json").read_text())
    doc["model"]["continuing_subword_prefix"] = "xxxxx"  # tokenizers' Rust code panics at the first encode
    (folder / "tokenizer.json").write_text(json.dumps(doc))
    with pytest.raises(Exception) as exc:
        tk.load(folder)
    one_line(exc.value, str(folder / "tokenizer.json"), "not a tokenizer the library can load")
    text = (saved / "bpe" / "tokenizer.json").read_bytes()
    at = text.index(b'"model"')
    (folder / "tokenizer.json").write_bytes(text[:at] + b"\xff" + text[at:])
    with pytest.raises(Exception) as exc:
        tk.load(folder)
    one_line(exc.value, str(folder / "tokenizer.json"), "not UTF-8", f"byte {at}")


def test_a_vocab_txt_without_unk_or_with_a_wrong_lowercase_flag_is_one_line(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\n[CLS]\n[SEP]\nthe\n")
    with pytest.raises(Exception) as exc:
        tk.WordPieceTokenizer.from_checkpoint(tmp_path)
    one_line(exc.value, str(tmp_path / "vocab.txt"), "[UNK]")
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n[CLS]\n[SEP]\nthe\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": "false"}))
    with pytest.raises(Exception) as exc:
        tk.WordPieceTokenizer.from_checkpoint(tmp_path)
    one_line(exc.value, "tokenizer_config.json", "key 'do_lower_case' is \"false\"")


# A ranks file tiktoken can use: every byte ranked, then a few merges.
RANKS = [bytes([b]) for b in range(256)] + [b"he", b"ll", b"hell", b"hello", b" w"]


def _ranks_lines() -> list[bytes]:
    return [base64.b64encode(t) + b" " + str(i).encode() for i, t in enumerate(RANKS)]


LINE_EDITS = st.one_of(
    st.binary(max_size=20), st.sampled_from([b"", b" ", b"aGU= -1", b"aGU= 1", b"aGU= 99999999999", b"!!!! 3",
                                             b"aGU=", b"aGU= 3 4", b"aGU=  3", b"aGU= \xff", b"A" * 2000 + b" 7"]),
    st.tuples(st.binary(min_size=1, max_size=4), st.integers(-5, 2 ** 33)).map(
        lambda tr: base64.b64encode(tr[0]) + b" " + str(tr[1]).encode()))


@examples(200)
@given(st.lists(st.tuples(st.integers(0, len(RANKS)), LINE_EDITS, st.booleans()), min_size=1, max_size=3))
def test_a_ranks_file_of_any_content_parses_or_is_one_line(tmp_path_factory, edits):
    lines = _ranks_lines()
    for at, line, replace in edits:
        if replace and at < len(lines):
            lines[at] = line
        else:
            lines.insert(at, line)
    path = tmp_path_factory.mktemp("ranks") / "r.tiktoken"
    path.write_bytes(b"\n".join(lines) + b"\n")
    try:
        ranks = tk.load_tiktoken_ranks(path)
    except Exception as exc:  # noqa: BLE001 - the property: a TformerError of one line, nothing else
        one_line(exc, str(path))
        return
    assert all(isinstance(t, bytes) and t and type(r) is int and 0 <= r < 2 ** 32 for t, r in ranks.items())
    assert len(set(ranks.values())) == len(ranks) and all(bytes([b]) in ranks for b in range(256))
    import tiktoken

    enc = tiktoken.Encoding(name="t", pat_str=tk.GPT2_PATTERN, mergeable_ranks=ranks, special_tokens={})
    assert enc.decode(enc.encode_ordinary("hello world")) == "hello world"


def test_a_ranks_file_that_is_not_gpt2s_is_refused_by_its_digest(tmp_path):
    path = tmp_path / tk.GPT2_RANKS_FILE
    path.write_bytes(b"\n".join(_ranks_lines()) + b"\n")
    with pytest.raises(Exception) as exc:
        tk.GPT2Tokenizer(path)
    one_line(exc.value, str(path), f"not the expected {tk.GPT2_RANKS_SHA256_PREFIX}")
