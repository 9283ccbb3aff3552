"""Bad fine-tuning input is one TformerError line naming the problem and the fix."""

from __future__ import annotations

import json

import pytest
import torch

from tformer.adapt.lora import LoraLinear
from tformer.adapt.peft import apply_peft
from tformer.adapt.peft_format import load_adapter, save_adapter
from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.core.peft import PeftSpec
from tformer.cost import peft as cost
from tformer.model import build

BERT = dict(arch="encoder", vocab_size=41, d_model=18, n_heads=3, n_layers=2, d_ff=22, max_positions=40,
            task="sequence-classification", n_classes=3)


def _model(**changes):
    return build(ModelConfig(**(BERT | changes)))


def _one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert "\n" not in text
    return text


def test_target_that_matches_nothing_names_the_closest():
    with pytest.raises(TformerError) as e:
        apply_peft(_model(), PeftSpec("lora", targets=("q_prj",)))
    assert "'q_prj' matches no module" in _one_line(e) and "q_proj" in str(e.value)
    with pytest.raises(TformerError, match="matches no linear layer; closest names: .*q_proj"):
        cost.lora_targets(ModelConfig(**BERT), PeftSpec("lora", targets=("q_prj",)))


def test_target_that_is_not_a_linear():
    with pytest.raises(TformerError) as e:
        apply_peft(_model(), PeftSpec("lora", targets=("attn_norm",)))
    assert "is a LayerNorm, not a Linear" in _one_line(e)


def test_bad_regex():
    with pytest.raises(TformerError, match="not a valid regular expression"):
        apply_peft(_model(), PeftSpec("lora", targets=("q_proj(",)))


def test_rank_zero_or_larger_than_the_layer():
    with pytest.raises(TformerError) as e:
        PeftSpec("lora", rank=0)
    assert "rank must be a whole number of at least 1" in _one_line(e)
    with pytest.raises(TformerError) as e:
        apply_peft(_model(), PeftSpec("lora", rank=19))
    assert "LoRA rank 19 does not fit 'encoder.layers.0.attn.q_proj' (18 x 18); choose a rank from 1 to 18" \
        in _one_line(e)
    with pytest.raises(TformerError, match="LoRA rank 19 does not fit"):
        cost.lora_targets(ModelConfig(**BERT), PeftSpec("lora", rank=19))
    model = _model()
    with pytest.raises(TformerError, match="LoRA rank 4 does not fit 'head' \\(3 x 18\\)"):
        apply_peft(model, PeftSpec("lora", rank=4, targets=("q_proj", "head")))
    assert not any(isinstance(m, LoraLinear) for m in model.modules())  # refused whole: nothing was wrapped


def test_adapter_for_another_base_model(tmp_path):
    small = _model()
    spec = PeftSpec("lora", rank=2)
    apply_peft(small, spec)
    save_adapter(small, spec, tmp_path / "a")
    other = _model(d_model=21, n_heads=3)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    with pytest.raises(TformerError) as e:
        load_adapter(other, tmp_path / "a")
    text = _one_line(e)
    assert "adapter tensor 'base_model.model.bert.encoder.layer.0.attention.self.query.lora_A.weight' has shape " \
           "(2, 18) where this model needs (2, 21)" in text
    assert set(other.state_dict()) == set(before)  # refused before the model changed
    fewer = _model(n_layers=1)
    with pytest.raises(TformerError, match="names no module of this bert model; the adapter was made for another"):
        load_adapter(fewer, tmp_path / "a")


def test_unknown_peft_type(tmp_path):
    model = _model()
    spec = PeftSpec("lora", rank=2)
    apply_peft(model, spec)
    save_adapter(model, spec, tmp_path / "a")
    config = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    config["peft_type"] = "IA3"
    (tmp_path / "a" / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(TformerError) as e:
        load_adapter(_model(), tmp_path / "a")
    assert "peft_type 'IA3' is not supported; tformer loads LORA, PROMPT_TUNING, PREFIX_TUNING, TFORMER" in _one_line(e)


def test_missing_folder_and_non_peft_methods(tmp_path):
    with pytest.raises(TformerError, match="has no adapter_config.json"):
        load_adapter(_model(), tmp_path / "nothing")
    with pytest.raises(TformerError, match="shares layers"):
        apply_peft(_model(share_layers=True), PeftSpec("prefix", virtual_tokens=2))
    with pytest.raises(TformerError, match="adapter bottleneck 40 is wider than the model's width 18"):
        apply_peft(_model(), PeftSpec("adapter", bottleneck=40))


def test_tformer_format_round_trip_for_adapters(tmp_path):
    """Methods peft has no format for travel as peft_type TFORMER: trainable tensors by tformer name, the spec."""
    model = _model()
    spec = PeftSpec("adapter", bottleneck=3)
    apply_peft(model, spec)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.requires_grad:
                p.add_(torch.randn_like(p))
    save_adapter(model, spec, tmp_path / "a")
    fresh = _model()
    fresh.load_state_dict({k: v for k, v in model.state_dict().items() if ".adapter." not in k}, strict=False)
    assert load_adapter(fresh, tmp_path / "a") == spec
    ids = torch.randint(0, 41, (2, 6))
    with torch.no_grad():
        assert torch.equal(fresh.eval()(ids).logits, model.eval()(ids).logits)


def test_model_without_hf_counterpart_saves_in_tformer_format(tmp_path):
    config = dict(arch="decoder", vocab_size=37, d_model=16, n_heads=4, n_layers=2, d_ff=20, max_positions=40,
                  position="alibi")
    model = build(ModelConfig(**config))
    spec = PeftSpec("lora", rank=2)
    apply_peft(model, spec)
    with torch.no_grad():
        model.decoder.layers[1].attn.v_proj.lora_B.weight.normal_()
    save_adapter(model, spec, tmp_path / "a")
    assert json.loads((tmp_path / "a" / "adapter_config.json").read_text())["peft_type"] == "TFORMER"
    fresh = build(ModelConfig(**config))
    fresh.load_state_dict(model.state_dict(), strict=False)
    assert load_adapter(fresh, tmp_path / "a") == spec
    ids = torch.randint(0, 37, (1, 5))
    with torch.no_grad():
        assert torch.equal(fresh.eval()(ids).logits, model.eval()(ids).logits)


def test_damaged_weights_and_unsupported_lora_options(tmp_path):
    model = _model()
    spec = PeftSpec("lora", rank=2)
    apply_peft(model, spec)
    save_adapter(model, spec, tmp_path / "a")
    config_path = tmp_path / "a" / "adapter_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps(config | {"use_dora": True}))
    with pytest.raises(TformerError, match="sets use_dora=True, which tformer's LoRA does not run"):
        load_adapter(_model(), tmp_path / "a")
    config_path.write_text(json.dumps(config))
    (tmp_path / "a" / "adapter_model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(TformerError) as e:
        load_adapter(_model(), tmp_path / "a")
    _one_line(e)
