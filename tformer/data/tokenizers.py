"""Tokenizers behind one interface: characters, trained byte-level BPE, GPT-2 BPE, BERT WordPiece.

Every tokenizer has ``encode(text) -> list[int]``, ``decode(ids) -> str``, ``vocab_size``, the
special-token ids it has (``pad_id``, ``bos_id``, ``eos_id``, ``mask_id``; None where absent) and
``save(dir)``. ``load(dir)`` reads the small JSON descriptor ``save`` wrote and rebuilds it, so a
model directory carries the exact tokenizer it was trained with.

``encode`` never adds special tokens: token streams are plain concatenations of text, and the
caller decides where BOS/EOS/[CLS]/[SEP] go (``add_special_tokens=True`` on WordPiece gives BERT's
[CLS] ... [SEP] framing).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

from tformer.core.atomic import atomic_write_bytes, atomic_write_text, make_dir
from tformer.core.errors import TformerError
from tformer.core.files import FileFormatError, described, parse_json, read_json, read_text
from tformer.data.packages import cache_dir, extract_members, fetch_package

DESCRIPTOR = "tformer-tokenizer.json"  # not tokenizer.json: that name belongs to HF's file
FORMAT_VERSION = 1

# GPT-2's pre-tokenizer regex (from its encoder.py, as tiktoken's gpt2 definition spells it).
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
GPT2_EOT = "<|endoftext|>"
GPT2_EOT_ID = 50256
GPT2_RANKS_FILE = "gpt2.tiktoken"
# The ranks come inside the whisper sdist (DATA.md); both hashes pinned.
WHISPER_SPEC = "openai-whisper==20250625"
WHISPER_SHA256 = "37a91a3921809d9f44748ffc73c0a55c9f366c85a3ef5c2ae0cc09540432eb96"
WHISPER_RANKS_MEMBER = "openai_whisper-20250625/whisper/assets/gpt2.tiktoken"
GPT2_RANKS_SHA256_PREFIX = "306cd27f"


class Tokenizer:
    """The common interface. Subclasses set ``kind`` and implement the encode/decode pair."""

    kind = "abstract"
    special_ids: dict[str, int]  # role ("pad", "bos", "eos", "mask", ...) -> id

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids, skip_special: bool = False) -> str:
        raise NotImplementedError

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def encode_array(self, text: str) -> np.ndarray:
        """Encode to a numpy array; subclasses override where a vectorised path exists."""
        return np.asarray(self.encode(text), dtype=np.int64)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(t) for t in texts]

    # The roles models and batchers ask for; None where this tokenizer has no such token.
    @property
    def pad_id(self) -> int | None:
        return self.special_ids.get("pad")

    @property
    def bos_id(self) -> int | None:
        return self.special_ids.get("bos")

    @property
    def eos_id(self) -> int | None:
        return self.special_ids.get("eos")

    @property
    def mask_id(self) -> int | None:
        return self.special_ids.get("mask")

    def describe(self) -> dict:
        """What `save` writes, less the files it writes beside it."""
        return {"kind": self.kind, "vocab_size": self.vocab_size, "special_ids": dict(self.special_ids)}

    def save(self, directory) -> Path:
        """Write the descriptor (and any data file) into ``directory``; returns the descriptor path."""
        directory = Path(directory)
        make_dir(directory, "tokenizer folder")
        desc = {"format": "tformer-tokenizer", "version": FORMAT_VERSION, **self.describe()}
        self._save_files(directory, desc)
        path = directory / DESCRIPTOR
        atomic_write_text(path, json.dumps(desc, indent=1, ensure_ascii=False) + "\n")
        return path

    def _save_files(self, directory: Path, desc: dict) -> None:
        """Write data files beside the descriptor and record their names in ``desc``."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(vocab_size={self.vocab_size}, special_ids={self.special_ids})"


# ---------------------------------------------------------------------------------------------
# Characters


