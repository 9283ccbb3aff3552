"""Atomic writes: a writer that fails leaves neither a torn file nor its temporary behind."""

import errno
import os
from pathlib import Path

import pytest

from tformer.core import atomic
from tformer.core.atomic import atomic_file, atomic_files, atomic_new_dir, atomic_path


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


# atomic_files: some files of a folder replaced, the others kept ---------------------------------
def test_atomic_files_new_folder_appears_whole(tmp_path):
    target = tmp_path / "model"
    with atomic_files(target, ("w.bin", "config.json")) as stage:
        assert not target.exists()
        (stage / "w.bin").write_bytes(b"w")
        (stage / "config.json").write_text("{}")
    assert sorted(p.name for p in target.iterdir()) == ["config.json", "w.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_atomic_files_keeps_other_files_and_moves_in_order(tmp_path, monkeypatch):
    target = tmp_path / "model"
    target.mkdir()
    for name, text in (("w.bin", "old"), ("config.json", "old"), ("tokenizer.json", "tok")):
        (target / name).write_text(text)
    moved = []
    real = atomic.os.replace
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (moved.append(Path(b).name), real(a, b)))
    with atomic_files(target, ("w.bin", "config.json")) as stage:
        (stage / "config.json").write_text("new")  # written first, still moved last
        (stage / "w.bin").write_text("new")
    assert moved == ["w.bin", "config.json"]
    assert {p.name: p.read_text() for p in target.iterdir()} == {"w.bin": "new", "config.json": "new",
                                                                 "tokenizer.json": "tok"}


@pytest.mark.parametrize("failure", ["crash", "file left out"])
def test_atomic_files_failure_leaves_the_previous_files(tmp_path, failure):
    target = tmp_path / "model"
    target.mkdir()
    (target / "w.bin").write_text("old")
    (target / "config.json").write_text("old")
    with pytest.raises((RuntimeError, FileNotFoundError)):
        with atomic_files(target, ("w.bin", "config.json")) as stage:
            (stage / "w.bin").write_text("half")
            if failure == "crash":
                raise RuntimeError("crash mid-write")
    assert {p.name: p.read_text() for p in target.iterdir()} == {"w.bin": "old", "config.json": "old"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


# atomic_new_dir: caches built once -------------------------------------------------------------
def test_atomic_new_dir_appears_complete_or_not_at_all(tmp_path):
    final = tmp_path / "cache" / "corpus"
    with pytest.raises(RuntimeError):
        with atomic_new_dir(final, "done") as tmp:
            (tmp / "train.txt").write_text("half")
            raise RuntimeError("crash")
    assert not final.exists() and list((tmp_path / "cache").iterdir()) == []
    with atomic_new_dir(final, "done") as tmp:
        (tmp / "train.txt").write_text("all")
        (tmp / "done").write_text("")
    assert (final / "train.txt").read_text() == "all" and list((tmp_path / "cache").iterdir()) == [final]


def test_atomic_new_dir_keeps_a_copy_another_process_finished(tmp_path):
    final = tmp_path / "corpus"
    with atomic_new_dir(final, "done") as tmp:
        (tmp / "train.txt").write_text("ours")
        final.mkdir()  # the other process renames its complete copy in while we build
        (final / "train.txt").write_text("theirs")
        (final / "done").write_text("")
    assert (final / "train.txt").read_text() == "theirs" and sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]
    (final / "done").unlink()  # a folder without the marker is not a finished build: say so
    with pytest.raises(OSError):
        with atomic_new_dir(final, "done") as tmp:
            (tmp / "done").write_text("")


# The writers that use these helpers ------------------------------------------------------------
def _fail_rename(monkeypatch):
    def crash(*args):
        raise OSError("disk full")

    monkeypatch.setattr(atomic.os, "replace", crash)
    monkeypatch.setattr(atomic.os, "rename", crash)


def test_failed_profile_save_keeps_the_previous_profile(tmp_path, monkeypatch):
    from tformer.machine import profile_store

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    path = profile_store.save_profile({"peak": 1}, key="box")
    before = open(path).read()
    _fail_rename(monkeypatch)
    with pytest.raises(OSError, match="disk full"):
        profile_store.save_profile({"peak": 2}, key="box")
    assert open(path).read() == before and os.listdir(os.path.dirname(path)) == ["box.json"]


