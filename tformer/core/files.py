"""Bounded readers: a file tformer reads is checked for size, encoding and nesting before it is parsed,
and anything wrong with it is one TformerError naming the file and the problem.

read_json   a JSON document (configs, checkpoint state, tokenizers, profiles, examples)
described   a value as the user wrote it, short enough for a one-line error (what the type checks report)
read_safetensors_header   the table of contents of a .safetensors file, checked against the file's
            size before a byte of tensor data is read (no torch here: the format's header is JSON)
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from itertools import accumulate
from pathlib import Path

from tformer.core.errors import TformerError

MAX_JSON_BYTES = 256 << 20  # the largest tokenizer.json files are tens of MB
MAX_JSON_DEPTH = 64  # configs and tokenizers nest a handful of levels; the C parser recurses per level

# A JSON string literal: its brackets do not nest anything.
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")

# Bytes per element of every dtype the safetensors format defines.
SAFETENSORS_DTYPES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
                      "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
MAX_SAFETENSORS_HEADER = 100 << 20  # the format's own limit


class FileFormatError(TformerError):
    """A file that exists but is not what it should be; ``path`` for callers that word their own fix."""

    def __init__(self, message: str, path: Path):
        super().__init__(message)
        self.path = path


def _escaped(c: str) -> str:
    # Unprintable characters (newlines, U+2028, lone surrogates) escaped: the message stays one line.
    if c.isprintable() and c not in '"\\':
        return c
    return json.dumps(c)[1:-1] if c.isascii() else f"\\u{ord(c):04x}"


def described(value, limit: int = 40) -> str:
    """``value`` (as JSON or a CSV cell held it) spelled the way its file spells it, cut to ``limit``
    characters: an error shows what was found in one line, however long or nested the value is."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        # str() of an int past 4300 digits raises; the bit length gives its size without printing it
        if value.bit_length() <= 128:
            return str(value)
        return f"a whole number of about {math.ceil(value.bit_length() * math.log10(2))} digits"
    if isinstance(value, float):
        return {math.inf: "Infinity", -math.inf: "-Infinity"}.get(value, "NaN" if math.isnan(value) else repr(value))
    if isinstance(value, str):
        if not value:
            return "an empty string"
        shown = "".join(map(_escaped, value[:limit]))
        return f'"{shown}"' if len(value) <= limit else f'"{shown}..." ({len(value)} characters)'
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}" if value else "an empty list"
    if isinstance(value, dict):
        return f"an object of {len(value)} key{'s' if len(value) != 1 else ''}" if value else "an empty object"
    return type(value).__name__


def _fail(path: Path, what: str, problem: str, fix: str) -> FileFormatError:
    return FileFormatError(f"{what} {path} {problem}; {fix}", path)


def _unloadable(path: Path, what: str, problem: str, fix: str) -> FileFormatError:
    return FileFormatError(f"cannot load {what} {path}: it {problem}; {fix}", path)


def _depth(text: str) -> int:
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(1 if c in "[{" else -1 for c in brackets), default=0)


def parse_json(text: str, path: str | Path, what: str = "file", max_depth: int = MAX_JSON_DEPTH,
               fix: str = "fix or replace it", expect: type | None = dict):
    """Parse ``text`` read from ``path`` with the nesting bounded; see read_json."""
    path = Path(path)
    depth = _depth(text)
    if depth > max_depth:
        raise _fail(path, what, f"nests {depth} levels deep (at most {max_depth})", fix)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _fail(path, what, f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})", fix) from None
    except (RecursionError, ValueError) as exc:  # a bracket our count missed; huge numbers
        raise _fail(path, what, f"is not valid JSON ({type(exc).__name__})", fix) from None
    if expect is not None and not isinstance(data, expect):
        kind = {dict: "a JSON object", list: "a JSON list"}.get(expect, expect.__name__)
        raise _fail(path, what, f"must hold {kind}, got {type(data).__name__}", fix)
    return data


