"""What both kinds of GGUF tokenizer share: the checked readers of the ``tokenizer.ggml.*`` keys every vocabulary
has (tokens, token types, special ids, flags) and `GGUFTokenizerBase`, the calls `tformer generate` and `serve`
make, over a Hugging Face ``tokenizers`` engine.

The byte-level BPE vocabularies (``tokenizer.ggml.model == "gpt2"``) are built in gguf_tokenizer, the
SentencePiece ones ("llama") in gguf_spm; ``gguf_tokenizer.tokenizer_from_gguf`` picks between them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tformer.core.atomic import atomic_write_text
from tformer.core.errors import TformerError
from tformer.core.files import described
from tformer.data.tokenizers import Tokenizer

# tokenizer.ggml.token_type (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
# Which role each id key fills; llama.cpp spells the separator "seperator".
ROLE_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "pad": "padding_token_id", "unk": "unknown_token_id",
             "sep": "seperator_token_id", "cls": "cls_token_id", "mask": "mask_token_id"}
FIX = "convert the model again with a current llama.cpp (convert_hf_to_gguf.py)"


class GGUFTokenizerBase(Tokenizer):
    """A GGUF file's tokenizer on two HF engines that differ only in whether control tokens are matched in the text.

    ``encode(text, add_special_tokens=False, special=False)``: ``add_special_tokens`` adds BOS / EOS where the
    file says (``add_bos`` / ``add_eos``); ``special`` matches control tokens such as ``<|im_start|>`` whole
    in the text (the chat path's prompts), otherwise their text is plain text. ``decode(ids,
    skip_special=False)``. ``save(directory)`` writes tokenizer.json (control tokens special, BOS/EOS in its
    post-processor), which `hf_tokenizer` and transformers read back. Subclasses refuse, in ``_check``, text
    their vocabulary cannot encode."""

    kind = "gguf"
    model = ""  # tokenizer.ggml.model

    def __init__(self, hf_special, hf_plain, special_ids: dict[str, int], add_bos: bool, add_eos: bool,
                 control_ids: frozenset[int], chat_template: str | None = None):
        self.hf = hf_special  # control tokens matched in the text
        self._plain = hf_plain  # the same tokenizer with control tokens read as text (encode_special_tokens)
        self.special_ids = dict(special_ids)
        self.add_bos, self.add_eos = add_bos, add_eos
        self.control_ids = control_ids
        self.chat_template = chat_template
        self._size = hf_special.get_vocab_size(with_added_tokens=True)

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
        """Refuse what is not Unicode text: not a str, or a lone surrogate (no UTF-8 bytes)."""
        utf8(text)

    def _suspect(self, data: bytes) -> bool:
        """Whether a batch's UTF-8 bytes (texts joined by NUL) may hold text ``_check`` refuses."""
        return False

    def encode(self, text: str, add_special_tokens: bool = False, special: bool = False) -> list[int]:
        self._check(text)
        return self._framed(self._engine(special).encode(text, add_special_tokens=False).ids, add_special_tokens)

    def encode_batch(self, texts: list[str], add_special_tokens: bool = False, special: bool = False
                     ) -> list[list[int]]:
        texts = list(texts)
        try:  # one pass over the batch; the text at fault is found after, to name it
            data = utf8("\x00".join(texts))
        except (TformerError, TypeError):  # a lone surrogate, or not all str
            data = None
        if data is None or self._suspect(data):
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
        return {**super().describe(), "add_bos": self.add_bos, "add_eos": self.add_eos}


def utf8(text: str) -> bytes:
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise TformerError(f"the text holds a lone surrogate U+{ord(text[exc.start]):04X} at position {exc.start}, "
                           "which is not Unicode text and has no UTF-8 bytes to encode") from None
    except AttributeError:
        raise TformerError(f"a tokenizer encodes text (a str), not {type(text).__name__}") from None


# ---------------------------------------------------------------------------------------------
# The keys both kinds read; each refusal is one line naming the key


