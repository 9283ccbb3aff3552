"""check_output_dir and the atomic helpers' one way to fail: a WriteError naming path, cause and fix."""

import errno
import os

import pytest
from forked_cli import run_tformer

from tformer.core import atomic
from tformer.core.atomic import WriteError, atomic_write_text, check_output_dir
from tformer.core.errors import TformerError


def _raise(code):
    def fail(*args, **kwargs):
        raise OSError(code, os.strerror(code))
    return fail


@pytest.mark.parametrize("code,cause", [(errno.ENOSPC, "no space left on the device"),
                                        (errno.EACCES, "permission denied"),
                                        (errno.EROFS, "the filesystem is read-only"),
                                        (errno.ENAMETOOLONG, "the name is too long")])
def test_a_failed_rename_is_one_write_error_and_leaves_the_old_file(tmp_path, monkeypatch, code, cause):
    target = tmp_path / "metrics.json"
    target.write_text("old")
    monkeypatch.setattr(atomic.os, "replace", _raise(code))
    with pytest.raises(WriteError) as err:
        atomic_write_text(target, "new")
    assert str(err.value).startswith(f"cannot write {target}: {cause}") and "\n" not in str(err.value)
    assert isinstance(err.value, TformerError) and isinstance(err.value, OSError) and err.value.errno == code
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_a_full_disk_mid_write_names_the_file_inside_the_staging_folder(tmp_path):
    target = tmp_path / "ckpt"
    with pytest.raises(WriteError, match=f"cannot write {target / 'state.json'}: no space left"):
        with atomic.atomic_dir(target) as tmp:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "state.json"))
    assert list(tmp_path.iterdir()) == []


def test_a_wrapped_safetensors_io_error_is_a_write_error(tmp_path):
    from safetensors import SafetensorError

    with pytest.raises(WriteError, match="no space left on the device; free space"):
        with atomic.atomic_path(tmp_path / "w.safetensors"):
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
    assert list(tmp_path.iterdir()) == []


def test_a_parent_that_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(WriteError, match="a file is in the way"):
        atomic_write_text(tmp_path / "f" / "a.json", "{}")
    assert (tmp_path / "f").read_text() == "x"


# check_output_dir ------------------------------------------------------------------------------
def test_a_writable_folder_passes_and_is_not_created(tmp_path):
    assert check_output_dir(tmp_path / "new" / "run") == tmp_path / "new" / "run"
    assert list(tmp_path.iterdir()) == []  # the probe is gone, nothing was created
    assert check_output_dir(tmp_path) == tmp_path


def test_an_existing_file_and_a_file_above(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(TformerError, match=r"--out .*f is a file, not a folder; choose another --out"):
        check_output_dir(tmp_path / "f")
    with pytest.raises(TformerError, match=r"f is a file, not a folder"):
        check_output_dir(tmp_path / "f" / "sub" / "run", what="--save-dir")


def test_a_virtual_filesystem_refuses_even_root():
    with pytest.raises(TformerError, match="/proc/tformer-run cannot be written"):
        check_output_dir("/proc/tformer-run")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through chmod 0o500; the /proc case covers it")
def test_a_read_only_folder(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    with pytest.raises(TformerError, match="permission denied"):
        check_output_dir(ro / "run")


def test_a_full_disk_is_refused_up_front(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic.shutil, "disk_usage", lambda p: type("U", (), {"free": 4096})())
    with pytest.raises(TformerError, match="no space left on the device .4096 bytes free.; free space"):
        check_output_dir(tmp_path / "run")


@pytest.mark.parametrize("argv", [
    ["train", "--out", "{file}", "--max-steps", "1"],
    ["report", "--quick", "--no-train", "--out", "{file}/sub"],  # report.build checks its own --out
    ["export", "--ckpt", "{dir}", "--out", "/proc/tformer-export"],
])
def test_the_cli_refuses_an_unwritable_out_in_one_line(tmp_path, argv):
    (tmp_path / "f").write_text("x")
    argv = [a.format(file=tmp_path / "f", dir=tmp_path) for a in argv]
    proc = run_tformer(argv, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tformer {argv[0]}: error:") and argv[argv.index("--out") + 1].split("/sub")[0] in lines[0] and "Traceback" not in proc.stderr
    assert (tmp_path / "f").read_text() == "x"


def test_a_nested_write_failure_names_where_the_file_was_going(tmp_path):
    """A checkpoint folder staged under a temporary name, with a file inside failing on a full disk:
    the error names checkpoint/model.safetensors, not the staging folder the user never sees."""
    final = tmp_path / "checkpoint"
    with pytest.raises(atomic.WriteError) as info:
        with atomic.atomic_dir(final) as staging:
            with atomic.atomic_path(staging / "model.safetensors"):
                raise OSError(errno.ENOSPC, "No space left on device")
    assert str(info.value).startswith(f"cannot write {final / 'model.safetensors'}: no space left")
    assert info.value.path == final / "model.safetensors" and info.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []  # nothing staged is left behind
