"""Token streams: compact memmapped storage, deterministic batches, exact resume, cached preparation."""

import json

import numpy as np
import pytest
import torch

from tformer.data import prepare as prep
from tformer.data.stream import TokenData, TokenStream, write_stream
from tformer.core.errors import TformerError


def _stream(path, n, vocab_size):
    return write_stream(path, [np.arange(n) % vocab_size], vocab_size, {"tokenizer": "test"})


def test_dtype_sidecar_and_atomic_write(tmp_path):
    small = _stream(tmp_path / "small.bin", 1000, 50257)
    assert small.dtype == np.uint16 and small.path.stat().st_size == 2000
    big = _stream(tmp_path / "big.bin", 1000, 70000)
    assert big.dtype == np.uint32 and big.path.stat().st_size == 4000
    side = json.loads((tmp_path / "small.json").read_text())
    assert side["count"] == 1000 and side["vocab_size"] == 50257 and side["tokenizer"] == "test"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.bin", "big.json", "small.bin", "small.json"]
    with pytest.raises(TformerError, match="does not fit"):
        write_stream(tmp_path / "bad.bin", [[3, 70]], 64)
    assert not list(tmp_path.glob("*bad*")) and not list(tmp_path.glob(".*"))


def test_truncated_stream_is_refused(tmp_path):
    s = _stream(tmp_path / "train.bin", 100, 256)
    with open(s.path, "r+b") as f:
        f.truncate(150)
    with pytest.raises(TformerError, match="prepare the data again"):
        TokenStream(tmp_path / "train.bin")


def test_ids_outside_the_model_s_vocabulary_are_refused_once_at_the_stream(tmp_path):
    s = _stream(tmp_path / "train.bin", 300, 256)  # ids 0..255
    s.check_ids(256)
    with pytest.raises(TformerError, match=r"token id 255, outside the model's vocabulary \[0, 200\)"):
        s.check_ids(200)


@pytest.fixture
def data(tmp_path):
    # Distinct ids (uint32) so a window's ids reveal where it starts.
    _stream(tmp_path / "train.bin", 5000, 70000)
    _stream(tmp_path / "validation.bin", 300, 70000)
    return TokenData(tmp_path)


def test_get_batch_is_seeded_and_shifted(data):
    x, y = data.get_batch("train", 8, 32, torch.Generator().manual_seed(1))
    x2, y2 = data.get_batch("train", 8, 32, torch.Generator().manual_seed(1))
    x3, _ = data.get_batch("train", 8, 32, torch.Generator().manual_seed(2))
    assert x.shape == y.shape == (8, 32) and x.dtype == torch.int64
    assert torch.equal(x, x2) and torch.equal(y, y2) and not torch.equal(x, x3)
    assert torch.equal(y, x + 1)  # next token at every position (ids here are positions)
    assert torch.equal(x, x[:, :1] + torch.arange(32))  # contiguous windows
    assert int(y.max()) < 5000
    assert data["val"] is data["validation"]


def test_seq_len_longer_than_stream(data):
    with pytest.raises(TformerError, match="longer than the validation stream"):
        data.get_batch("validation", 2, 300, torch.Generator())
    data.get_batch("validation", 2, 299, torch.Generator())  # the longest that fits
    with pytest.raises(TformerError, match="no split 'test'"):
        data.get_batch("test", 2, 8)


def test_iterator_resumes_exactly_across_epochs(data):
    it = data.batches("validation", 2, 16, seed=3)
    assert it.batches_per_epoch <= 8  # so 20 batches cross epochs
    run = [next(it) for _ in range(20)]
    first = data.batches("validation", 2, 16, seed=3)
    for _ in range(11):
        next(first)
    state = json.loads(json.dumps(first.state_dict()))  # survives a checkpoint's JSON
    resumed = data.batches("validation", 2, 16, seed=3)
    resumed.load_state_dict(state)
    for (x, y), (rx, ry) in zip(run[11:], [next(resumed) for _ in range(9)]):
        assert torch.equal(x, rx) and torch.equal(y, ry)
    with pytest.raises(TformerError, match="global batch"):
        data.batches("validation", 4, 16).load_state_dict(state)


def test_iterator_epoch_visits_disjoint_windows(data):
    it = data.batches("train", 4, 49, seed=0)
    starts = torch.cat([next(it)[0][:, 0] for _ in range(it.batches_per_epoch)])
    assert len(set(starts.tolist())) == len(starts) == it.batches_per_epoch * 4
    gaps = starts.sort().values.diff()
    assert int(gaps.min()) >= 50  # seq_len + 1 apart: no window overlaps another


def test_ranks_split_the_same_global_batches(data):
    one = data.batches("train", 6, 16, seed=5)
    ranks = [data.batches("train", 3, 16, seed=5, rank=r, world_size=2) for r in range(2)]
    for _ in range(5):
        x, _ = next(one)
        assert torch.equal(x, torch.cat([next(r)[0] for r in ranks]))


def test_chunked_encoding_equals_whole_encoding():
    from tformer.data.tokenizers import ByteBPETokenizer

    text = "".join(f"Line {i}:  some  text\n\n  indented {i}\n\n\nEnd.\n" for i in range(200))
    pieces = prep.chunks(text, size=100)
    assert len(pieces) > 10 and "".join(pieces) == text
    tok = ByteBPETokenizer.train([text], vocab_size=300)  # learns "\n\n" merges a careless cut would split
    assert sum(tok.encode_batch(pieces), []) == tok.encode(text)


def test_prepare_shakespeare_char_is_cached(monkeypatch):
    from tformer.data.corpora import get_corpus

    data = prep.prepare("shakespeare", "char")
    tok = data.tokenizer()
    corpus = get_corpus("shakespeare")
    assert tok.vocab_size == data.vocab_size == 84
    assert len(data["train"]) == len(corpus.text("train")) and data["train"].dtype == np.uint16
    assert tok.decode(data["validation"].tokens[:200]) == corpus.text("validation")[:200]

    def refuse(*args, **kwargs):
        raise AssertionError("rebuilt")

    monkeypatch.setattr(prep, "build_tokenizer", refuse)
    assert prep.prepare("shakespeare", "char").directory == data.directory


def test_prepare_local_bpe(tmp_path, monkeypatch):
    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path / "cache"))
    text = "".join(f"The {w} sat on the mat number {i}.\n" for i, w in enumerate(["cat", "dog", "bird"] * 100))
    (tmp_path / "c.txt").write_text(text)
    data = prep.prepare(str(tmp_path / "c.txt"), "bpe", vocab_size=300)
    tok = data.tokenizer()
    assert tok.kind == "bpe" and tok.vocab_size <= 300
    assert tok.decode(data["train"].tokens) + tok.decode(data["validation"].tokens) == text
    with pytest.raises(TformerError, match="unknown tokenizer"):
        prep.prepare(str(tmp_path / "c.txt"), "sentencepiece")


def test_prepare_refuses_pairs(monkeypatch):
    from tformer.data import corpora

    pairs = corpora.Corpus("pairs", "pairs", "k", "", texts={"train": "a\tb\n"})
    monkeypatch.setattr(prep, "get_corpus", lambda name: pairs)  # the name prepare() calls
    with pytest.raises(TformerError, match="translation pairs"):
        prep.prepare("tatoeba-en-es", "char")