def read_tokens(metadata: dict) -> list[str]:
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens is None:
        raise TformerError(f"the GGUF metadata has no tokenizer.ggml.tokens (the vocabulary); {FIX}")
    if not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens):
        raise TformerError(f"GGUF tokenizer.ggml.tokens is {kind_of(tokens)}, not an array of strings; {FIX}")
    if not tokens:
        raise TformerError(f"GGUF tokenizer.ggml.tokens is empty; {FIX}")
    return tokens


def read_token_types(metadata: dict, n: int) -> list[int]:
    types = metadata.get("tokenizer.ggml.token_type")
    if types is None:  # llama.cpp: every token normal
        return [NORMAL] * n
    if not (isinstance(types, np.ndarray) and types.ndim == 1 and types.dtype.kind in "iu"):
        if isinstance(types, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in types):
            types = np.asarray(types, dtype=np.int64)
        else:
            raise TformerError(f"GGUF tokenizer.ggml.token_type is {kind_of(types)}, not an array of integers; {FIX}")
    if len(types) != n:
        raise TformerError(f"GGUF tokenizer.ggml.token_type has {len(types)} entries but tokenizer.ggml.tokens has "
                           f"{n}; one type per token is needed; {FIX}")
    bad = np.flatnonzero((types < NORMAL) | (types > BYTE))
    if bad.size:
        raise TformerError(f"GGUF tokenizer.ggml.token_type of token {int(bad[0])} is {int(types[bad[0]])}, not a "
                           f"type from 1 to 6 (normal, unknown, control, user-defined, unused, byte); {FIX}")
    return types.tolist()


def read_special_ids(metadata: dict, n: int) -> dict[str, int]:
    ids = {}
    for role, key in ROLE_KEYS.items():
        value = metadata.get(f"tokenizer.ggml.{key}")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TformerError(f"GGUF tokenizer.ggml.{key} is {kind_of(value)}, not a token id; {FIX}")
        if not 0 <= int(value) < n:
            if int(value) in (-1, 0xFFFFFFFF):  # llama.cpp writes LLAMA_TOKEN_NULL as "no such token"
                continue
            raise TformerError(f"GGUF tokenizer.ggml.{key} is {int(value)}, outside the vocabulary of {n} tokens; "
                               f"{FIX}")
        ids[role] = int(value)
    return ids


def read_flag(metadata: dict, name: str, default: bool) -> bool:
    value = metadata.get(f"tokenizer.ggml.{name}", default)
    if not isinstance(value, (bool, np.bool_)):
        raise TformerError(f"GGUF tokenizer.ggml.{name} is {kind_of(value)}, not a boolean; {FIX}")
    return bool(value)


def read_framing(metadata: dict, special_ids: dict[str, int], add_bos_default: bool) -> tuple[bool, bool]:
    """(add_bos, add_eos): the file's flags, llama.cpp's defaults where it has none, and the ids they need."""
    add_bos = read_flag(metadata, "add_bos_token", add_bos_default)
    add_eos = read_flag(metadata, "add_eos_token", False)
    for role, wanted in (("bos", add_bos), ("eos", add_eos)):
        if wanted and role not in special_ids:
            key = f"tokenizer.ggml.add_{role}_token"
            said = key if key in metadata else f"{key}, llama.cpp's default"
            raise TformerError(f"the GGUF tokenizer adds {role.upper()} ({said}) but has no "
                               f"tokenizer.ggml.{ROLE_KEYS[role]}; {FIX}")
    return add_bos, add_eos


def chat_template_of(metadata: dict) -> str | None:
    template = metadata.get("tokenizer.chat_template")
    return template if isinstance(template, str) else None


def kind_of(value) -> str:
    if isinstance(value, np.ndarray):
        return f"an array of {value.dtype} numbers"
    if isinstance(value, list):
        return f"a list of {len(value)} items" if all(isinstance(v, str) for v in value) else "a list of non-strings"
    return described(value)


__all__ = ["BYTE", "CONTROL", "FIX", "NORMAL", "ROLE_KEYS", "UNKNOWN", "UNUSED", "USER_DEFINED", "GGUFTokenizerBase",
           "chat_template_of", "kind_of", "read_flag", "read_framing", "read_special_ids", "read_token_types",
           "read_tokens", "utf8"]
