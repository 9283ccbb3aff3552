"""Bad checkpoints fail with one clear line that names the problem (tformer.TformerError)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import tformer
from tformer import TformerError
from tformer.core.config import ModelConfig
from tformer.interop import load_config
from tformer.interop.hf_config import config_from_hf


@pytest.fixture
def gpt2_dir(tmp_path) -> Path:
    """A valid two-layer GPT-2 checkpoint written by save_hf, ready to be damaged."""
    torch.manual_seed(0)
    config = tformer.preset("gpt2", n_layers=2, d_model=32, n_heads=4, d_ff=64, vocab_size=50, max_positions=16)
    tformer.save_hf(tformer.build_model(config), tmp_path / "ckpt")
    return tmp_path / "ckpt"


def _edit_weights(path: Path, change) -> None:
    tensors = load_file(str(path / "model.safetensors"))
    change(tensors)
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def _edit_config(path: Path, **changes) -> None:
    data = json.loads((path / "config.json").read_text())
    data.update(changes)
    (path / "config.json").write_text(json.dumps(data))


def _one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_valid_checkpoint_loads(gpt2_dir):
    assert tformer.load_hf(gpt2_dir).config.n_layers == 2


def test_missing_tensor_is_named(gpt2_dir):
    _edit_weights(gpt2_dir, lambda t: t.pop("transformer.h.1.mlp.c_fc.weight"))
    with pytest.raises(TformerError) as exc:
        tformer.load_hf(gpt2_dir)
    message = _one_line(exc)
    assert "missing 1 tensor" in message and "transformer.h.1.mlp.c_fc.weight" in message and "gpt2" in message


def test_config_with_more_layers_than_the_weights(gpt2_dir):
    _edit_config(gpt2_dir, n_layer=3)
    with pytest.raises(TformerError, match=r"missing \d+ tensors .*transformer\.h\.2\.") as exc:
        tformer.load_hf(gpt2_dir)
    _one_line(exc)


def test_unexpected_tensor_is_named(gpt2_dir):
    _edit_weights(gpt2_dir, lambda t: t.update({"transformer.h.0.attn.rotary.weight": torch.zeros(3)}))
    with pytest.raises(TformerError, match="no place for: transformer.h.0.attn.rotary.weight") as exc:
        tformer.load_hf(gpt2_dir)
    _one_line(exc)


def test_ignorable_buffers_are_skipped(gpt2_dir):
    _edit_weights(gpt2_dir, lambda t: t.update({"transformer.h.0.attn.bias": torch.ones(1, 1, 16, 16)}))
    tformer.load_hf(gpt2_dir)


def test_shape_mismatch_is_named(gpt2_dir):
    _edit_config(gpt2_dir, vocab_size=60)
    with pytest.raises(TformerError) as exc:
        tformer.load_hf(gpt2_dir)
    message = _one_line(exc)
    assert "transformer.wte.weight has shape (50, 32) where the config needs (60, 32)" in message


def test_fused_qkv_shape_mismatch(gpt2_dir):
    _edit_weights(gpt2_dir, lambda t: t.update({"transformer.h.0.attn.c_attn.weight": torch.zeros(32, 64)}))
    with pytest.raises(TformerError, match=r"c_attn\.weight has shape \(32, 64\) where the config needs \(32, 96\)"):
        tformer.load_hf(gpt2_dir)


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_safetensors(gpt2_dir, damage):
    path = gpt2_dir / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes({"garbage": b"not a safetensors file at all", "truncated": data[: len(data) // 2],
                      "empty": b""}[damage])
    with pytest.raises(TformerError, match="corrupt") as exc:
        tformer.load_hf(gpt2_dir)
    assert "model.safetensors" in _one_line(exc)


def test_corrupt_and_unsafe_pytorch_bin(gpt2_dir):
    (gpt2_dir / "model.safetensors").unlink()
    (gpt2_dir / "pytorch_model.bin").write_bytes(b"this is not a checkpoint")
    with pytest.raises(TformerError, match="pytorch_model.bin"):
        tformer.load_hf(gpt2_dir)
    # A pickle that would run code is refused by weights_only, not executed.
    torch.save({"weights": ModelConfig()}, gpt2_dir / "pytorch_model.bin", pickle_protocol=2)
    with pytest.raises(TformerError, match="pytorch_model.bin") as exc:
        tformer.load_hf(gpt2_dir)
    _one_line(exc)


def test_unknown_model_type(gpt2_dir):
    _edit_config(gpt2_dir, model_type="mamba")
    with pytest.raises(TformerError, match="model_type 'mamba' is not supported; supported: gpt2, llama") as exc:
        tformer.load_hf(gpt2_dir)
    _one_line(exc)
    with pytest.raises(TformerError, match="not supported"):
        load_config(gpt2_dir / "config.json")


def test_directory_without_config(gpt2_dir):
    (gpt2_dir / "config.json").unlink()
    with pytest.raises(TformerError, match="has no config.json"):
        tformer.load_hf(gpt2_dir)


def test_missing_directory_and_missing_weights(tmp_path):
    with pytest.raises(TformerError, match="does not exist"):
        tformer.load_hf(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 1, "n_embd": 8, "n_head": 2,
                                                      "vocab_size": 10, "n_positions": 8}))
    with pytest.raises(TformerError, match="no weights in .*model.safetensors or pytorch_model.bin"):
        tformer.load_hf(tmp_path)


def test_config_json_not_json(gpt2_dir):
    (gpt2_dir / "config.json").write_text("{model_type: gpt2")
    with pytest.raises(TformerError, match="config.json"):
        tformer.load_hf(gpt2_dir)


BASE = {
    "llama": dict(model_type="llama", num_hidden_layers=1, hidden_size=16, num_attention_heads=2,
                  intermediate_size=32, vocab_size=20),
    "bert": dict(model_type="bert", num_hidden_layers=1, hidden_size=16, num_attention_heads=2,
                 intermediate_size=32, vocab_size=20),
    "bart": dict(model_type="bart", encoder_layers=1, decoder_layers=1, d_model=16, encoder_attention_heads=2,
                 decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, vocab_size=20,
                 max_position_embeddings=16),
    "gpt2": dict(model_type="gpt2", n_layer=1, n_embd=16, n_head=2, vocab_size=20, n_positions=16),
    "t5": dict(model_type="t5", num_layers=1, d_model=16, d_kv=8, num_heads=2, d_ff=32, vocab_size=20),
}


@pytest.mark.parametrize("family,changes,expected", [
    ("llama", {"rope_scaling": {"rope_type": "longrope", "factor": 8.0}}, "rope_type='longrope'"),
    ("llama", {"attention_bias": True, "mlp_bias": False}, "one bias switch"),
    ("llama", {"hidden_act": "quick_gelu"}, "activation 'quick_gelu' is not supported"),
    ("bert", {"position_embedding_type": "relative_key"}, "position_embedding_type"),
    ("bart", {"decoder_ffn_dim": 64}, "one value for both stacks"),
    ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    ("t5", {"feed_forward_proj": "gated-gelu-extra"}, "feed_forward_proj"),
    ("gpt2", {"n_head": 3}, "not divisible by n_heads=3"),
])
def test_configs_we_cannot_reproduce_are_refused(family, changes, expected):
    with pytest.raises(TformerError, match=expected.replace("(", r"\(").replace("[", r"\[")):
        config_from_hf({**BASE[family], **changes})


def test_missing_config_key():
    broken = dict(BASE["gpt2"])
    del broken["n_embd"]
    with pytest.raises(TformerError, match="lacks the required key 'n_embd'"):
        config_from_hf(broken)


def test_hf_configs_read_through_load_config(tmp_path):
    for family, data in BASE.items():
        (tmp_path / "config.json").write_text(json.dumps(data))
        config = load_config(tmp_path)
        assert config.arch == {"gpt2": "decoder", "llama": "decoder", "bert": "encoder"}.get(family, "encoder-decoder")
