"""The tokenizer a GGUF file describes, built from its metadata on the HF ``tokenizers`` BPE engine.

``tokenizer_from_gguf(metadata)`` reads llama.cpp's keys (``tokenizer.ggml.model``, ``.pre``, ``.tokens``,
``.token_type``, ``.merges``, the bos/eos/pad/unk ids, ``.add_bos_token`` / ``.add_eos_token``) and returns a
`GGUFTokenizer` with the calls `tformer generate` and `serve` make (``encode``, ``decode``, ``save``, the
special-token ids). Only ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE) is built; "llama"
(SentencePiece) is refused for now.

Pre-tokenizer. ``tokenizer.ggml.pre`` names a list of regular expressions in llama.cpp
(``src/llama-vocab.cpp``, ``llm_tokenizer_bpe``); each splits the pieces the previous one left, keeping
matches and the text between them, then the pieces go to byte-level BPE. Here that list is a
``pre_tokenizers.Sequence`` of ``Split(..., "isolated")`` and a regex-free ``ByteLevel``:

- ``smollm`` (SmolLM/SmolLM2): ``\\p{N}`` (every digit its own piece), then GPT-2's pattern. The same split as
  the SmolLM tokenizer.json's ``Digits(individual_digits=True)`` + ``ByteLevel``.
- ``gpt-2`` (and ``gpt2``): GPT-2's pattern.
- ``llama-bpe`` (``llama3``, ``llama-v3``): LLaMA 3's pattern; merges ignored for a piece that is itself a
  token (llama.cpp's ``ignore_merges``), BOS added unless the file says otherwise.
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

from pathlib import Path

import numpy as np

from tformer.core.atomic import atomic_write_text
from tformer.core.errors import TformerError
from tformer.core.files import described
from tformer.data.tokenizers import GPT2_PATTERN, Tokenizer

# LLaMA 3's pattern as its tokenizer.json spells it (llama.cpp keeps it, spelling (?i:...) out by hand).
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
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
    "default": _Pre((r"[\p{P}\$\+<=>\^~\|]+", GPT2_PATTERN, r"\p{N}+", r"[0-9][0-9][0-9]")),
}

# tokenizer.ggml.token_type (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# Which role each id key fills; llama.cpp spells the separator "seperator".
_ROLE_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "pad": "padding_token_id", "unk": "unknown_token_id",
              "sep": "seperator_token_id", "cls": "cls_token_id", "mask": "mask_token_id"}
_FIX = "convert the model again with a current llama.cpp (convert_hf_to_gguf.py)"


class GGUFTokenizer(Tokenizer):
    """Byte-level BPE from a GGUF file's metadata, behind tformer's tokenizer calls.

    ``encode(text, add_special_tokens=False, special=False)``: ``add_special_tokens`` adds BOS / EOS where the
    file says (``add_bos`` / ``add_eos``); ``special`` matches control tokens such as ``<|im_start|>`` whole
    in the text (the chat path's prompts), otherwise their text is plain text. ``decode(ids,
    skip_special=False)``. ``save(directory)`` writes tokenizer.json (control tokens special, BOS/EOS in its
    post-processor), which `hf_tokenizer` and transformers read back."""

    kind = "gguf"

    def __init__(self, hf_special, hf_plain, special_ids: dict[str, int], add_bos: bool, add_eos: bool,
                 pre: str, control_ids: frozenset[int], chat_template: str | None = None):
        self.hf = hf_special  # control tokens matched in the text
        self._plain = hf_plain  # the same tokenizer with control tokens read as text (encode_special_tokens)
        self.special_ids = dict(special_ids)
        self.add_bos, self.add_eos = add_bos, add_eos
        self.pre = pre
        self.control_ids = control_ids
        self.chat_template = chat_template
        self._size = hf_special.get_vocab_size(with_added_tokens=True)
        # The bytes with no token: BPE would drop them silently (as transformers does), llama.cpp throws.
        vocab = hf_special.get_vocab(with_added_tokens=False)
        self._no_token = np.array([BYTES[b] not in vocab for b in range(256)])
        self._lacks = bool(self._no_token[_UTF8_BYTES].any())

    @property
    def vocab_size(self) -> int:
        return self._size

    @property
    def unk_id(self) -> int | None:
        return self.special_ids.get("unk")

    def _engine(self, special: bool):
        return self.hf if special else self._plain

    def _framed(self, ids: list[int], add_special_tokens: bool) -> list[int]:
        if add_special_tokens:
            if self.add_bos:
                ids.insert(0, self.special_ids["bos"])
            if self.add_eos:
                ids.append(self.special_ids["eos"])
        return ids

    def _check(self, text: str) -> None:
        """Refuse text that is not Unicode (a lone surrogate) or holds a character whose UTF-8 bytes include one
        with no token."""
        data = np.frombuffer(_utf8(text), dtype=np.uint8)
        hit = np.flatnonzero(self._no_token[data]) if self._lacks else ()
        if len(hit):
            start = len(data[:hit[0]].tobytes().decode("utf-8", errors="ignore"))
            raise TformerError(f"character U+{ord(text[start]):04X} at position {start} cannot be encoded: this GGUF "
                               f"vocabulary has no token for its byte 0x{int(data[hit[0]]):02x}; remove it from the text")

    def encode(self, text: str, add_special_tokens: bool = False, special: bool = False) -> list[int]:
        self._check(text)
        return self._framed(self._engine(special).encode(text, add_special_tokens=False).ids, add_special_tokens)

    def encode_batch(self, texts: list[str], add_special_tokens: bool = False, special: bool = False
                     ) -> list[list[int]]:
        texts = list(texts)
        try:  # one pass over the batch (NUL has a token in any vocabulary worth the name); the text at fault after
            data = _utf8("\x00".join(texts))
        except (TformerError, TypeError):  # a lone surrogate, or not all str: named below
            data = None
        if data is None or self._lacks and self._no_token[np.frombuffer(data, dtype=np.uint8)].any():
            for text in texts:
                self._check(text)
        # On every core in the library's Rust code; no offsets computed where the library can skip them (0.21+).
        engine = self._engine(special)
        found = getattr(engine, "encode_batch_fast", engine.encode_batch)(texts, add_special_tokens=False)
        return [self._framed(e.ids, add_special_tokens) for e in found]

    def decode(self, ids, skip_special: bool = False) -> str:
        ids = [int(i) for i in ids]
        if ids and not 0 <= min(ids) <= max(ids) < self._size:
            bad = next(i for i in ids if not 0 <= i < self._size)
            raise TformerError(f"token id {bad} is out of range for this GGUF vocabulary of {self._size}; "
                               "decode with the tokenizer the ids came from")
        return self.hf.decode(ids, skip_special_tokens=skip_special)

    def save(self, directory) -> Path:
        """tokenizer.json in ``directory`` (what ``hf_tokenizer`` and transformers read back)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "tokenizer.json"
        atomic_write_text(path, self._with_framing().to_str())
        return path

    def _with_framing(self):
        """A copy of the engine whose post-processor adds BOS / EOS as ``add_bos`` / ``add_eos`` say, so that
        readers of tokenizer.json frame a text as this tokenizer does."""
        # deferred: the tokenizer library loads only for the tokenizer that needs it
        from tokenizers import Tokenizer as HF
        from tokenizers import processors

        hf = HF.from_str(self.hf.to_str())
        roles = [r for r, on in (("bos", self.add_bos), ("eos", self.add_eos)) if on]
        if not roles:
            return hf
        names = {r: self.hf.id_to_token(self.special_ids[r]) for r in roles}
        bad = [n for n in names.values() if ":" in n]
        if bad:  # the library's template spells a piece "token:type_id"
            raise TformerError(f"token {described(bad[0])} has a colon, which a tokenizer.json template cannot "
                               "name; the tokenizer can encode but not be saved as tokenizer.json")
        head = [names["bos"]] if self.add_bos else []
        tail = [names["eos"]] if self.add_eos else []
        hf.post_processor = processors.TemplateProcessing(
            single=[*head, "$A", *tail], pair=[*head, "$A", *tail, *head, "$B:1", *tail],
            special_tokens=[(names[r], self.special_ids[r]) for r in roles])
        return hf

    def describe(self) -> dict:
        return {**super().describe(), "pre": self.pre, "add_bos": self.add_bos, "add_eos": self.add_eos}

    def __repr__(self) -> str:
        return (f"GGUFTokenizer(vocab_size={self.vocab_size}, pre={self.pre!r}, add_bos={self.add_bos}, "
                f"special_ids={self.special_ids})")


