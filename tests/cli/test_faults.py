"""Faults, as a user meets them, through the real CLI: a disk that fills up while weights are written,
pickles where weights or optimizer state belong, and an OS error nobody wrapped.

The signal, SIGKILL and two-trainer faults live beside the training CLI (tests/cli/test_train_cli.py,
tests/train/test_train_loop.py); FAULTS below counts them all for the closing note.
"""

import contextlib
import errno
import hashlib
import os
import pickle
import subprocess
from pathlib import Path

import pytest
import safetensors.torch
import torch
from forked_cli import run_tformer

from tformer import save_hf
from tformer.cli import main
from tformer.core.config import ModelConfig
from tformer.interop import hf
from tformer.interop.checkpoint import load_model, save_model
from tformer.model import build

ROOT = Path(__file__).resolve().parents[2]
# Big enough that its weights (about 3.3 MB in fp32) cannot fit on the 2 MB disk below.
WIDE = ["--set", "n_layers=1", "--set", "d_model=256", "--set", "n_heads=4", "--set", "d_ff=512",
        "--set", "max_positions=16", "--batch-size", "2", "--warmup", "1", "--eval-batches", "1",
        "--eval-interval", "1000", "--no-progress"]


def _tformer(*args, tmp_path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TFORMER_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    return run_tformer(args, env=env, timeout=300)


def _one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith("tformer ") and ": error: " in lines[-1]
    return lines[-1]


def _hashes(folder: Path) -> dict:
    return {p.relative_to(folder): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog; " * 300)
    return path


@contextlib.contextmanager
def _small_disk(where: Path, size: str):
    """A tmpfs of ``size`` mounted at ``where``: a real full disk. Skips where mounting is not allowed (not
    root, or a container without CAP_SYS_ADMIN); test_full_disk_injected covers those machines."""
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True) if os.geteuid() == 0 else None
    if mounted is None or mounted.returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root); the injected full disk stands in")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_full_disk_during_training_is_one_line_then_a_retry_succeeds(tmp_path):
    data = _corpus(tmp_path)
    with _small_disk(tmp_path / "disk", "2m") as disk:
        run = disk / "run"
        args = ["train", *WIDE, "--data", str(data), "--max-steps", "2", "--ckpt-interval", "1", "--out", str(run)]
        line = _one_line_error(_tformer(*args, tmp_path=tmp_path))
        assert f"cannot write {run / 'checkpoint'}" in line and "no space left on the device" in line
        # Nothing half-written: no staging leftovers, and no checkpoint a resume would read as valid.
        assert not [p for p in disk.rglob("*") if ".tmp-" in p.name]
        assert not (run / "checkpoint").exists() and not (run / "model.safetensors").exists()
        assert not (run / ".lock").exists()  # the lock went with the failed run
        # Free space (a bigger disk) and run the same command again: it trains and saves.
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        retry = _tformer(*args, tmp_path=tmp_path)
        assert retry.returncode == 0, retry.stderr[-2000:]
        assert load_model(run).config.d_model == 256


def test_full_disk_during_export_keeps_the_run_and_leaves_no_folder(tmp_path):
    model = build(ModelConfig(n_layers=1, d_model=256, n_heads=4, d_ff=512, vocab_size=64, max_positions=16))
    run = tmp_path / "run"
    save_model(model, run)
    before = _hashes(run)
    with _small_disk(tmp_path / "disk", "1500k") as disk:
        line = _one_line_error(_tformer("export", "--ckpt", str(run), "--out", str(disk / "hf"), tmp_path=tmp_path))
        assert "no space left on the device" in line and str(disk / "hf") in line
        assert list(disk.iterdir()) == []
    assert _hashes(run) == before


