"""A full disk while saving weights, and damaged or mismatched weights on load: one TformerError
naming the path, the previous files intact, no temporary left, nothing allocated for a bad file."""

import json
import struct
from pathlib import Path

import pytest
import torch
from forked_cli import run_tformer
from safetensors import SafetensorError
from safetensors import torch as st

import tformer
from tformer.core.errors import TformerError
from tformer.interop import checkpoint as ckpt
from tformer.train import checkpoint as train_ckpt

FULL = "Error while serializing: I/O error: No space left on device (os error 28)"


def _model(n_layers=1):
    return tformer.build_model(tformer.preset("gpt2", n_layers=n_layers, d_model=16, n_heads=2, d_ff=32,
                                              vocab_size=20, max_positions=8))


def _full_disk(*args, **kwargs):
    raise SafetensorError(FULL)


def _snapshot(folder):
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_full_disk_during_a_checkpoint_save(tmp_path, monkeypatch):
    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    target = tmp_path / "checkpoint"
    train_ckpt.save_checkpoint(target, model, opt, {"step": 1})
    before = _snapshot(tmp_path)
    monkeypatch.setattr(train_ckpt, "save_file", _full_disk)  # the optimizer state is the first to fail
    with pytest.raises(TformerError, match=f"cannot write {target}: no space left on the device; free space"):
        train_ckpt.save_checkpoint(target, model, opt, {"step": 2})
    assert _snapshot(tmp_path) == before  # the old checkpoint whole, no temporary folder beside it


def test_full_disk_during_the_weights_of_a_model_save(tmp_path, monkeypatch):
    model = _model()
    ckpt.save_model(model, tmp_path / "run")
    before = _snapshot(tmp_path)
    monkeypatch.setattr(st, "save_model", _full_disk)
    with pytest.raises(TformerError, match=f"cannot write {tmp_path / 'run'}: no space left"):
        ckpt.save_model(model, tmp_path / "run")
    assert _snapshot(tmp_path) == before


@pytest.mark.parametrize("where", ["weights", "config"])
def test_full_disk_during_save_hf(tmp_path, monkeypatch, where):
    from tformer.interop import hf

    model = _model()
    out = tmp_path / "hf"
    hf.save_hf(model, out)
    before = _snapshot(tmp_path)
    if where == "weights":
        monkeypatch.setattr(hf, "save_file", _full_disk)
    else:
        real = Path.write_text

        def full(self, *a, **k):
            if self.name == "config.json":
                raise OSError(28, "No space left on device", str(self))
            return real(self, *a, **k)
        monkeypatch.setattr(Path, "write_text", full)
    named = out / "config.json" if where == "config" else out
    with pytest.raises(TformerError, match=f"cannot write {named}: no space left on the device"):
        hf.save_hf(_model(2), out)
    assert _snapshot(tmp_path) == before


# Loading damaged or mismatched weights ---------------------------------------------------------
@pytest.fixture
def run(tmp_path):
    ckpt.save_model(_model(), tmp_path / "run")
    return tmp_path / "run"


def test_truncated_weights(run):
    path = run / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(TformerError, match=f"cannot load checkpoint weights {path}: it is truncated: tensor"):
        ckpt.load_model(run)


def test_header_claiming_more_than_the_file(run):
    path = run / "model.safetensors"
    path.write_bytes(struct.pack("<Q", 1 << 40) + path.read_bytes()[8:])
    with pytest.raises(TformerError, match=r"header claims 1099511627776 header bytes"):
        ckpt.load_model(run)


def test_mismatched_shapes_name_the_first_tensor(run):
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "d_ff": 48}))
    with pytest.raises(TformerError, match=r"has tensor '.*' of shape \[32, 16\], expected \[48, 16\]"):
        ckpt.load_model(run)


def test_hf_truncated_weights(tmp_path):
    from tformer.interop import hf

    hf.save_hf(_model(), tmp_path / "hf")
    path = tmp_path / "hf" / "model.safetensors"
    path.write_bytes(path.read_bytes()[:200])
    with pytest.raises(TformerError, match=f"cannot load weights file {path}"):
        hf.load_hf(tmp_path / "hf")


@pytest.mark.parametrize("damage", ["nested", "truncated weights"])
def test_the_cli_reports_a_damaged_checkpoint_in_one_line(run, tmp_path, damage):
    if damage == "nested":
        (run / "config.json").write_text("[" * 100_000)
    else:
        path = run / "model.safetensors"
        path.write_bytes(path.read_bytes()[:-64])
    before = _snapshot(run)
    proc = run_tformer(["export", "--ckpt", run, "--out", tmp_path / "x"], timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert str(run) in lines[0] and _snapshot(run) == before and not (tmp_path / "x").exists()