class CharTokenizer(Tokenizer):
    """One id per character. Special tokens, if any, take the first ids, then the characters."""

    kind = "char"

    def __init__(self, chars, specials: dict[str, str] | None = None):
        chars = sorted(set(chars))
        if not chars:
            raise TformerError("a character tokenizer needs at least one character; the text was empty")
        specials = dict(specials or {})  # role -> token text, e.g. {"pad": "<pad>"}
        self.specials = specials
        self.tokens = list(specials.values()) + chars
        self.special_ids = {role: i for i, role in enumerate(specials)}
        self.chars = chars
        self._offset = len(specials)
        self._codepoints = np.array([ord(c) for c in chars], dtype=np.uint32)  # sorted: searchsorted
        self._to_id = {c: i + self._offset for i, c in enumerate(chars)}

    @classmethod
    def from_text(cls, text: str, specials: dict[str, str] | None = None) -> CharTokenizer:
        return cls(set(text), specials)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def encode_array(self, text: str) -> np.ndarray:
        # Vectorised: a 5 MB corpus encodes in milliseconds instead of a second of dict lookups.
        codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        if codes.size == 0:
            return np.zeros(0, dtype=np.int64)
        pos = np.searchsorted(self._codepoints, codes)
        pos_clipped = np.minimum(pos, len(self._codepoints) - 1)
        unknown = self._codepoints[pos_clipped] != codes
        if unknown.any():
            bad = chr(int(codes[np.argmax(unknown)]))
            raise TformerError(f"character {bad!r} is not in this tokenizer's vocabulary of "
                               f"{len(self.chars)} characters; rebuild the tokenizer from text that contains it")
        return pos.astype(np.int64) + self._offset

    def encode(self, text: str) -> list[int]:
        return self.encode_array(text).tolist()

    def decode(self, ids, skip_special: bool = False) -> str:
        ids = [int(i) for i in ids]
        if skip_special:
            ids = [i for i in ids if i >= self._offset]
        try:
            return "".join(self.tokens[i] for i in ids)
        except IndexError:
            raise TformerError(f"token id out of range for a vocabulary of {self.vocab_size}; "
                               "decode with the tokenizer the ids came from") from None

    def describe(self) -> dict:
        return {**super().describe(), "chars": "".join(self.chars), "specials": self.specials}

    @classmethod
    def _load(cls, directory: Path, desc: dict) -> CharTokenizer:
        path = directory / DESCRIPTOR
        chars = _field(path, desc, "chars", "a string of the vocabulary's characters", _is_chars)
        specials = desc.get("specials") or {}
        if not isinstance(specials, dict) or not all(_is_chars(v) for v in specials.values()):
            raise _bad(path, "specials", specials, "an object of role: token text")
        return cls(chars, specials)


# ---------------------------------------------------------------------------------------------
# Byte-level BPE (trained here) and WordPiece (from a BERT checkpoint): both HF `tokenizers`


class HFTokenizer(Tokenizer):
    """Wraps a `tokenizers.Tokenizer`; saved as HF's own tokenizer.json beside the descriptor."""

    kind = "hf"
    hf_file = "tokenizer.json"
    ROLES: dict[str, str] = {}  # role -> the token text it must name, where a subclass fixes it

    def __init__(self, hf, special_ids: dict[str, int] | None = None):
        # Checkpoints ship tokenizer.json with padding/truncation to a model length (MiniLM: 128);
        # left on, encoding a corpus would silently keep 128 tokens of each chunk.
        hf.no_padding()
        hf.no_truncation()
        self.hf = hf
        self.special_ids = dict(special_ids or {})

    @property
    def vocab_size(self) -> int:
        return self.hf.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        # The Rust side encodes a batch on all cores.
        return [e.ids for e in self.hf.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids, skip_special: bool = False) -> str:
        return self.hf.decode([int(i) for i in ids], skip_special_tokens=skip_special)

    def _save_files(self, directory: Path, desc: dict) -> None:
        atomic_write_text(directory / self.hf_file, self.hf.to_str())
        desc["file"] = self.hf_file

    @classmethod
    def _load(cls, directory: Path, desc: dict):
        path = directory / DESCRIPTOR
        name = _field(path, desc, "file", "the name of a file in the same folder", _is_file_name)
        ids = _field(path, desc, "special_ids", "an object of role: token id", _is_id_table)
        hf = read_hf_tokenizer(directory / name)
        for role, i in ids.items():
            # The roles a trained or BERT tokenizer names have fixed token texts: a pad id that points at a word
            # would make a model ignore that word as padding.
            want = cls.ROLES.get(role)
            if want is not None and 0 <= i < hf.get_vocab_size(with_added_tokens=True) and hf.id_to_token(i) != want:
                raise _bad(path, f"special_ids.{role}", i, f"the id of {want} ({hf.token_to_id(want)}) in {name}")
        return cls(hf, ids)


