"""Atomic writes: a writer that fails leaves neither a torn file nor its temporary behind."""

import pytest

from tformer.core.atomic import atomic_file, atomic_path


def test_atomic_path_renames_on_success_and_cleans_up_on_failure(tmp_path):
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("crash mid-write")
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]
    with atomic_path(target) as tmp:
        assert tmp.parent == tmp_path and tmp != target
        tmp.write_bytes(b"new")
    assert target.read_bytes() == b"new" and (target.stat().st_mode & 0o777) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_atomic_file_writes_through_atomic_path(tmp_path):
    target = tmp_path / "sub" / "a.txt"
    with atomic_file(target, "w") as f:
        f.write("hello")
    assert target.read_text() == "hello"
    with pytest.raises(ValueError):
        with atomic_file(target, "w") as f:
            f.write("torn")
            raise ValueError
    assert target.read_text() == "hello" and [p.name for p in target.parent.iterdir()] == ["a.txt"]