def _utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TformerError(f"the text holds a lone surrogate U+{ord(text[exc.start]):04X} at position {exc.start}, "
                           "which is not Unicode text and has no UTF-8 bytes to encode") from None
    except AttributeError:
        raise TformerError(f"a tokenizer encodes text (a str), not {type(text).__name__}") from None


def tokenizer_from_gguf(metadata: dict) -> GGUFTokenizer:
    """The tokenizer a GGUF file's metadata (``GGUFFile.metadata``) describes; one-line TformerError for a
    tokenizer it cannot build or metadata that contradicts itself."""
    model = metadata.get("tokenizer.ggml.model")
    if model is None:
        raise TformerError(f"the GGUF metadata has no tokenizer.ggml.model, so it describes no tokenizer; {_FIX}")
    if model == "llama":
        raise TformerError('GGUF tokenizer.ggml.model "llama" (SentencePiece) is not yet supported; '
                           'supported: "gpt2" (byte-level BPE)')
    if model != "gpt2":
        raise TformerError(f"GGUF tokenizer.ggml.model {described(model)} is not a tokenizer tformer builds; "
                           'supported: "gpt2" (byte-level BPE)')
    pre_name = metadata.get("tokenizer.ggml.pre", "default")  # llama.cpp: a file without one gets "default"
    pre = PRE_TOKENIZERS.get(pre_name) if isinstance(pre_name, str) else None
    if pre is None:
        raise TformerError(f"GGUF tokenizer.ggml.pre {described(pre_name)} is not a pre-tokenizer tformer knows; "
                           f"supported: {', '.join(PRE_TOKENIZERS)}")
    tokens = _tokens(metadata)
    types = _token_types(metadata, len(tokens))
    vocab, added = _vocabulary(tokens, types)
    merges = _merges(metadata, vocab)
    special_ids = _special_ids(metadata, len(tokens))
    add_bos = _flag(metadata, "add_bos_token", pre.add_bos)
    add_eos = _flag(metadata, "add_eos_token", False)
    for role, wanted in (("bos", add_bos), ("eos", add_eos)):
        if wanted and role not in special_ids:
            raise TformerError(f"the GGUF metadata sets tokenizer.ggml.add_{role}_token but has no "
                               f"tokenizer.ggml.{_ROLE_KEYS[role]}; {_FIX}")
    hf_special = _build(vocab, merges, added, pre)
    hf_plain = _build(vocab, merges, added, pre)
    hf_plain.encode_special_tokens = True  # control tokens' text is cut like any other text
    control = frozenset(i for i, (token, special) in added.items() if special)
    template = metadata.get("tokenizer.chat_template")
    return GGUFTokenizer(hf_special, hf_plain, special_ids, add_bos, add_eos, pre_name, control,
                         template if isinstance(template, str) else None)