def test_full_disk_injected(tmp_path, monkeypatch, capsys):
    """Where no tmpfs can be mounted: the weights' writer fails as a full disk does (safetensors reports
    ENOSPC as its own error type carrying 'os error 28')."""
    def full(*args, **kwargs):
        raise safetensors.SafetensorError("Error while serializing: IoError(No space left on device (os error 28))")

    model = build(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=16, max_positions=16))
    run = tmp_path / "run"
    save_model(model, run)
    monkeypatch.setattr(hf, "save_file", full)  # the disk is full from here on
    before = _hashes(run)
    assert main(["export", "--ckpt", str(run), "--out", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no space left on the device" in err and "hf" in err
    assert not (tmp_path / "hf").exists() and not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert _hashes(run) == before


class _Payload:
    """Unpickling this runs a shell command that creates ``marker``: what a malicious weights file does."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _pickle_bomb(path: Path, marker: Path) -> None:
    with open(path, "wb") as f:
        pickle.dump({"weight": _Payload(marker)}, f)


def _torch_bomb(path: Path, marker: Path) -> None:
    torch.save({"weight": _Payload(marker)}, path)  # the zip format torch.load reads


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A tiny finished run with a checkpoint (copied per test before damage)."""
    tmp = tmp_path_factory.mktemp("faults")
    run = tmp / "run"
    tiny = ["--set", "n_layers=1", "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32",
            "--set", "max_positions=16", "--batch-size", "2", "--warmup", "1", "--eval-batches", "1",
            "--no-progress"]
    result = _tformer("train", *tiny, "--data", str(_corpus(tmp)), "--max-steps", "2", "--ckpt-interval", "1",
                      "--out", str(run), tmp_path=tmp)
    assert result.returncode == 0, result.stderr[-2000:]
    return run


def _copy(run: Path, dest: Path) -> Path:
    subprocess.run(["cp", "-a", str(run), str(dest)], check=True)
    return dest


@pytest.mark.parametrize("where, bomb", [
    ("checkpoint/model.safetensors", _pickle_bomb),
    ("checkpoint/optimizer.safetensors", _torch_bomb),
    ("checkpoint/rng.safetensors", _pickle_bomb),
])
def test_a_pickle_where_checkpoint_tensors_belong_is_never_run(trained_run, tmp_path, where, bomb):
    run, marker = _copy(trained_run, tmp_path / "run"), tmp_path / "PWNED"
    bomb(run / where, marker)
    before = _hashes(run)
    line = _one_line_error(_tformer("train", "--resume", "--out", str(run), "--max-steps", "4", tmp_path=tmp_path))
    assert Path(where).name in line
    assert not marker.exists()
    assert _hashes(run) == before


@pytest.mark.parametrize("command", [["generate", "--prompt", "the", "--max-new-tokens", "2"],
                                     ["export", "--out", "EXPORT"]])
def test_a_pickle_as_model_weights_is_never_run(trained_run, tmp_path, command):
    run, marker = _copy(trained_run, tmp_path / "run"), tmp_path / "PWNED"
    _torch_bomb(run / "model.safetensors", marker)
    before = _hashes(run)
    argv = [str(tmp_path / "out") if a == "EXPORT" else a for a in command]
    line = _one_line_error(_tformer(argv[0], "--ckpt", str(run), *argv[1:], tmp_path=tmp_path))
    assert "model.safetensors" in line
    assert not marker.exists() and not (tmp_path / "out").exists()
    assert _hashes(run) == before


@pytest.mark.parametrize("bomb", [_pickle_bomb, _torch_bomb])
def test_a_pickle_as_hf_pytorch_model_bin_is_never_run(tmp_path, bomb):
    hf, marker = tmp_path / "hf", tmp_path / "PWNED"
    model = build(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=16, max_positions=16))
    save_hf(model, hf)
    (hf / "model.safetensors").unlink()
    bomb(hf / "pytorch_model.bin", marker)
    before = _hashes(hf)
    line = _one_line_error(_tformer("generate", "--hf", str(hf), "--prompt-ids", "1,2", "--max-new-tokens", "2",
                                    tmp_path=tmp_path))
    assert "pytorch_model.bin" in line
    assert not marker.exists()
    assert _hashes(hf) == before


def test_an_os_error_nobody_wrapped_is_still_one_line(tmp_path, monkeypatch, capsys):
    """The CLI's last net: an OS fault with a known cause on a path no writer wrapped."""
    from tformer.cli import presets as presets_cli

    def broken(args):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "somewhere"))

    monkeypatch.setattr(presets_cli, "run", broken)
    assert main(["presets"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"tformer presets: error: {tmp_path / 'somewhere'}: permission denied; choose a folder you " \
                  "can write to, or fix its permissions"


def test_an_os_error_without_a_known_cause_keeps_its_traceback(monkeypatch):
    from tformer.cli import presets as presets_cli

    def broken(args):
        raise OSError(errno.ECHILD, "No child processes")  # a bug, not a user's fault: do not hide it

    monkeypatch.setattr(presets_cli, "run", broken)
    with pytest.raises(OSError):
        main(["presets"])


# The faults of issue 21's campaign, where each is shown (for the closing note's count).
FAULTS = {
    "full disk during training (real tmpfs), then retry": "test_faults.py",
    "full disk during export (real tmpfs)": "test_faults.py",
    "full disk injected (no tmpfs)": "test_faults.py",
    "pickle as checkpoint tensors (model, optimizer, rng)": "test_faults.py",
    "pickle as model weights (generate, export)": "test_faults.py",
    "pickle as HF pytorch_model.bin (raw, torch zip)": "test_faults.py",
    "unwrapped OS error": "test_faults.py",
    "SIGTERM mid-training, printed resume command, bit-exact": "test_train_cli.py",
    "SIGINT mid-training, contradicting resume changes nothing": "test_train_cli.py",
    "second trainer on a locked run": "test_train_cli.py",
    "stale lock taken over": "test_train_cli.py",
    "SIGKILL after and during a checkpoint write, bit-exact resume": "test_train_loop.py",
    "full disk mid checkpoint / weights / HF save (injected)": "test_write_faults.py",
}
