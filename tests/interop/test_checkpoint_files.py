"""tformer.interop.checkpoint: config.json + model.safetensors written atomically and read back, with one-line errors."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.data.tokenizers import CharTokenizer
from tformer.interop import checkpoint as ckpt
from tformer.model import build

CONFIG = ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=20, max_positions=8)


@pytest.fixture
def saved(tmp_path):
    torch.manual_seed(0)
    model = build(CONFIG).eval()
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train_args.json").write_text("{}")  # a run's other files stay
    ckpt.save_model(model, tmp_path / "run")
    return model, tmp_path / "run"


def _message(call, *args) -> str:
    with pytest.raises(TformerError) as exc:
        call(*args)
    assert "\n" not in str(exc.value)
    return str(exc.value)


def test_round_trip_keeps_the_folder_s_other_files(saved):
    model, run = saved
    back = ckpt.load_model(run)
    assert back.config == model.config and not back.training
    for (name, a), (_, b) in zip(model.state_dict().items(), back.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)
    assert sorted(p.name for p in run.iterdir()) == ["config.json", "model.safetensors", "train_args.json"]
    assert not [p for p in run.parent.iterdir() if p.name.startswith(".")]  # no staging folder left


def test_a_failed_save_leaves_the_previous_checkpoint(saved, monkeypatch):
    _, run = saved
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    other = build(CONFIG.replace(n_layers=2))

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt.st, "save_model", crash)
    with pytest.raises(OSError, match="disk full"):
        ckpt.save_model(other, run)
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before
    assert not [p for p in run.parent.iterdir() if p.name.startswith(".")]


def test_gathered_weights_are_written_instead_of_the_model_s(saved, tmp_path):
    model, _ = saved
    weights = {k: torch.zeros_like(v) for k, v in model.state_dict().items() if k != "lm_head.weight"}
    ckpt.save_model(model, tmp_path / "zeros", weights)
    assert all(not t.any() for t in ckpt.read_state_dict(tmp_path / "zeros").values())


def test_older_runs_keep_the_files_in_final(saved, tmp_path):
    model, run = saved
    ckpt.save_model(model, tmp_path / "old" / "final")
    CharTokenizer("abc").save(tmp_path / "old" / "tokenizer")
    loaded, tok = ckpt.load_checkpoint(tmp_path / "old")
    assert loaded.config == model.config and tok.encode("cab") == CharTokenizer("abc").encode("cab")
    assert ckpt.load_checkpoint(run)[1] is None


def test_find_tokenizer_looks_in_the_folder_its_tokenizer_and_a_sibling(tmp_path):
    tok = CharTokenizer("xyz")
    tok.save(tmp_path / "a")
    tok.save(tmp_path / "b" / "tokenizer")
    tok.save(tmp_path / "tokenizer")
    for where in (tmp_path / "a", tmp_path / "b", tmp_path / "c"):
        assert ckpt.find_tokenizer(tmp_path / "none", where).encode("zyx") == tok.encode("zyx")
    assert ckpt.find_tokenizer(tmp_path / "a" / "deeper" / "still") is None


def test_missing_folder_and_missing_files(tmp_path):
    assert "does not exist" in _message(ckpt.load_model, tmp_path / "nowhere")
    assert "has no config.json + model.safetensors" in _message(ckpt.load_model, tmp_path)


def test_corrupt_files(saved):
    model, run = saved
    (run / "config.json").write_text("{broken")
    assert "config.json is not valid JSON" in _message(ckpt.load_model, run)
    (run / "config.json").write_text("[]")
    assert "must hold a JSON object" in _message(ckpt.load_model, run)
    (run / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert "Hugging Face config; load it with --hf" in _message(ckpt.load_model, run)
    (run / "config.json").write_text(json.dumps(model.config.to_dict()))
    tensors = load_file(str(run / "model.safetensors"))
    name = next(k for k in tensors if "norm" in k)
    del tensors[name]
    save_file(tensors, str(run / "model.safetensors"))
    assert f"is missing tensors ['{name}']" in _message(ckpt.load_model, run)
    (run / "model.safetensors").write_bytes(b"\x00garbage")
    with pytest.raises(ckpt.CorruptCheckpoint, match="cannot load .*model.safetensors") as exc:
        ckpt.load_model(run)
    assert exc.value.path == run / "model.safetensors"