def _tokens(metadata: dict) -> list[str]:
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise TformerError(f"the GGUF metadata has no tokenizer.ggml.tokens (the vocabulary); {_FIX}")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise TformerError(f"GGUF tokenizer.ggml.tokens is {_kind(tokens)}, not an array of strings; {_FIX}")
    if not tokens:
        raise TformerError(f"GGUF tokenizer.ggml.tokens is empty; {_FIX}")
    return tokens


def _token_types(metadata: dict, n: int) -> list[int]:
    types = metadata.get("tokenizer.ggml.token_type")
    if types is None:  # llama.cpp: every token normal
        return [NORMAL] * n
    if not (isinstance(types, np.ndarray) and types.ndim == 1 and types.dtype.kind in "iu"):
        if isinstance(types, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in types):
            types = np.asarray(types, dtype=np.int64)
        else:
            raise TformerError(f"GGUF tokenizer.ggml.token_type is {_kind(types)}, not an array of integers; {_FIX}")
    if len(types) != n:
        raise TformerError(f"GGUF tokenizer.ggml.token_type has {len(types)} entries but tokenizer.ggml.tokens has "
                           f"{n}; one type per token is needed; {_FIX}")
    bad = np.flatnonzero((types < NORMAL) | (types > BYTE))
    if bad.size:
        raise TformerError(f"GGUF tokenizer.ggml.token_type of token {int(bad[0])} is {int(types[bad[0]])}, not a "
                           f"type from 1 to 6 (normal, unknown, control, user-defined, unused, byte); {_FIX}")
    return types.tolist()


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
                                   f"token, which cannot be matched in text; {_FIX}")
            added[i] = (token, kind == CONTROL)
            key = token
        else:
            key = token if set(token) <= _ALPHABET else "".join(BYTES[b] for b in token.encode("utf-8"))
        first = vocab.setdefault(key, i)
        if first != i:
            raise TformerError(f"GGUF tokenizer.ggml.tokens holds {described(token)} twice (ids {first} and {i}); "
                               f"each token's text must be unique; {_FIX}")
    return vocab, added


