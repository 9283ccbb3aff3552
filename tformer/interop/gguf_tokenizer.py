"""The tokenizer a GGUF file describes, built from its metadata on the HF ``tokenizers`` BPE engine.

``tokenizer_from_gguf(metadata)`` reads llama.cpp's keys (``tokenizer.ggml.model``, ``.pre``, ``.tokens``,
``.token_type``, ``.merges``, the bos/eos/pad/unk ids, ``.add_bos_token`` / ``.add_eos_token``) and returns a
`GGUFTokenizer` with the calls `tformer generate` and `serve` make (``encode``, ``decode``, ``save``, the
special-token ids). ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE) is built here; "llama" (SentencePiece)
in gguf_spm, whose `GGUFSentencePiece` answers the same calls (both on gguf_tokens' `GGUFTokenizerBase`).

Pre-tokenizer. ``tokenizer.ggml.pre`` names a list of regular expressions in llama.cpp
(``src/llama-vocab.cpp``, ``llm_tokenizer_bpe``); each splits the pieces the previous one left, keeping
matches and the text between them, then the pieces go to byte-level BPE. Here that list is a
``pre_tokenizers.Sequence`` of ``Split(..., "isolated")`` and a regex-free ``ByteLevel``:

- ``smollm`` (SmolLM/SmolLM2): ``\\p{N}`` (every digit its own piece), then GPT-2's pattern. The same split as
  the SmolLM tokenizer.json's ``Digits(individual_digits=True)`` + ``ByteLevel``.
- ``gpt-2`` (and ``gpt2``): GPT-2's pattern.
- ``llama-bpe`` (``llama3``, ``llama-v3``): LLaMA 3's pattern; merges ignored for a piece that is itself a
  token (llama.cpp's ``ignore_merges``), BOS added unless the file says otherwise.
- ``qwen2`` (Qwen2, Qwen2.5, Qwen3): LLaMA 3's pattern with every digit its own piece; merges applied, no BOS.
- ``default``: llama.cpp's fallback: punctuation runs, GPT-2's pattern, digit runs, three ASCII digits.

What transformers does with these files (5.24, ``integrations/gguf/gguf_tokenizer_mapping.py``): it hands the
vocabulary and merges to ``GPT2Tokenizer`` (BPE, ``ByteLevel(add_prefix_space=False)`` pre-tokenizer with
GPT-2's regex, ``ByteLevel`` decoder, no normalizer) and replaces the pre-tokenizer only for the names in its
``GGUF_PRE_TOKENIZER_SPLITS`` table, which has no ``smollm``. So for SmolLM2 it splits with GPT-2's pattern
alone, and differs from llama.cpp and from SmolLM2's own tokenizer (whose tokenizer.json spells the split
``Digits(individual_digits=True)`` then ``ByteLevel``) wherever a number character follows two or more
whitespace characters (``"a  1"``: transformers ``a Ġ Ġ 1``, smollm ``a ĠĠ 1``; a line starting with a digit
after a blank line: ``Ċ Ċ 1`` against ``ĊĊ 1``), or a number character beyond 0-9 follows a space or another
number character (``" ½"``: its UTF-8 bytes merge with the space's). Measured: 156 of Shakespeare's 146,363
line-break-delimited pieces (159 tokens in 1.56 M) and 1 place in WikiText-2's test split; text with no
``\\p{N}`` character is split identically, so there the ids are equal. transformers also never sets
``ignore_merges`` for ``llama-bpe``, and drops a character whose byte has no token (see below). This module
follows llama.cpp's meaning of ``tokenizer.ggml.pre``.

Special tokens. Control tokens (token_type 3) are added as special tokens: matched whole in the text only
when ``encode(..., special=True)`` asks (llama.cpp's ``parse_special``); otherwise their text is ordinary text
cut into byte-level pieces. User-defined tokens (4) are always matched whole, as llama.cpp and transformers
both do. Control and user-defined tokens are stored in the file as raw text (not in the byte alphabet), and
are decoded as that text; ``decode(..., skip_special=True)`` drops the control tokens.

A vocabulary need not have a token for every byte (SmolLM2's lacks 0x04, 0x06, 0x13, 0x14, 0x16, 0x1d, 0xf1,
0xf2 and the 13 bytes UTF-8 never uses); text with a character that needs one is refused in one line
(transformers drops the character silently, llama.cpp throws).
"""

from __future__ import annotations

import numpy as np

from tformer.core.errors import TformerError
from tformer.core.files import described
from tformer.data.tokenizers import GPT2_PATTERN
from tformer.interop.gguf_spm import GGUFSentencePiece, sentencepiece_from_gguf
from tformer.interop.gguf_tokens import (
    CONTROL,
    FIX,
    USER_DEFINED,
    GGUFTokenizerBase,
    chat_template_of,
    kind_of,
    read_framing,
    read_special_ids,
    read_token_types,
    read_tokens,
    utf8,
)