_RESAVE = "save the tokenizer again (or download it again)"
# Encoded and decoded once when a tokenizer.json is read: a file the library parses can still hold settings its
# Rust code panics on at the first encode (a subword prefix longer than a token), which must not wait for a run.
_PROBE_TEXT = "Hello, world! 0123 \u00fcn\u00efc\u00f6d\u00e9 \u6f22\u5b57\t\n  end."


def read_hf_tokenizer(path: Path):
    """A Hugging Face tokenizer from its tokenizer.json, checked for size, text and nesting first, then made to
    encode and decode a line; the library's complaint about a damaged file (an exception, or a Rust panic) becomes
    one line naming the file."""
    # deferred: the tokenizer library loads only for the tokenizer that needs it
    from tokenizers import Tokenizer as HF

    path = Path(path)
    text = read_text(path, "tokenizer file", fix=_RESAVE)
    parse_json(text, path, "tokenizer file", fix=_RESAVE)
    return _probed(lambda: HF.from_str(text), path)


def _probed(build, path: Path):
    """The library's tokenizer that ``build`` makes from ``path``, made to encode and decode a line once."""
    try:
        with _HeldStderr() as held:
            hf = build()
            ids = hf.encode(_PROBE_TEXT, add_special_tokens=False).ids
            hf.decode(ids + [0, max(hf.get_vocab_size(with_added_tokens=True) - 1, 0)], skip_special_tokens=False)
            held.release()
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # a bare Exception, or pyo3's PanicException, which derives from BaseException
        raise FileFormatError(f"tokenizer file {path} is not a tokenizer the library can load ({_reason(exc)}); "
                              f"{_RESAVE}", path) from None
    return hf


class _HeldStderr:
    """Holds what is written to file descriptor 2 while a tokenizer is built and probed: Rust's panic hook writes
    its message and backtrace there before pyo3 raises, which would put lines above tformer's one-line error.
    ``release()`` (nothing panicked) writes the held output out after all; otherwise it is dropped."""

    def __enter__(self):
        sys.stderr.flush()
        self._keep = False
        self._held = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._held.fileno(), 2)
        return self

    def release(self) -> None:
        self._keep = True

    def __exit__(self, *exc) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)
        if self._keep:
            self._held.seek(0)
            os.write(2, self._held.read())
        self._held.close()


MAX_VOCAB_LINE = 1024  # one WordPiece token per line; BERT's longest is under 30 characters


def _check_vocab(path: Path) -> None:
    """A BERT vocab.txt: UTF-8, no line over MAX_VOCAB_LINE, and the [UNK] token every unknown word becomes."""
    text = read_text(path, "vocabulary file", max_bytes=64 << 20, fix=_RESAVE)
    lines = text.split("\n")
    for number, line in enumerate(lines, 1):
        if len(line) > MAX_VOCAB_LINE:
            raise FileFormatError(f"vocabulary file {path} line {number} is {len(line)} characters long, over the "
                                  f"limit of {MAX_VOCAB_LINE} for one token; {_RESAVE}", path)
    if "[UNK]" not in (line.rstrip() for line in lines):
        raise FileFormatError(f"vocabulary file {path} has no [UNK] token (a line reading [UNK]), which every "
                              f"word outside the vocabulary becomes; {_RESAVE}", path)


def _reason(exc: BaseException) -> str:
    text = str(exc).strip()
    line = text.splitlines()[0] if text else type(exc).__name__
    return line if len(line) <= 200 else line[:200] + "..."


class ByteBPETokenizer(HFTokenizer):
    """Byte-level BPE (GPT-2's scheme) trained on a corpus: no unknown tokens, any text round-trips."""

    kind = "bpe"
    SPECIALS = {"pad": "<pad>", "bos": "<s>", "eos": "</s>", "mask": "<mask>"}
    ROLES = SPECIALS

    @classmethod
    def train(cls, texts, vocab_size: int = 4096, min_frequency: int = 2) -> ByteBPETokenizer:
        """Train on an iterable of strings (e.g. the lines of the training split)."""
        # deferred: the tokenizer library loads only for the tokenizer that needs it
        from tokenizers import Tokenizer as HF
        from tokenizers import decoders, models, pre_tokenizers, trainers

        alphabet = pre_tokenizers.ByteLevel.alphabet()
        floor = len(alphabet) + len(cls.SPECIALS)
        if vocab_size <= floor:
            raise TformerError(f"BPE vocab_size {vocab_size} is too small; byte-level BPE needs more than "
                               f"{floor} (256 bytes + {len(cls.SPECIALS)} special tokens)")
        hf = HF(models.BPE())
        # add_prefix_space=False and GPT-2's regex: encode(a + b) == encode(a) + encode(b) when b
        # starts a new pre-token, which lets streams be encoded chunk by chunk.
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        hf.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency,
                                      special_tokens=list(cls.SPECIALS.values()),
                                      initial_alphabet=alphabet, show_progress=False)
        hf.train_from_iterator(texts, trainer=trainer)
        special_ids = {role: hf.token_to_id(tok) for role, tok in cls.SPECIALS.items()}
        return cls(hf, special_ids)