def _merges(metadata: dict, vocab: dict[str, int]) -> list[tuple[str, str]]:
    merges = metadata.get("tokenizer.ggml.merges")
    if merges is None:
        raise TformerError(f"the GGUF metadata has no tokenizer.ggml.merges, which byte-level BPE needs; {_FIX}")
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        raise TformerError(f"GGUF tokenizer.ggml.merges is {_kind(merges)}, not an array of strings; {_FIX}")
    pairs = []
    for number, merge in enumerate(merges):
        cut = merge.find(" ", 1)  # llama.cpp's split: at the first space after the first character
        if cut < 0 or cut == len(merge) - 1:
            raise TformerError(f"GGUF merge {number} ({described(merge)}) is not two tokens separated by a space; "
                               f"{_FIX}")
        left, right = merge[:cut], merge[cut + 1:]
        for part in (left, right):
            if part not in vocab:
                raise TformerError(f"GGUF merge {number} ({described(merge)}) names token {described(part)}, "
                                   f"which is not in tokenizer.ggml.tokens; {_FIX}")
        if left + right not in vocab:
            raise TformerError(f"GGUF merge {number} ({described(merge)}) makes {described(left + right)}, which is "
                               f"not in tokenizer.ggml.tokens; {_FIX}")
        pairs.append((left, right))
    return pairs


def _special_ids(metadata: dict, n: int) -> dict[str, int]:
    ids = {}
    for role, key in _ROLE_KEYS.items():
        value = metadata.get(f"tokenizer.ggml.{key}")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TformerError(f"GGUF tokenizer.ggml.{key} is {_kind(value)}, not a token id; {_FIX}")
        if not 0 <= int(value) < n:
            if int(value) in (-1, 0xFFFFFFFF):  # llama.cpp writes LLAMA_TOKEN_NULL as "no such token"
                continue
            raise TformerError(f"GGUF tokenizer.ggml.{key} is {int(value)}, outside the vocabulary of {n} tokens; "
                               f"{_FIX}")
        ids[role] = int(value)
    return ids


def _flag(metadata: dict, name: str, default: bool) -> bool:
    value = metadata.get(f"tokenizer.ggml.{name}", default)
    if not isinstance(value, (bool, np.bool_)):
        raise TformerError(f"GGUF tokenizer.ggml.{name} is {_kind(value)}, not a boolean; {_FIX}")
    return bool(value)


def _kind(value) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of {value.dtype} numbers"
    if isinstance(value, list):
        return f"a list of {len(value)} items" if all(isinstance(v, str) for v in value) else "a list of non-strings"
    return described(value)


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
