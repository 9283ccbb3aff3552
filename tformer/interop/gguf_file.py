"""Read a GGUF file (llama.cpp's single-file format): its metadata, its tensor table, its tensors' bytes.

``open_gguf(path)`` memory-maps the file and parses the header (no torch; numpy for the views). The
file is untrusted input: every count, length, dimension, offset and the alignment is checked against
the file's size and sane limits before anything is read or allocated, so a hostile or damaged file is
one FileFormatError naming the file, the problem and the fix, never a MemoryError or a struct error.

Layout (GGUF version 3, little-endian): magic ``GGUF``, version u32, tensor count u64, key/value count
u64; each key/value is (key: u64 length + UTF-8, value type u32, value); each tensor info is (name,
n_dims u32, ne[n_dims] u64, ggml type u32, offset u64 from the data start); the data starts at the
next multiple of ``general.alignment`` (default 32). ``ne[0]`` is the contiguous dimension, so the
PyTorch shape is ``ne`` reversed: a Linear weight stored as ne = [in, out] is torch's (out, in).
Decoding the quantized blocks into tensors is gguf_quants' job (torch).
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np

from tformer.core.files import FileFormatError, described
from tformer.core.quant_formats import GGML_BLOCKS

MAGIC = b"GGUF"
VERSION = 3
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20  # ggml uses 32; anything past a megabyte is a damaged header
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_DIM = 1 << 48  # one dimension's length; a real file's largest is a vocabulary of ~10^6
MAX_KEY_BYTES = 1 << 16
MAX_NAME_BYTES = 1 << 12  # llama.cpp itself refuses tensor names of 64 bytes or more
MAX_ENTRIES = 1 << 24  # key/value pairs or tensors; real files hold hundreds to a few thousand

# ggml's type ids (ggml.h, enum ggml_type); the gaps are ids ggml has retired.
GGML_TYPE_NAMES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0", 9: "Q8_1", 10: "Q2_K",
    11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K", 15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS",
    19: "IQ1_S", 20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32",
    27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4", 40: "NVFP4",
}
GGML_TYPE_IDS = {name: number for number, name in GGML_TYPE_NAMES.items()}

# The types tformer decodes: name -> (values per block, bytes per block). Sizes from ggml-common.h.
BLOCK_LAYOUTS = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), **GGML_BLOCKS}

# GGUF metadata value types: id -> (name, struct format or None for string / array).
VALUE_TYPES = {
    0: ("u8", "<B"), 1: ("i8", "<b"), 2: ("u16", "<H"), 3: ("i16", "<h"), 4: ("u32", "<I"), 5: ("i32", "<i"),
    6: ("f32", "<f"), 7: ("bool", "<B"), 8: ("string", None), 9: ("array", None), 10: ("u64", "<Q"),
    11: ("i64", "<q"), 12: ("f64", "<d"),
}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8",
          11: "<i8", 12: "<f8"}
_SCALARS = {number: struct.Struct(fmt) for number, (_, fmt) in VALUE_TYPES.items() if fmt}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_NO_LIMIT = 1 << 64  # an array's length is bounded by the bytes left in the file alone

_FIX = "the file is damaged or not a GGUF model; download or convert it again"
_CONVERT = "convert the model with a current llama.cpp (convert_hf_to_gguf.py)"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: ``shape`` in PyTorch order (GGUF's ne reversed), ``ggml_type`` a name such
    as "Q4_1", ``offset`` from the data section's start (as the file says), ``file_offset`` from the
    file's start, ``nbytes`` its bytes in the file."""

    name: str
    shape: tuple[int, ...]
    ggml_type: str
    offset: int
    nbytes: int
    file_offset: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


