"""tformer.interop.load_config: one loader for presets, JSON files and model folders, with one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import tformer
from tformer.core.config import ModelConfig, preset
from tformer.core.errors import TformerError
from tformer.interop import load_config
from tformer.interop.hf_config import HF_FAMILIES, config_to_hf

GPT2_HF = {"model_type": "gpt2", "n_layer": 2, "n_embd": 32, "n_head": 4, "vocab_size": 50, "n_positions": 16}


def _error(source, **kw) -> str:
    with pytest.raises(TformerError) as exc:
        load_config(source, **kw)
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_preset_with_overrides_as_strings_or_a_dict():
    assert load_config("gpt2") == preset("gpt2")
    assert load_config("gpt2", overrides=["n_layers=3"]).n_layers == 3
    assert load_config("gpt2", overrides={"n_layers": 3}) == preset("gpt2", n_layers=3)


def test_unknown_preset_names_the_closest():
    assert "unknown preset 'gtp2' (did you mean 'gpt2'?)" in _error("gtp2")


def test_tformer_and_hf_json_files_and_folders(tmp_path):
    own = tmp_path / "mine.json"
    own.write_text(json.dumps(preset("llama-7b").to_dict()))
    assert load_config(own) == preset("llama-7b")
    assert load_config(str(own)) == preset("llama-7b")
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(GPT2_HF))
    from_dir, from_file = load_config(hf), load_config(hf / "config.json")
    assert from_dir == from_file and (from_dir.arch, from_dir.n_layers, from_dir.d_model) == ("decoder", 2, 32)
    run = tmp_path / "run"  # a training run of an older layout: config.json under final/
    (run / "final").mkdir(parents=True)
    (run / "final" / "config.json").write_text(json.dumps(preset("char-small").to_dict()))
    assert load_config(run) == preset("char-small")


@pytest.mark.parametrize("name,model_type", [("gpt2", "gpt2"), ("llama-7b", "llama"), ("bert-base", "bert"),
                                             ("bart-base", "bart"), ("t5-small", "t5")])
def test_each_family_in_the_table_is_written_and_read_back(tmp_path, name, model_type):
    config = preset(name, n_layers=2, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    data = config_to_hf(config)
    assert data["model_type"] == model_type
    (tmp_path / "config.json").write_text(json.dumps(data))
    back = load_config(tmp_path)
    assert (back.arch, back.n_layers, back.d_model, back.position) == (config.arch, 2, config.d_model, config.position)


def test_missing_file_folder_without_config_and_a_path_named_like_a_preset(tmp_path):
    assert "does not exist" in _error(tmp_path / "missing.json")
    assert "does not exist" in _error(str(tmp_path / "nowhere"))
    assert "does not exist" in _error(Path("gpt2"))  # a Path is never a preset
    assert f"{tmp_path} has no config.json" in _error(tmp_path)


@pytest.mark.parametrize("text,expected", [
    ("{not json", "is not valid JSON"),
    ("[1, 2]", "must hold a JSON object, got list"),
    ('{"n_layer": 2}', "unknown config key 'n_layer' (did you mean 'n_layers'?)"),
    ('{"model_type": "mamba"}', "model_type 'mamba' is not supported"),
    ('{"n_layers": 0}', "n_layers must be positive"),
])
def test_bad_files_are_one_line_errors_naming_the_file(tmp_path, text, expected):
    path = tmp_path / "c.json"
    path.write_text(text)
    message = _error(path)
    assert expected in message and str(path) in message


def test_model_config_from_file_reads_only_tformer_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(GPT2_HF))
    with pytest.raises(TformerError, match="Hugging Face config.json; read it with tformer.interop.load_config"):
        ModelConfig.from_file(path)
    path.write_text(json.dumps(preset("bert-base").to_dict()))
    assert ModelConfig.from_file(tmp_path) == preset("bert-base")


def test_every_architecture_has_a_hugging_face_family():
    from tformer.core.config import ARCHS

    assert set(HF_FAMILIES) == set(ARCHS)


def test_import_tformer_stays_torch_free_and_exports_load_config():
    code = ("import sys, tformer; assert tformer.load_config('gpt2').n_layers == 12; "
            "assert 'torch' not in sys.modules, 'torch imported'; tformer.load_hf; assert 'torch' in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert tformer.load_config is load_config


def test_train_and_report_read_configs_through_the_same_loader(tmp_path):
    from tformer.train.setup import base_config

    (tmp_path / "config.json").write_text(json.dumps(GPT2_HF))
    assert base_config(None, None, str(tmp_path), ["n_layers=3"]) == load_config(tmp_path, overrides=["n_layers=3"])
    assert base_config(None, str(tmp_path / "config.json"), None, []) == load_config(tmp_path)
    assert base_config("gpt2", None, None, ["d_ff=10"]) == preset("gpt2", d_ff=10)
    with pytest.raises(TformerError, match="does not exist"):
        base_config(None, "gpt2", None, [])  # --config names a file, never a preset
    with pytest.raises(TformerError, match="give one of --preset, --config or --hf"):
        base_config("gpt2", str(tmp_path), None, [])
