"""Weights that do not fit the config are refused from the safetensors header alone: nothing is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import safetensors.torch
import torch
from safetensors.torch import load_file, save_file

import tformer
from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.interop import checkpoint, hf

TINY = dict(n_layers=1, d_model=8, n_heads=2, d_ff=16, vocab_size=16, max_positions=16)


@pytest.fixture
def no_reads(monkeypatch):
    """Any tensor read through safetensors fails the test: the refusal must come from the header."""
    def refuse(*args, **kwargs):
        raise AssertionError("a tensor was read before the header was checked")
    for module in (safetensors.torch, checkpoint.st):
        monkeypatch.setattr(module, "load_file", refuse)
        monkeypatch.setattr(module, "load_model", refuse)
    monkeypatch.setattr(hf, "load_file", refuse)


@pytest.fixture
def ckpt(tmp_path) -> Path:
    torch.manual_seed(0)
    return checkpoint.save_model(tformer.build_model(ModelConfig(**TINY)), tmp_path / "ckpt")


def _edit(path: Path, change) -> None:
    tensors = load_file(str(path))
    change(tensors)
    save_file(tensors, str(path), metadata={"format": "pt"})


def _wrong_shape_tensor(path: Path) -> str:
    name = next(k for k in load_file(str(path)) if k.endswith("fc1.weight") or "mlp" in k and k.endswith("weight"))
    _edit(path, lambda t: t.__setitem__(name, torch.zeros(t[name].shape[0] + 1, *t[name].shape[1:])))
    return name


def test_a_wrong_shape_checkpoint_is_refused_before_a_tensor_is_read(ckpt, no_reads):
    weights = ckpt / "model.safetensors"
    name = _wrong_shape_tensor(weights)
    with pytest.raises(TformerError) as err:
        checkpoint.load_model(ckpt)
    line = str(err.value)
    assert str(weights) in line and repr(name) in line and "expected" in line
    assert "does not match these weights" in line and "\n" not in line


def test_the_check_needs_only_the_header_a_garbage_data_section_is_not_read(ckpt):
    weights = ckpt / "model.safetensors"
    name = _wrong_shape_tensor(weights)
    raw = weights.read_bytes()
    head = 8 + int.from_bytes(raw[:8], "little")
    weights.write_bytes(raw[:head] + b"\xff" * (len(raw) - head))  # valid header, NaN-filled data
    with pytest.raises(TformerError, match=f"{name!r} of shape"):
        checkpoint.load_model(ckpt)


def test_missing_and_unexpected_tensors_are_found_in_the_header(ckpt, no_reads, tmp_path):
    weights = ckpt / "model.safetensors"
    _edit(weights, lambda t: t.pop(sorted(t)[0]))
    with pytest.raises(TformerError, match="is missing tensors"):
        checkpoint.load_model(ckpt)


def test_an_unexpected_tensor_is_found_in_the_header(ckpt, no_reads):
    _edit(ckpt / "model.safetensors", lambda t: t.__setitem__("extra.weight", torch.zeros(2)))
    with pytest.raises(TformerError, match=r"has unexpected tensors \['extra.weight'\]"):
        checkpoint.load_model(ckpt)


def test_integer_weights_are_refused_from_the_header(ckpt, no_reads):
    def to_int(tensors):
        name = sorted(tensors)[0]
        tensors[name] = tensors[name].to(torch.int32)
    _edit(ckpt / "model.safetensors", to_int)
    with pytest.raises(TformerError, match="as I32, not a floating-point type"):
        checkpoint.load_model(ckpt)


def test_a_wrong_shape_hf_folder_is_refused_before_a_tensor_is_read(tmp_path, no_reads, monkeypatch):
    config = tformer.preset("gpt2", n_layers=2, d_model=32, n_heads=4, d_ff=64, vocab_size=50, max_positions=16)
    monkeypatch.undo()  # save_hf and the edit read and write for real
    tformer.save_hf(tformer.build_model(config), tmp_path / "hf")
    data = json.loads((tmp_path / "hf" / "config.json").read_text())
    data["n_inner"] = 128  # config.json now sizes the MLP differently from the weights
    (tmp_path / "hf" / "config.json").write_text(json.dumps(data))
    monkeypatch.setattr(hf, "load_file", lambda *a, **k: pytest.fail("a tensor was read"))
    with pytest.raises(TformerError) as err:
        tformer.load_hf(tmp_path / "hf")
    line = str(err.value)
    assert line.startswith(str(tmp_path / "hf" / "model.safetensors")) and "mlp.c_fc.weight has shape" in line
    assert "where the config needs" in line and "come from different models" in line


def test_a_matching_checkpoint_and_hf_folder_still_load(ckpt, tmp_path):
    model = checkpoint.load_model(ckpt)
    assert model.config.d_ff == TINY["d_ff"]
    config = tformer.preset("gpt2", n_layers=1, d_model=32, n_heads=4, d_ff=64, vocab_size=50, max_positions=16)
    tformer.save_hf(tformer.build_model(config), tmp_path / "hf")
    assert tformer.load_hf(tmp_path / "hf").config.d_ff == 64