def read_text(path: str | Path, what: str = "file", max_bytes: int = MAX_JSON_BYTES,
              fix: str = "fix or replace it") -> str:
    """The UTF-8 text of ``path``, refused (before reading) when larger than ``max_bytes``."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            # A regular file's size is known without reading it: a 10 GB file is refused at once, not
            # after max_bytes are read into memory (pipes and /dev/stdin report 0 and are read).
            if os.fstat(fh.fileno()).st_size > max_bytes:
                raise _fail(path, what, f"is larger than {max_bytes} bytes", fix)
            raw = fh.read(max_bytes + 1)
    except FileNotFoundError:
        raise _fail(path, what, "does not exist", fix) from None
    except IsADirectoryError:
        raise _fail(path, what, "is a folder, not a file", fix) from None
    except OSError as exc:
        raise _fail(path, what, f"cannot be read ({exc.strerror or exc})", fix) from None
    if len(raw) > max_bytes:
        raise _fail(path, what, f"is larger than {max_bytes} bytes", fix)
    if b"\0" in raw:
        raise _fail(path, what, "is binary, not text", fix)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _fail(path, what, f"is not UTF-8 text (byte {exc.start})", fix) from None


def read_json(path: str | Path, what: str = "file", max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH, fix: str = "fix or replace it", expect: type | None = dict):
    """The JSON document in ``path``: at most ``max_bytes``, UTF-8, nested at most ``max_depth``
    levels, of type ``expect`` (None: any). Anything else is one FileFormatError that reads
    "<what> <path> <problem>; <fix>"."""
    return parse_json(read_text(path, what, max_bytes, fix), path, what, max_depth, fix, expect)


def read_safetensors_header(path: str | Path, what: str = "weights file",
                            fix: str = "it is damaged or truncated; save or download it again") -> dict[str, dict]:
    """{tensor name: {"dtype", "shape", "data_offsets"}} of a .safetensors file, every entry checked
    against the file's size and the format's dtypes before any tensor data is read."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            if n is None or n > min(size - 8, MAX_SAFETENSORS_HEADER):
                raise _unloadable(path, what, f"is {size} bytes but its header claims {n if n is not None else '?'} "
                            "header bytes", fix)
            raw = fh.read(n)
    except OSError as exc:
        raise _unloadable(path, what, f"cannot be read ({exc.strerror or exc})", fix) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _unloadable(path, what, "has a header that is not UTF-8 text", fix) from None
    try:
        header = parse_json(text, path, what, 8, fix)
    except FileFormatError as exc:
        raise FileFormatError(f"cannot load {exc}", path) from None
    header.pop("__metadata__", None)
    data_bytes = size - 8 - n
    for name, info in header.items():
        if not isinstance(info, dict):
            raise _unloadable(path, what, f"has a malformed header entry for tensor {name!r}", fix)
        dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
        if dtype not in SAFETENSORS_DTYPES:
            raise _unloadable(path, what, f"stores tensor {name!r} as unknown dtype {dtype!r}", fix)
        if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
            raise _unloadable(path, what, f"has a malformed shape for tensor {name!r}", fix)
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data_bytes):
            raise _unloadable(path, what, f"is truncated: tensor {name!r} lies beyond its {data_bytes} data bytes", fix)
        if offsets[1] - offsets[0] != math.prod(shape) * SAFETENSORS_DTYPES[dtype]:
            raise _unloadable(path, what, f"has tensor {name!r} whose byte range does not match its shape {shape}", fix)
    return header


def check_tensor_shapes(path: str | Path, header: dict[str, dict], expected: dict[str, tuple[int, ...]],
                        what: str = "weights file", fix: str = "does config.json match it?") -> None:
    """Every name in ``expected`` is in ``header`` with that shape (extra names are the caller's
    business); the first mismatch is one FileFormatError naming the tensor."""
    path = Path(path)
    for name, shape in expected.items():
        if name not in header:
            raise _fail(path, what, f"has no tensor {name!r}", fix)
        found = tuple(header[name]["shape"])
        if found != tuple(shape):
            raise _fail(path, what, f"has tensor {name!r} of shape {list(found)}, expected {list(shape)}", fix)