# LLaMA 3's pattern as its tokenizer.json spells it (llama.cpp keeps it, spelling (?i:...) out by hand).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                  r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen2's (and Qwen2.5's, Qwen3's): LLaMA 3's with each digit a piece of its own.
QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


class _Pre:
    """One ``tokenizer.ggml.pre``: the regexes in order, llama.cpp's ignore_merges and add_bos defaults."""

    def __init__(self, regexes: tuple[str, ...], ignore_merges: bool = False, add_bos: bool = False):
        self.regexes, self.ignore_merges, self.add_bos = regexes, ignore_merges, add_bos


_GPT2 = _Pre((GPT2_PATTERN,))
_LLAMA3 = _Pre((LLAMA3_PATTERN,), ignore_merges=True, add_bos=True)
PRE_TOKENIZERS = {
    "smollm": _Pre((r"\p{N}", GPT2_PATTERN)),
    "gpt-2": _GPT2,
    "gpt2": _GPT2,
    "llama-bpe": _LLAMA3,
    "llama3": _LLAMA3,
    "llama-v3": _LLAMA3,
    "qwen2": _Pre((QWEN2_PATTERN,)),
    "default": _Pre((r"[\p{P}\$\+<=>\^~\|]+", GPT2_PATTERN, r"\p{N}+", r"[0-9][0-9][0-9]")),
}


class GGUFTokenizer(GGUFTokenizerBase):
    """Byte-level BPE from a GGUF file's metadata, behind tformer's tokenizer calls (see GGUFTokenizerBase);
    ``pre`` names the file's pre-tokenizer."""

    model = "gpt2"

    def __init__(self, hf_special, hf_plain, special_ids: dict[str, int], add_bos: bool, add_eos: bool,
                 pre: str, control_ids: frozenset[int], chat_template: str | None = None):
        super().__init__(hf_special, hf_plain, special_ids, add_bos, add_eos, control_ids, chat_template)
        self.pre = pre
        # The bytes with no token: BPE would drop them silently (as transformers does), llama.cpp throws.
        vocab = hf_special.get_vocab(with_added_tokens=False)
        self._no_token = np.array([BYTES[b] not in vocab for b in range(256)])
        self._lacks = bool(self._no_token[_UTF8_BYTES].any())

    def _check(self, text: str) -> None:
        """Refuse text that is not Unicode (a lone surrogate) or holds a character whose UTF-8 bytes include one
        with no token."""
        data = np.frombuffer(utf8(text), dtype=np.uint8)
        hit = np.flatnonzero(self._no_token[data]) if self._lacks else ()
        if len(hit):
            start = len(data[:hit[0]].tobytes().decode("utf-8", errors="ignore"))
            raise TformerError(f"character U+{ord(text[start]):04X} at position {start} cannot be encoded: this GGUF "
                               f"vocabulary has no token for its byte 0x{int(data[hit[0]]):02x}; remove it from the text")

    def _suspect(self, data: bytes) -> bool:
        # NUL joins the batch: it has a token in any vocabulary worth the name
        return self._lacks and bool(self._no_token[np.frombuffer(data, dtype=np.uint8)].any())

    def describe(self) -> dict:
        return {**super().describe(), "pre": self.pre}

    def __repr__(self) -> str:
        return (f"GGUFTokenizer(vocab_size={self.vocab_size}, pre={self.pre!r}, add_bos={self.add_bos}, "
                f"special_ids={self.special_ids})")


def tokenizer_from_gguf(metadata: dict) -> GGUFTokenizer | GGUFSentencePiece:
    """The tokenizer a GGUF file's metadata (``GGUFFile.metadata``) describes: byte-level BPE ("gpt2") or
    SentencePiece ("llama"); one-line TformerError for a tokenizer it cannot build or metadata that contradicts
    itself."""
    model = metadata.get("tokenizer.ggml.model")
    if model is None:
        raise TformerError(f"the GGUF metadata has no tokenizer.ggml.model, so it describes no tokenizer; {FIX}")
    if model == "llama":
        return sentencepiece_from_gguf(metadata)
    if model != "gpt2":
        raise TformerError(f"GGUF tokenizer.ggml.model {described(model)} is not a tokenizer tformer builds; "
                           'supported: "gpt2" (byte-level BPE), "llama" (SentencePiece)')
    pre_name = metadata.get("tokenizer.ggml.pre", "default")  # llama.cpp: a file without one gets "default"
    pre = PRE_TOKENIZERS.get(pre_name) if isinstance(pre_name, str) else None
    if pre is None:
        raise TformerError(f"GGUF tokenizer.ggml.pre {described(pre_name)} is not a pre-tokenizer tformer knows; "
                           f"supported: {', '.join(PRE_TOKENIZERS)}")
    tokens = read_tokens(metadata)
    types = read_token_types(metadata, len(tokens))
    vocab, added = _vocabulary(tokens, types)
    merges = _merges(metadata, vocab)
    special_ids = read_special_ids(metadata, len(tokens))
    add_bos, add_eos = read_framing(metadata, special_ids, pre.add_bos)
    hf_special = _build(vocab, merges, added, pre)
    hf_plain = _build(vocab, merges, added, pre)
    hf_plain.encode_special_tokens = True  # control tokens' text is cut like any other text
    control = frozenset(i for i, (token, special) in added.items() if special)
    return GGUFTokenizer(hf_special, hf_plain, special_ids, add_bos, add_eos, pre_name, control,
                         chat_template_of(metadata))