class WordPieceTokenizer(HFTokenizer):
    """BERT's WordPiece, read from a checkpoint folder (tokenizer.json, else vocab.txt)."""

    kind = "wordpiece"
    ROLES = {"pad": "[PAD]", "bos": "[CLS]", "eos": "[SEP]", "mask": "[MASK]", "unk": "[UNK]",
             "cls": "[CLS]", "sep": "[SEP]"}

    @classmethod
    def from_checkpoint(cls, directory) -> WordPieceTokenizer:
        directory = Path(directory)
        if (directory / "tokenizer.json").is_file():
            hf = read_hf_tokenizer(directory / "tokenizer.json")
        elif (directory / "vocab.txt").is_file():
            # deferred: the tokenizer library loads only for the tokenizer that needs it
            from tokenizers.implementations import BertWordPieceTokenizer

            lowercase = True
            config = directory / "tokenizer_config.json"
            if config.is_file():
                lowercase = read_json(config, "tokenizer config", fix=_RESAVE).get("do_lower_case", True)
                if not isinstance(lowercase, bool):  # "false" would read as true
                    raise _bad(config, "do_lower_case", lowercase, "true or false")
            vocab = directory / "vocab.txt"
            _check_vocab(vocab)
            hf = _probed(lambda: BertWordPieceTokenizer(str(vocab), lowercase=lowercase)._tokenizer, vocab)
        else:
            raise TformerError(f"{directory} holds no tokenizer (neither tokenizer.json nor vocab.txt); "
                               "give --tokenizer char, bpe or gpt2, or a folder that has one")
        special_ids = {role: hf.token_to_id(tok) for role, tok in cls.ROLES.items()
                       if hf.token_to_id(tok) is not None}
        return cls(hf, special_ids)


# ---------------------------------------------------------------------------------------------
# GPT-2 BPE through tiktoken, from ranks we load ourselves (no network at run time)


class GPT2Tokenizer(Tokenizer):
    """GPT-2's 50,257-token BPE: 50,000 merges' ranks + 256 bytes + <|endoftext|> = 50256."""

    kind = "gpt2"

    def __init__(self, ranks_path):
        # deferred: the tokenizer library loads only for the tokenizer that needs it
        import tiktoken

        self.ranks_path = Path(ranks_path)
        ranks = load_tiktoken_ranks(self.ranks_path, GPT2_RANKS_SHA256_PREFIX)
        # Built directly rather than via tiktoken.get_encoding("gpt2"), which would download.
        self.enc = tiktoken.Encoding(name="gpt2", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                     special_tokens={GPT2_EOT: GPT2_EOT_ID})
        self.special_ids = {"bos": GPT2_EOT_ID, "eos": GPT2_EOT_ID}

    @classmethod
    def fetch(cls) -> GPT2Tokenizer:
        """Build from the ranks inside the pinned whisper sdist (downloaded once, then cached)."""
        return cls(gpt2_ranks_path())

    @property
    def vocab_size(self) -> int:
        return self.enc.n_vocab

    def encode(self, text: str) -> list[int]:
        # Ordinary text: "<|endoftext|>" typed in a corpus is text, not the special token.
        return self.enc.encode_ordinary(text)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return self.enc.encode_ordinary_batch(texts)

    def decode(self, ids, skip_special: bool = False) -> str:
        ids = [int(i) for i in ids]
        if skip_special:
            ids = [i for i in ids if i != GPT2_EOT_ID]
        return self.enc.decode(ids)

    def _save_files(self, directory: Path, desc: dict) -> None:
        # Copy the ranks so the model folder loads with no cache and no network.
        target = directory / GPT2_RANKS_FILE
        if target.resolve() != self.ranks_path.resolve():
            atomic_write_bytes(target, self.ranks_path.read_bytes())
        desc["file"] = GPT2_RANKS_FILE
        desc["source"] = f"{WHISPER_SPEC} ({WHISPER_RANKS_MEMBER})"

    @classmethod
    def _load(cls, directory: Path, desc: dict) -> GPT2Tokenizer:
        name = desc.get("file", GPT2_RANKS_FILE)
        if not _is_file_name(name):
            raise _bad(directory / DESCRIPTOR, "file", name, "the name of a file in the same folder")
        path = directory / name
        return cls(path if path.is_file() else gpt2_ranks_path())