class GGUFFile:
    """An open GGUF file: ``version``, ``metadata`` {key: value}, ``metadata_types`` {key: "u32",
    "string", "array[string]", ...}, ``tensors`` {name: TensorInfo} in file order, ``alignment``,
    ``data_offset`` and ``raw(name)``, a read-only uint8 view of a tensor's bytes in the mapped file.
    The mapping stays open while the object or any view of it is alive; ``close()`` drops it early."""

    def __init__(self, path: Path, version: int, metadata: dict, metadata_types: dict[str, str],
                 tensors: dict[str, TensorInfo], alignment: int, data_offset: int, mapped: mmap.mmap):
        self.path = path
        self.version = version
        self.metadata = metadata
        self.metadata_types = metadata_types
        self.tensors = tensors
        self.alignment = alignment
        self.data_offset = data_offset
        self._map = mapped

    def raw(self, name: str) -> np.ndarray:
        info = self.tensors.get(name)
        if info is None:
            raise FileFormatError(f"GGUF file {self.path} has no tensor {described(name)}; it has "
                                  f"{len(self.tensors)} tensors (see .tensors)", self.path)
        if self._map is None:
            raise ValueError(f"GGUF file {self.path} is closed")
        if info.nbytes == 0:
            out = np.empty(0, np.uint8)
            out.flags.writeable = False
            return out
        return np.frombuffer(self._map, np.uint8, info.nbytes, info.file_offset)  # read-only: the map is

    def close(self) -> None:
        """Unmap the file now if no view of it is alive (else the views keep it until they go)."""
        mapped, self._map = self._map, None
        if mapped is not None:
            try:
                mapped.close()
            except BufferError:  # raw() views still use it; it is unmapped when the last one goes
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFFile({str(self.path)!r}, version={self.version}, {len(self.metadata)} keys, "
                f"{len(self.tensors)} tensors)")


class _Header:
    """The cursor over the mapped header: each read checks that the bytes it needs are there first.

    ``what`` names the field being read for the error message; a ``{}`` in it stands for ``subject`` (a key
    or tensor name from the file), which is escaped and shortened only if the message is needed."""

    def __init__(self, path: Path, mapped: mmap.mmap, size: int):
        self.path, self.map, self.size, self.pos = path, mapped, size, 0

    def fail(self, problem: str, fix: str = _FIX) -> FileFormatError:
        return FileFormatError(f"GGUF file {self.path} {problem}; {fix}", self.path)

    @staticmethod
    def named(what: str, subject: str | None) -> str:
        return what.format(described(subject)) if subject is not None else what

    def need(self, n: int, what: str, subject: str | None = None) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"is truncated: {self.named(what, subject)} at byte {self.pos} needs {n} bytes, but "
                            f"the file ends at byte {self.size}")

    def u32(self, what: str, subject: str | None = None) -> int:
        self.need(4, what, subject)
        (value,) = _U32.unpack_from(self.map, self.pos)
        self.pos += 4
        return value

    def u64(self, what: str, subject: str | None = None) -> int:
        self.need(8, what, subject)
        (value,) = _U64.unpack_from(self.map, self.pos)
        self.pos += 8
        return value

    def count(self, what: str, min_bytes_each: int, limit: int, subject: str | None = None) -> int:
        """A u64 count of items that take at least ``min_bytes_each`` bytes each, checked against the
        bytes left in the file (and ``limit``) before a single item is read."""
        n = self.u64(f"the count of {what}", subject)
        left = self.size - self.pos
        if n > limit:
            raise self.fail(f"claims {n} {self.named(what, subject)} at byte {self.pos - 8} (at most {limit})")
        if n * min_bytes_each > left:
            raise self.fail(f"is truncated or damaged: it claims {n} {self.named(what, subject)} at byte "
                            f"{self.pos - 8}, more than its remaining {left} bytes can hold")
        return n

    def string(self, what: str, subject: str | None = None, limit: int | None = None) -> str:
        n = self.u64(f"the length of {what}", subject)
        if limit is not None and n > limit:
            raise self.fail(f"gives {self.named(what, subject)} at byte {self.pos - 8} a length of {n} bytes "
                            f"(at most {limit})")
        self.need(n, what, subject)
        start = self.pos
        self.pos += n
        try:
            return self.map[start:self.pos].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"has {self.named(what, subject)} at byte {start} that is not UTF-8 "
                            f"(byte {start + exc.start})") from None

    def value(self, kind: int, key: str) -> tuple[object, str]:
        """The value of ``key`` and its type's name ("u32", "string", "array[f32]", ...)."""
        scalar = _SCALARS.get(kind)
        if scalar is not None:
            self.need(scalar.size, "the value of key {}", key)
            (value,) = scalar.unpack_from(self.map, self.pos)
            self.pos += scalar.size
            return (bool(value) if kind == 7 else value), VALUE_TYPES[kind][0]
        if kind == 8:
            return self.string("the value of key {}", key), "string"
        if kind == 9:
            return self.array(key)
        raise self.fail(f"gives key {described(key)} value type {kind} at byte {self.pos - 4}, which GGUF does not "
                        "define (0-12)")

    def array(self, key: str) -> tuple[object, str]:
        where = self.pos
        kind = self.u32("the element type of key {}", key)
        if kind not in VALUE_TYPES:
            raise self.fail(f"gives the array of key {described(key)} element type {kind} at byte {where}, which "
                            "GGUF does not define (0-12)")
        if kind == 9:
            raise self.fail(f"holds an array of arrays under key {described(key)}, which GGUF readers (llama.cpp) "
                            "do not accept")
        if kind == 8:
            return self.strings(key, self.count("strings in key {}", 8, _NO_LIMIT, key)), "array[string]"
        dtype = np.dtype(_NUMPY[kind])
        n = self.count("elements in key {}", dtype.itemsize, _NO_LIMIT, key)
        values = np.frombuffer(self.map, dtype, n, self.pos).copy() if n else np.empty(0, dtype)
        self.pos += n * dtype.itemsize
        return (values.astype(bool) if kind == 7 else values), f"array[{VALUE_TYPES[kind][0]}]"

    def strings(self, key: str, n: int) -> list[str]:
        # A tokenizer's vocabulary is ~10^5 strings: one tight loop of unpack + slice, bounds inlined.
        mapped, pos, size, unpack = self.map, self.pos, self.size, _U64.unpack_from
        out: list[str] = []
        append = out.append
        needed = 0
        try:
            for _ in range(n):
                if pos + 8 > size:
                    needed = 8
                    break
                (length,) = unpack(mapped, pos)
                if length > size - pos - 8:
                    needed = 8 + length
                    break
                pos += 8
                append(mapped[pos:pos + length].decode("utf-8"))
                pos += length
        except UnicodeDecodeError as exc:
            raise self.fail(f"has string {len(out)} of key {described(key)} that is not UTF-8 "
                            f"(byte {pos + exc.start})") from None
        self.pos = pos
        if needed:
            self.need(needed, f"string {len(out)} of key {{}}", key)
        return out


