"""Bounded readers: every way a JSON or safetensors file can be wrong is one line naming the file."""

import json
import struct

import pytest

from tformer.core.config import read_config_json
from tformer.core.errors import TformerError
from tformer.core.files import check_tensor_shapes, read_json, read_safetensors_header

BAD_JSON = {
    "deeply nested": "[" * 100_000 + "]" * 100_000,
    "deeply nested, unclosed": "[" * 100_000,
    "binary": b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR",
    "not UTF-8": b'{"a": "\xff\xfe"}',
    "truncated": '{"d_model": 64, "n_layers": ',
    "empty": "",
    "a list": "[1, 2]",
}
EXPECT = {"deeply nested": "nests", "deeply nested, unclosed": "nests", "binary": "binary",
          "not UTF-8": "not UTF-8", "truncated": "not valid JSON", "empty": "not valid JSON",
          "a list": "must hold a JSON object, got list"}


def _write(path, content):
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


@pytest.mark.parametrize("kind", list(BAD_JSON))
def test_bad_json_is_one_line_naming_the_file(tmp_path, kind):
    path = _write(tmp_path / "x.json", BAD_JSON[kind])
    with pytest.raises(TformerError) as err:
        read_json(path, "config file")
    message = str(err.value)
    assert message.startswith(f"config file {path} ") and EXPECT[kind] in message and "\n" not in message


def test_huge_json_is_refused_before_it_is_read(tmp_path):
    path = _write(tmp_path / "big.json", "[" + "1," * 1000 + "1]")
    with pytest.raises(TformerError, match="larger than 100 bytes"):
        read_json(path, "file", max_bytes=100, expect=list)
    assert read_json(path, "file", expect=list)[:2] == [1, 1]


def test_nesting_inside_strings_does_not_count(tmp_path):
    path = _write(tmp_path / "ok.json", json.dumps({"s": "[" * 1000, "t": "]]]{{"}))
    assert read_json(path)["s"] == "[" * 1000


def test_missing_and_folder(tmp_path):
    with pytest.raises(TformerError, match="does not exist"):
        read_json(tmp_path / "none.json")
    with pytest.raises(TformerError, match="is a folder"):
        read_json(tmp_path)


@pytest.mark.parametrize("kind", ["deeply nested", "binary"])
def test_config_reader_is_bounded(tmp_path, kind):
    with pytest.raises(TformerError, match="config file"):
        read_config_json(_write(tmp_path / "c.json", BAD_JSON[kind]))


# safetensors headers ---------------------------------------------------------------------------
def _safetensors(path, header: dict, data: bytes):
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_a_good_header_reads(tmp_path):
    path = _safetensors(tmp_path / "w.safetensors",
                        {"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}, b"\0" * 24)
    assert read_safetensors_header(path)["a"]["shape"] == [2, 3]
    check_tensor_shapes(path, read_safetensors_header(path), {"a": (2, 3)})
    with pytest.raises(TformerError, match=r"tensor 'a' of shape \[2, 3\], expected \[3, 2\]"):
        check_tensor_shapes(path, read_safetensors_header(path), {"a": (3, 2)})
    with pytest.raises(TformerError, match="has no tensor 'b'"):
        check_tensor_shapes(path, read_safetensors_header(path), {"b": (1,)})


@pytest.mark.parametrize("header,data,expect", [
    ({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}, b"\0" * 10, "is truncated: tensor 'a'"),
    ({"a": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}}, b"\0\0", "unknown dtype 'Q4'"),
    ({"a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 20]}}, b"\0" * 20, "does not match its shape"),
    ({"a": [1]}, b"", "malformed header entry"),
])
def test_bad_headers(tmp_path, header, data, expect):
    path = _safetensors(tmp_path / "w.safetensors", header, data)
    with pytest.raises(TformerError, match=expect) as err:
        read_safetensors_header(path)
    assert str(err.value).startswith(f"cannot load weights file {path}")


@pytest.mark.parametrize("content", [b"", b"\x01\x02", struct.pack("<Q", 10**9) + b"{}",
                                     struct.pack("<Q", 4) + b"[[[["])
def test_truncated_or_overclaiming_files(tmp_path, content):
    path = _write(tmp_path / "w.safetensors", content)
    with pytest.raises(TformerError, match=f"cannot load weights file {path}"):
        read_safetensors_header(path)