def test_failed_hf_save_keeps_the_previous_folder(tmp_path, monkeypatch):
    import tformer

    model = tformer.build_model(tformer.preset("gpt2", n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=20,
                                               max_positions=8))
    out = tmp_path / "hf"
    tformer.save_hf(model, out)
    (out / "tokenizer.json").write_text("{}")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    _fail_rename(monkeypatch)
    with pytest.raises(OSError, match="disk full"):
        tformer.save_hf(tformer.build_model(model.config.replace(n_layers=2)), out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_failed_token_cache_build_leaves_nothing_behind(tmp_path, monkeypatch):
    from tformer.data import prepare

    monkeypatch.setenv("TFORMER_CACHE", str(tmp_path / "cache"))
    text = tmp_path / "corpus.txt"
    text.write_text("to be or not to be\n" * 50)

    def crash(*args, **kwargs):
        raise RuntimeError("killed mid-build")

    real = prepare.write_stream  # the name prepare() calls
    monkeypatch.setattr(prepare, "write_stream", crash)
    with pytest.raises(RuntimeError):
        prepare.prepare(str(text), "char")
    tokens = tmp_path / "cache" / "tokens"
    assert [p for p in tokens.rglob("*") if p.is_file()] == []
    monkeypatch.setattr(prepare, "write_stream", real)
    data = prepare.prepare(str(text), "char")
    assert (data.directory / "complete").is_file()


def test_failed_extraction_keeps_the_previous_file(tmp_path):
    import io

    from tformer.data import packages

    target = tmp_path / "vocab.txt"
    target.write_text("old")

    def broken_member():
        class Broken(io.BytesIO):
            def read(self, *args):
                raise OSError("truncated archive")
        return Broken()

    with pytest.raises(OSError, match="truncated"):
        packages._write(target, 99, broken_member)
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["vocab.txt"]


def test_make_dir_with_a_file_in_the_way_is_one_write_error(tmp_path):
    (tmp_path / "blocker").write_text("x")
    assert atomic.make_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b" and (tmp_path / "a" / "b").is_dir()
    for target in (tmp_path / "blocker", tmp_path / "blocker" / "sub"):
        with pytest.raises(atomic.WriteError) as exc:
            atomic.make_dir(target, "--out")
        assert str(exc.value).count("\n") == 0 and str(target) in str(exc.value) and "--out" in str(exc.value)


def test_append_line_adds_whole_lines_and_a_failed_append_leaves_the_previous_length(tmp_path, monkeypatch):
    log = tmp_path / "metrics.jsonl"
    atomic.append_line(log, '{"step": 1}')
    atomic.append_line(log, '{"step": 2}\n')  # a trailing newline is not doubled
    assert log.read_text() == '{"step": 1}\n{"step": 2}\n'
    real_write = os.write

    def half_then_full(fd, data):  # the disk fills up after a few bytes of the line
        if len(data) > 4:
            return real_write(fd, bytes(data[:4]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", half_then_full)
    with pytest.raises(atomic.WriteError, match="no space left on the device") as exc:
        atomic.append_line(log, '{"step": 3, "train_loss": 1.5}')
    assert exc.value.path == log
    monkeypatch.undo()
    assert log.read_text() == '{"step": 1}\n{"step": 2}\n'  # the four bytes that went out were cut back


def test_complete_lines_drop_a_torn_last_line():
    assert atomic.complete_lines('a\n\nb\n{"step": 3, "lo') == ["a", "b"]
    assert atomic.complete_lines("a\nb\n") == ["a", "b"]
    assert atomic.complete_lines("") == []


def test_sweep_staging_removes_what_a_killed_writer_left_and_nothing_else(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    (run / "tokenizer").mkdir()
    leftovers = [run / ".checkpoint.tmp-abc", run / "tokenizer" / ".tokenizer.json.tmp-1", run / ".checkpoint.old",
                 run / ".tformer-probe-x"]
    leftovers[0].mkdir()
    (leftovers[0] / "model.safetensors").write_bytes(b"half")
    leftovers[1].write_text("half")
    leftovers[2].mkdir()
    leftovers[3].mkdir()
    kept = [run / ".lock", run / ".final.old", run / "checkpoint", run / "metrics.jsonl", run / "notes.tmp-mine"]
    kept[0].write_text("pid=1")
    kept[1].mkdir()  # final/ is missing: this previous version is the only copy, so it stays
    kept[3].write_text("{}\n")
    kept[4].write_text("a user's file")
    assert sorted(atomic.sweep_staging(run)) == sorted(leftovers)
    assert not any(p.exists() for p in leftovers) and all(p.exists() for p in kept)
    assert atomic.sweep_staging(tmp_path / "absent") == []