def _byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> character table (printable bytes stand for themselves, the rest from U+0100 on)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return table


BYTES = _byte_alphabet()  # GPT-2's byte -> character table (gguf_write spells its vocabularies with it)
_ALPHABET = frozenset(BYTES.values())
# The bytes UTF-8 text can hold (never C0, C1, F5-FF).
_UTF8_BYTES = np.array([b not in (0xC0, 0xC1) and b < 0xF5 for b in range(256)])


def _vocabulary(tokens: list[str], types: list[int]) -> tuple[dict[str, int], dict[int, tuple[str, bool]]]:
    """(the BPE model's token -> id, id -> (text, special) for the tokens matched whole in the text).

    Normal tokens are spelled in the byte alphabet (not every byte need have one: GGUFTokenizer refuses text
    that needs a missing one); one that is not is spelled there from its UTF-8 bytes (as
    transformers does). Control and user-defined tokens keep their raw text, which is what they decode to
    and what is matched in the text."""
    vocab: dict[str, int] = {}
    added: dict[int, tuple[str, bool]] = {}
    for i, (token, kind) in enumerate(zip(tokens, types)):
        if kind in (CONTROL, USER_DEFINED):
            if not token:
                raise TformerError(f"GGUF token {i} is an empty {'control' if kind == CONTROL else 'user-defined'} "
                                   f"token, which cannot be matched in text; {FIX}")
            added[i] = (token, kind == CONTROL)
            key = token
        else:
            key = token if set(token) <= _ALPHABET else "".join(BYTES[b] for b in token.encode("utf-8"))
        first = vocab.setdefault(key, i)
        if first != i:
            raise TformerError(f"GGUF tokenizer.ggml.tokens holds {described(token)} twice (ids {first} and {i}); "
                               f"each token's text must be unique; {FIX}")
    return vocab, added


def _merges(metadata: dict, vocab: dict[str, int]) -> list[tuple[str, str]]:
    merges = metadata.get("tokenizer.ggml.merges")
    if merges is None:
        raise TformerError(f"the GGUF metadata has no tokenizer.ggml.merges, which byte-level BPE needs; {FIX}")
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        raise TformerError(f"GGUF tokenizer.ggml.merges is {kind_of(merges)}, not an array of strings; {FIX}")
    pairs = []
    for number, merge in enumerate(merges):
        cut = merge.find(" ", 1)  # llama.cpp's split: at the first space after the first character
        if cut < 0 or cut == len(merge) - 1:
            raise TformerError(f"GGUF merge {number} ({described(merge)}) is not two tokens separated by a space; "
                               f"{FIX}")
        left, right = merge[:cut], merge[cut + 1:]
        for part in (left, right):
            if part not in vocab:
                raise TformerError(f"GGUF merge {number} ({described(merge)}) names token {described(part)}, "
                                   f"which is not in tokenizer.ggml.tokens; {FIX}")
        if left + right not in vocab:
            raise TformerError(f"GGUF merge {number} ({described(merge)}) makes {described(left + right)}, which is "
                               f"not in tokenizer.ggml.tokens; {FIX}")
        pairs.append((left, right))
    return pairs


def _build(vocab, merges, added, pre: _Pre):
    # deferred: the tokenizer library loads only for the tokenizer that needs it
    from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
    from tokenizers import Tokenizer as HF

    # No unk token: every byte has a token (checked), so byte-level BPE never needs one.
    extra = {"ignore_merges": True} if pre.ignore_merges else {}  # a keyword since tokenizers 0.19
    hf = HF(models.BPE(vocab=dict(vocab), merges=merges, dropout=None, continuing_subword_prefix="",
                       end_of_word_suffix="", fuse_unk=False, byte_fallback=False, **extra))
    hf.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    hf.decoder = decoders.ByteLevel()
    control = [AddedToken(t, normalized=False, special=True) for t, special in added.values() if special]
    user = [AddedToken(t, normalized=False, special=False) for t, special in added.values() if not special]
    if control:
        hf.add_special_tokens(control)
    if user:
        hf.add_tokens(user)
    return hf


__all__ = ["PRE_TOKENIZERS", "GGUFTokenizer", "tokenizer_from_gguf"]