def _read_metadata(head: _Header, n_kv: int) -> tuple[dict, dict[str, str]]:
    metadata: dict = {}
    types: dict[str, str] = {}
    for _ in range(n_kv):
        where = head.pos
        key = head.string("a metadata key", limit=MAX_KEY_BYTES)
        if key in metadata:
            raise head.fail(f"repeats metadata key {described(key)} (at byte {where})")
        kind = head.u32("the value type of key {}", key)
        metadata[key], types[key] = head.value(kind, key)
    return metadata, types


def _alignment(head: _Header, metadata: dict, types: dict[str, str]) -> int:
    if "general.alignment" not in metadata:
        return DEFAULT_ALIGNMENT
    value, kind = metadata["general.alignment"], types["general.alignment"]
    if kind not in ("u8", "u16", "u32", "u64", "i8", "i16", "i32", "i64"):
        raise head.fail(f"gives general.alignment as a {kind}, not a whole number")
    if not 0 < value <= MAX_ALIGNMENT or value & (value - 1):
        raise head.fail(f"gives general.alignment {value}, not a power of two from 1 to {MAX_ALIGNMENT}")
    return value


def _read_tensor_infos(head: _Header, n_tensors: int) -> list[tuple[str, tuple[int, ...], str, int, int]]:
    infos = []
    seen: set[str] = set()
    for _ in range(n_tensors):
        where = head.pos
        name = head.string("a tensor name", limit=MAX_NAME_BYTES)
        if name in seen:
            raise head.fail(f"has two tensors named {described(name)} (the second at byte {where})")
        seen.add(name)
        n_dims = head.u32("the dimension count of tensor {}", name)
        if n_dims > MAX_DIMS:
            raise head.fail(f"gives tensor {described(name)} {n_dims} dimensions (GGUF allows at most {MAX_DIMS})")
        ne = [head.u64("the shape of tensor {}", name) for _ in range(n_dims)]
        if any(d > MAX_DIM for d in ne):
            raise head.fail(f"gives tensor {described(name)} the impossible shape {ne} (ne order)")
        type_id = head.u32("the ggml type of tensor {}", name)
        type_name = GGML_TYPE_NAMES.get(type_id)
        if type_name not in BLOCK_LAYOUTS:
            known = f" ({type_name})" if type_name else ""
            fix = f"tformer reads {', '.join(BLOCK_LAYOUTS)}; {_CONVERT} to one of them" if type_name else _FIX
            raise head.fail(f"stores tensor {described(name)} as ggml type {type_id}{known}, which "
                            + ("tformer does not support" if type_name else "is not a ggml type"), fix)
        per_block, block_bytes = BLOCK_LAYOUTS[type_name]
        row = ne[0] if ne else 1
        if row % per_block:
            raise head.fail(f"gives {type_name} tensor {described(name)} rows of {row} values, not a multiple of "
                            f"its block of {per_block}")
        n_values = 1
        for d in ne:
            n_values *= d
        offset = head.u64("the data offset of tensor {}", name)
        infos.append((name, tuple(reversed(ne)), type_name, offset, n_values // per_block * block_bytes))
    return infos


def _place_tensors(head: _Header, infos, alignment: int, data_offset: int) -> dict[str, TensorInfo]:
    tensors: dict[str, TensorInfo] = {}
    for name, shape, type_name, offset, nbytes in infos:
        if offset % alignment:
            raise head.fail(f"places tensor {described(name)} at data offset {offset}, not a multiple of the "
                            f"file's alignment {alignment}")
        start = data_offset + offset
        if nbytes > head.size:
            raise head.fail(f"gives tensor {described(name)} the shape {list(shape)} of {nbytes} bytes, more than "
                            f"the whole file's {head.size}")
        if start + nbytes > head.size:
            raise head.fail(f"is truncated: tensor {described(name)} ({nbytes} bytes at byte {start}) lies past "
                            f"the end of the file (byte {head.size})")
        tensors[name] = TensorInfo(name, shape, type_name, offset, nbytes, start)
    placed = sorted((t for t in tensors.values() if t.nbytes), key=lambda t: t.file_offset)
    for before, after in pairwise(placed):
        if after.file_offset < before.file_offset + before.nbytes:
            raise head.fail(f"has tensors {described(before.name)} and {described(after.name)} whose bytes overlap "
                            f"(at byte {after.file_offset})")
    return tensors


def _check_start(head: _Header) -> int:
    head.need(4, "the magic number")
    magic = head.map[0:4]
    if magic != MAGIC:
        raise head.fail(f"is not a GGUF file: it starts with {magic!r}, not {MAGIC!r}",
                        "give a .gguf model file (llama.cpp's format)")
    head.pos = 4
    version = head.u32("the version")
    if version in (1, 2):
        raise head.fail(f"is GGUF version {version}: GGUF version {version} files predate version 3, the one tformer "
                        "reads", _CONVERT)
    if version != VERSION:
        if _U32.unpack(struct.pack(">I", version))[0] == VERSION:
            raise head.fail("is a big-endian GGUF file; tformer reads little-endian ones", _CONVERT)
        raise head.fail(f"has GGUF version {version}; tformer reads version {VERSION}", _CONVERT)
    return version


def open_gguf(path: str | Path) -> GGUFFile:
    """Open and check the GGUF file at ``path``; its tensors' bytes stay in the file until read."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                raise FileFormatError(f"GGUF file {path} is empty; {_FIX}", path)
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except FileFormatError:
        raise
    except FileNotFoundError:
        raise FileFormatError(f"GGUF file {path} does not exist; give the path of a .gguf file", path) from None
    except IsADirectoryError:
        raise FileFormatError(f"GGUF file {path} is a folder, not a file; give the path of a .gguf file", path) from None
    except (OSError, ValueError) as exc:  # ValueError: mmap of something that is not a regular file
        raise FileFormatError(f"GGUF file {path} cannot be read ({getattr(exc, 'strerror', None) or exc}); "
                              "give the path of a readable .gguf file", path) from None
    head = _Header(path, mapped, size)
    try:
        version = _check_start(head)
        n_tensors = head.count("tensors", 8 + 4 + 4 + 8, MAX_ENTRIES)  # name length, n_dims, type, offset
        n_kv = head.count("metadata keys", 8 + 4 + 1, MAX_ENTRIES)  # key length, type, the smallest value
        metadata, types = _read_metadata(head, n_kv)
        alignment = _alignment(head, metadata, types)
        infos = _read_tensor_infos(head, n_tensors)
        data_offset = -(-head.pos // alignment) * alignment
        tensors = _place_tensors(head, infos, alignment, data_offset)
    except BaseException:
        mapped.close()
        raise
    return GGUFFile(path, version, metadata, types, tensors, alignment, data_offset, mapped)
