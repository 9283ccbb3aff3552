"""The ViT and CLIP presets are the released configs: transformers' defaults (ViTConfig is google/vit-base-patch16-224,
CLIPConfig openai/clip-vit-base-patch32) size for size, the same parameter count as transformers' model built on the
meta device, and the published totals. Hugging Face folders tformer cannot read stop with one line."""

from __future__ import annotations

import json

import pytest
import torch

import tformer
from tformer.interop import config_from_hf

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()


def params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def on_meta(cls, config):
    with torch.device("meta"):
        return cls(config)


def test_vit_base_16_is_transformers_default_vit():
    hf = transformers.ViTConfig(num_labels=1000)
    read = config_from_hf(hf.to_dict() | {"architectures": ["ViTForImageClassification"]})
    ours = tformer.preset("vit-base-16")
    assert read == ours.replace(name=read.name)
    reference = on_meta(transformers.ViTForImageClassification, hf)
    assert params(tformer.build_model(ours, device="meta")) == params(reference) == 86_567_656  # ViT-B/16: 86.6M


def test_vit_large_16_is_google_vit_large():
    hf = transformers.ViTConfig(num_labels=1000, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                                intermediate_size=4096)  # google/vit-large-patch16-224's sizes
    ours = tformer.preset("vit-large-16")
    read = config_from_hf(hf.to_dict() | {"architectures": ["ViTForImageClassification"]})
    assert read == ours.replace(name=read.name)
    count = params(tformer.build_model(ours, device="meta"))
    assert count == params(on_meta(transformers.ViTForImageClassification, hf))
    assert round(count / 1e6) == 304  # ViT-L/16: 304M


def test_clip_presets_are_transformers_default_clip():
    hf = transformers.CLIPConfig()  # openai/clip-vit-base-patch32
    read = config_from_hf(hf.to_dict())
    ours = tformer.preset("clip-vit-b-32")
    assert read == ours.replace(name=read.name)
    count = params(tformer.build_model(ours, device="meta"))
    assert count == params(on_meta(transformers.CLIPModel, hf)) == 151_277_313  # CLIP ViT-B/32: 151.3M
    b16 = tformer.preset("clip-vit-b-16")
    assert b16 == ours.replace(patch_size=16, name=b16.name)
    assert round(params(tformer.build_model(b16, device="meta")) / 1e5) == 1496  # CLIP ViT-B/16: 149.6M


def one_line(path, match: str) -> None:
    with pytest.raises(tformer.TformerError, match=match) as err:
        tformer.load_hf(path)
    assert "\n" not in str(err.value), str(err.value)


@pytest.mark.parametrize("model_type", ["deit", "swin", "clip_vision_model", "siglip"])
def test_unsupported_vision_folders_are_refused(tmp_path, model_type):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "hidden_size": 36}))
    one_line(tmp_path, f"model_type '{model_type}' is not supported; supported: .*vit, clip")


def test_vision_configs_tformer_cannot_reproduce_are_refused(tmp_path):
    clip = transformers.CLIPConfig(text_config={"hidden_act": "gelu"}).to_dict()  # the vision tower keeps quick_gelu
    vit = transformers.ViTConfig(image_size=[224, 160]).to_dict()
    no_qkv_bias = transformers.ViTConfig(qkv_bias=False).to_dict()
    for i, (d, match) in enumerate([(clip, "text hidden_act='gelu' but vision hidden_act='quick_gelu'"),
                                    (vit, "image_size=\\[224, 160\\]"), (no_qkv_bias, "qkv_bias=false")]):
        (tmp_path / str(i)).mkdir()
        (tmp_path / str(i) / "config.json").write_text(json.dumps(d))
        one_line(tmp_path / str(i), match)


def test_vit_weights_of_another_size_are_refused(tmp_path):
    """A ViT folder whose positions do not fit its config (another image size): named, not half-loaded."""
    small = transformers.ViTConfig(num_hidden_layers=1, hidden_size=12, num_attention_heads=2, intermediate_size=16,
                                   image_size=8, patch_size=4)
    transformers.ViTModel(small).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"image_size": 12}))
    one_line(tmp_path, "embeddings.position_embeddings has shape \\(1, 5, 12\\) where the config needs \\(1, 10, 12\\)")