MAX_RANKS_BYTES = 16 << 20  # GPT-2's ranks are 1.6 MB, the largest tiktoken files under 4 MB
MAX_RANKS_LINE = 1024  # one base64 token and its rank; GPT-2's longest line is under 100 bytes
_FETCH_AGAIN = "delete it and fetch again"


def load_tiktoken_ranks(path: Path, sha256_prefix: str | None = None) -> dict[bytes, int]:
    """Parse a .tiktoken file: one 'base64(token) rank' per line, every token and rank once, every single byte
    ranked (tiktoken's Rust code panics at the first encode otherwise). With ``sha256_prefix``, the file's digest
    must start with it (the ranks belong to one named encoding)."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size > MAX_RANKS_BYTES:
            raise FileFormatError(f"ranks file {path} is larger than {MAX_RANKS_BYTES} bytes; {_FETCH_AGAIN}", path)
        data = path.read_bytes()
    except OSError as exc:
        raise FileFormatError(f"ranks file {path} cannot be read ({exc.strerror or exc}); {_FETCH_AGAIN}",
                              path) from None
    if sha256_prefix is not None:
        digest = hashlib.sha256(data).hexdigest()
        if not digest.startswith(sha256_prefix):
            raise FileFormatError(f"ranks file {path} has sha256 {digest[:12]}..., not the expected "
                                  f"{sha256_prefix}...; {_FETCH_AGAIN}", path)
    ranks: dict[bytes, int] = {}
    seen: set[int] = set()
    for number, line in enumerate(data.split(b"\n"), 1):
        line = line.removesuffix(b"\r")
        if not line:
            continue
        problem = _rank_line_problem(line, ranks, seen)
        if problem:
            raise FileFormatError(f"ranks file {path} line {number} {problem}; {_FETCH_AGAIN}", path)
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise FileFormatError(f"ranks file {path} ranks no token for byte 0x{missing[0]:02x} ({len(missing)} bytes "
                              f"have none; tiktoken needs every byte); {_FETCH_AGAIN}", path)
    return ranks


def _rank_line_problem(line: bytes, ranks: dict[bytes, int], seen: set[int]) -> str | None:
    """What is wrong with one line of a .tiktoken file (None: nothing; it is added to ``ranks``)."""
    if len(line) > MAX_RANKS_LINE:
        return f"is {len(line)} bytes long, over the limit of {MAX_RANKS_LINE}"
    parts = line.split(b" ")
    if len(parts) != 2 or not parts[1].isdigit() or len(parts[1]) > 10:
        return "is not 'base64-token rank'"
    try:
        token = base64.b64decode(parts[0], validate=True)
    except ValueError:  # binascii.Error
        return "holds a token that is not base64"
    rank = int(parts[1])
    if rank >= 1 << 32 or not token:
        return f"holds {'rank ' + str(rank) if token else 'an empty token'}, which tiktoken cannot hold"
    if token in ranks or rank in seen:
        return f"repeats {'token ' + repr(token) if token in ranks else 'rank ' + str(rank)}"
    ranks[token] = rank
    seen.add(rank)
    return None


def gpt2_ranks_path() -> Path:
    """The GPT-2 ranks file, extracted once from the whisper sdist into the cache."""
    target_dir = cache_dir() / "tokenizers" / "gpt2"
    target = target_dir / GPT2_RANKS_FILE
    if not target.is_file():
        archive = fetch_package(WHISPER_SPEC, WHISPER_SHA256, "sdist")
        make_dir(target_dir, "cache folder (TFORMER_CACHE)")
        with tempfile.TemporaryDirectory(dir=target_dir) as tmp:
            found = extract_members(archive, WHISPER_RANKS_MEMBER, Path(tmp))
            if not found:
                raise TformerError(f"{WHISPER_SPEC} has no {WHISPER_RANKS_MEMBER}; the pinned archive changed?")
            src = Path(found[0])
            digest = hashlib.sha256(src.read_bytes()).hexdigest()
            if not digest.startswith(GPT2_RANKS_SHA256_PREFIX):
                raise TformerError(f"gpt2.tiktoken has sha256 {digest[:12]}..., expected "
                                   f"{GPT2_RANKS_SHA256_PREFIX}...; delete {target_dir} and fetch again")
            os.replace(src, target)
    return target


# ---------------------------------------------------------------------------------------------
# Building and loading by name

KINDS = {"char": CharTokenizer, "bpe": ByteBPETokenizer, "wordpiece": WordPieceTokenizer, "gpt2": GPT2Tokenizer}


def load(directory) -> Tokenizer:
    """Rebuild the tokenizer that `save` wrote into ``directory``."""
    directory = Path(directory)
    path = directory / DESCRIPTOR
    if not path.is_file():
        raise TformerError(f"no {DESCRIPTOR} in {directory}; save a tokenizer there first (Tokenizer.save)")
    desc = read_json(path, "tokenizer descriptor", max_bytes=1 << 20, fix="save the tokenizer again")
    if desc.get("format", "tformer-tokenizer") != "tformer-tokenizer":
        raise _bad(path, "format", desc["format"], '"tformer-tokenizer"')
    version = desc.get("version", FORMAT_VERSION)
    if isinstance(version, bool) or not isinstance(version, int) or not 1 <= version <= FORMAT_VERSION:
        raise _bad(path, "version", version, f"a format version from 1 to {FORMAT_VERSION} (a newer tformer "
                   "wrote it?)")
    kind = _field(path, desc, "kind", f"one of {', '.join(KINDS)}", lambda v: isinstance(v, str) and v in KINDS)
    tok = KINDS[kind]._load(directory, desc)
    _check_matches(path, desc, tok)
    return tok


def _bad(path: Path, key: str, value, expected: str) -> FileFormatError:
    return FileFormatError(f"tokenizer file {path}: key '{key}' is {described(value)}, expected {expected}; "
                           "save the tokenizer again", path)


def _field(path: Path, desc: dict, key: str, expected: str, valid):
    if key not in desc:
        raise FileFormatError(f"tokenizer file {path} has no key '{key}' ({expected}); save the tokenizer again",
                              path)
    if not valid(desc[key]):
        raise _bad(path, key, desc[key], expected)
    return desc[key]


def _is_id_table(value) -> bool:
    return isinstance(value, dict) and all(isinstance(i, int) and not isinstance(i, bool) for i in value.values())


def _is_chars(value) -> bool:
    # A JSON string may spell a lone surrogate (\\ud800): not a character, and unprintable once decoded.
    return isinstance(value, str) and bool(value) and not any("\ud800" <= c <= "\udfff" for c in value)


def _is_file_name(value) -> bool:
    """A plain name of a file beside the descriptor: a path elsewhere would read a file the folder does not hold."""
    return (isinstance(value, str) and value not in ("", ".", "..") and not any(c in value for c in "/\\\0")
            and len(value) <= 255)


def _check_matches(path: Path, desc: dict, tok: Tokenizer) -> None:
    """The descriptor's sizes and special ids against the tokenizer its files build: a descriptor that disagrees
    with its data files would give a model a vocabulary of another size, or a pad id that is a word."""
    size = desc.get("vocab_size", tok.vocab_size)
    if isinstance(size, bool) or not isinstance(size, int) or size != tok.vocab_size:
        raise _bad(path, "vocab_size", size, f"{tok.vocab_size}, the size of the vocabulary its files hold")
    ids = desc.get("special_ids", tok.special_ids)
    if not isinstance(ids, dict):
        raise _bad(path, "special_ids", ids, "an object of role: token id")
    for role, i in ids.items():
        key = f"special_ids.{role}" if len(role) <= 40 and role.isprintable() else "special_ids"
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < tok.vocab_size:
            raise _bad(path, key, i, f"a token id from 0 to {tok.vocab_size - 1}")
        if tok.special_ids.get(role) != i:
            raise _bad(path, key, i, f"{tok.special_ids[role]}, the id its files give that role"
                       if role in tok.special_ids else "no such role: its files give it no token")

