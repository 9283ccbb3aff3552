"""Corpus + tokenizer -> cached token streams: what `tformer data get` and training call.

``prepare("shakespeare", "char")`` returns a `TokenData` whose folder holds one ``.bin`` +
``.json`` per split and the tokenizer (``tformer-tokenizer.json``). The folder lives under
``<cache>/tokens/<corpus key>/<tokenizer key>/`` and is built in a temporary folder and renamed,
so a second call only opens it.

Which text each tokenizer learns from:
- char: every split's characters (only the alphabet, so validation never meets an unknown char);
- bpe: trained on the train split only (byte-level, so held-out text still encodes);
- gpt2 / a saved or BERT tokenizer folder: nothing to learn.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from tformer.core.atomic import atomic_new_dir
from tformer.core.errors import TformerError
from tformer.data import tokenizers as tk
from tformer.data.corpora import cache_root, get_corpus
from tformer.data.stream import TokenData, write_stream

TOKENIZER_KINDS = ("char", "bpe", "gpt2")
DEFAULT_BPE_VOCAB = 4096
CHUNK_CHARS = 1 << 20

# A cut just after a newline that is followed by non-whitespace is a pre-token boundary for
# every tokenizer here (GPT-2's regex makes the "\n" its own pre-token), so encoding chunk by
# chunk gives exactly the ids of encoding the whole text at once.
_SAFE_CUT = re.compile(r"\n(?=\S)")


def chunks(text: str, size: int = CHUNK_CHARS) -> list[str]:
    """Split ``text`` into pieces of about ``size`` characters at safe boundaries."""
    out, start = [], 0
    while len(text) - start > size:
        m = _SAFE_CUT.search(text, start + size)
        if not m:
            break
        out.append(text[start:m.end()])
        start = m.end()
    out.append(text[start:])
    return out


def _bpe_vocab(vocab_size: int | None) -> int:
    """The default only when none was given: ``vocab_size or DEFAULT`` turned --vocab-size 0 into 4096."""
    return DEFAULT_BPE_VOCAB if vocab_size is None else vocab_size


def build_tokenizer(corpus, tokenizer: str, vocab_size: int | None = None):
    if tokenizer == "char":
        return tk.CharTokenizer(set().union(*(set(corpus.text(s)) for s in corpus.splits)))
    if tokenizer == "bpe":
        # Chunks, not lines: merges that span line ends ("\n\n") can be learned.
        texts = chunks(corpus.text("train"), 1 << 16)
        return tk.ByteBPETokenizer.train(texts, vocab_size=_bpe_vocab(vocab_size))
    if tokenizer == "gpt2":
        return tk.GPT2Tokenizer.fetch()
    path = Path(tokenizer).expanduser()
    if (path / tk.DESCRIPTOR).is_file():
        return tk.load(path)
    if path.is_dir():
        return tk.WordPieceTokenizer.from_checkpoint(path)
    raise TformerError(f"unknown tokenizer {tokenizer!r}; choose {', '.join(TOKENIZER_KINDS)}, or give a folder "
                       "with a saved tokenizer or a BERT checkpoint")


def _tokenizer_key(tokenizer: str, vocab_size: int | None) -> str:
    if tokenizer == "bpe":
        return f"bpe-{_bpe_vocab(vocab_size)}"
    if tokenizer in TOKENIZER_KINDS:
        return tokenizer
    path = Path(tokenizer).expanduser().resolve()
    return "dir-" + hashlib.sha256(str(path).encode()).hexdigest()[:12]


def prepare(name_or_path: str, tokenizer: str = "char", vocab_size: int | None = None):
    """Token streams for every split of a text corpus, built once and cached."""

    corpus = get_corpus(name_or_path)
    if corpus.kind != "text":
        raise TformerError(f"{corpus.name} is translation pairs, not one text stream; batch it with "
                           "tformer.data.seq2seq.PairBatcher")
    final = cache_root() / "tokens" / corpus.key / _tokenizer_key(tokenizer, vocab_size)
    if (final / "complete").is_file():
        return TokenData(final)
    tok = build_tokenizer(corpus, tokenizer, vocab_size)
    with atomic_new_dir(final, "complete") as tmp:
        tok.save(tmp)
        for split in corpus.splits:
            ids = tok.encode_batch(chunks(corpus.text(split)))
            write_stream(tmp / f"{split}.bin", ids, tok.vocab_size,
                         {"corpus": corpus.name, "corpus_key": corpus.key, "split": split,
                          "split_note": corpus.split_note, "tokenizer": tok.kind})
        (tmp / "complete").write_text("")
    return TokenData(final)
