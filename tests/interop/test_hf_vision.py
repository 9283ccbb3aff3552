"""ViT and CLIP equal Hugging Face's ViTForImageClassification / ViTModel and CLIPModel, both ways.

Each reference is a tiny random config with odd sizes (hidden 36, 3 heads, intermediate 52; CLIP's vision tower
40 wide with 4 heads), every parameter perturbed, saved with ``save_pretrained`` and read with
``tformer.load_hf``; the other way, ``tformer.save_hf`` writes a folder that ``transformers`` loads with no
missing or unexpected tensor and the same outputs. fp32, eval, within 1e-5.
"""

from __future__ import annotations

import json

import pytest
import torch

import tformer
from tformer.interop import config_from_hf, config_to_hf, hf_family

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

TOL = 1e-5
VOCAB = 99
SIZES = dict(hidden_size=36, num_attention_heads=3, intermediate_size=52)


def perturbed(model, seed=0):
    """Every parameter (norm weights and biases included) moved off its initial value; eval mode."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    return model.eval()


def loaded_both_ways(model, tmp_path, hf_class, **load):
    """What a checkpoint loads as on the other side: HF -> tformer.load_hf, or tformer -> transformers (checked
    complete: no missing, unexpected or misshapen tensor)."""
    model.save_pretrained(tmp_path) if hasattr(model, "save_pretrained") else tformer.save_hf(model, tmp_path)
    if hf_class is None:
        return tformer.load_hf(tmp_path)
    back, info = hf_class.from_pretrained(tmp_path, output_loading_info=True, attn_implementation="eager", **load)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return back.eval()


def diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.float() - b.float()).abs().max().item()


# ViT -------------------------------------------------------------------------------------------------
def vit_reference(cls="ViTForImageClassification", channels=3, image=12, **kw):
    config = transformers.ViTConfig(num_hidden_layers=2, image_size=image, patch_size=4, num_channels=channels,
                                    num_labels=7, **SIZES, **kw)
    torch.manual_seed(0)
    return perturbed(getattr(transformers, cls)._from_config(config, attn_implementation="eager"))


def vit_outputs_agree(ours, ref, channels, size=(12, 12), interpolate=False, device="cpu") -> float:
    g = torch.Generator().manual_seed(1)
    pixels = torch.randn(3, channels, *size, generator=g).to(device)
    labels = torch.tensor([0, 6, 3], device=device)
    kw = dict(output_attentions=True, interpolate_pos_encoding=interpolate)
    with torch.no_grad():
        a, b = ours(pixels, labels=labels, **kw), ref(pixels, labels=labels, **kw)
        # the classifier class returns no last hidden state; its body (after the final norm) does
        hidden = ref.vit(pixels, interpolate_pos_encoding=interpolate).last_hidden_state
    diffs = [diff(a.logits, b.logits), diff(a.last_hidden_state, hidden), diff(a.loss, b.loss)]
    assert len(a.attentions) == len(b.attentions)
    diffs += [diff(x, y) for x, y in zip(a.attentions, b.attentions)]
    print(f"vit {channels}ch {size} interpolate={interpolate}: max|diff| = {max(diffs):.2e}")
    return max(diffs)


@pytest.mark.parametrize("channels,act", [(3, "gelu"), (1, "quick_gelu")])
def test_vit_matches_reference_at_its_size_and_interpolated(tmp_path, channels, act, device):
    ref = vit_reference(channels=channels, hidden_act=act, layer_norm_eps=1e-6)
    ours = loaded_both_ways(ref, tmp_path, None)
    c = ours.config
    assert (c.arch, c.n_classes, c.num_channels, c.image_size, c.patch_size, c.activation, c.norm_eps) == (
        "vit", 7, channels, 12, 4, act, 1e-6)
    ours, ref = ours.to(device), ref.to(device)
    assert vit_outputs_agree(ours, ref, channels, device=device) <= TOL
    for size in ((20, 20), (12, 20)):  # trained at 12: a larger square and a non-square image
        assert vit_outputs_agree(ours, ref, channels, size, interpolate=True, device=device) <= TOL


def test_vit_saved_by_tformer_loads_in_transformers(tmp_path):
    ours = tformer.load_hf(_saved(vit_reference(), tmp_path / "ref"))
    perturbed(ours, seed=3)  # weights of ours, not the reference's
    back = loaded_both_ways(ours, tmp_path / "ours", transformers.ViTForImageClassification)
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["architectures"] == ["ViTForImageClassification"]
    assert vit_outputs_agree(ours, back, 3) <= TOL
    assert vit_outputs_agree(ours, back, 3, (20, 12), interpolate=True) <= TOL
    again = tformer.load_hf(tmp_path / "ours")
    assert again.config == ours.config.replace(name=again.config.name)
    for (k, a), b in zip(ours.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k


def test_vit_model_without_classifier_both_ways(tmp_path):
    """ViTModel files carry no "vit." prefix and a pooler tformer does not model (dropped: it changes no
    hidden state); a headless ViT is saved as a ViTModel without one."""
    ref = vit_reference("ViTModel")
    ours = tformer.load_hf(_saved(ref, tmp_path / "ref"))
    assert ours.config.n_classes == 0 and ours.head is None
    pixels = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        assert diff(ours(pixels).last_hidden_state, ref(pixels).last_hidden_state) <= TOL
    back = loaded_both_ways(ours, tmp_path / "ours", transformers.ViTModel, add_pooling_layer=False)
    with torch.no_grad():
        assert diff(ours(pixels).last_hidden_state, back(pixels).last_hidden_state) <= TOL


def _saved(model, path):
    model.save_pretrained(path)
    return path


# CLIP ------------------------------------------------------------------------------------------------
def clip_reference(eos=VOCAB - 1, image=12, act="quick_gelu", **kw):
    """``kw``: the vision tower's other settings."""
    text = dict(num_hidden_layers=2, vocab_size=VOCAB, max_position_embeddings=16, pad_token_id=1, bos_token_id=0,
                eos_token_id=eos, hidden_act=act, **SIZES)
    vision = dict(num_hidden_layers=2, hidden_size=40, num_attention_heads=4, intermediate_size=44,
                  image_size=image, patch_size=4, hidden_act=act, **kw)
    config = transformers.CLIPConfig(text_config=text, vision_config=vision, projection_dim=20,
                                     logit_scale_init_value=2.0)
    torch.manual_seed(0)
    return perturbed(transformers.CLIPModel._from_config(config, attn_implementation="eager"))


def clip_batch(eos: int, n=3, size=(12, 12), seed=1):
    """n texts of lengths 4, 7, 5 (right-padded with pad id 1, masked), each ending in ``eos``; n images.
    eos = 2 is HF's legacy convention (the end token is the largest id): the texts end in VOCAB - 1 there."""
    g = torch.Generator().manual_seed(seed)
    lengths, width = (4, 7, 5, 6)[:n], 7
    end = VOCAB - 1 if eos == 2 else eos
    ids = torch.full((n, width), 1)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, k in enumerate(lengths):
        ids[i, :k] = torch.cat([torch.tensor([0]), torch.randint(3, VOCAB - 2, (k - 2,), generator=g),
                                torch.tensor([end])])
        mask[i, :k] = 1
    pixels = torch.randn(n, 3, *size, generator=g)
    return dict(input_ids=ids, attention_mask=mask, pixel_values=pixels)


CLIP_FIELDS = ("image_embeds", "text_embeds", "logits_per_image", "logits_per_text", "loss")


def clip_outputs_agree(ours, ref, eos, size=(12, 12), interpolate=False, device="cpu") -> float:
    batch = {k: v.to(device) for k, v in clip_batch(eos, size=size).items()}
    with torch.no_grad():
        a = ours(**batch, return_loss=True, interpolate_pos_encoding=interpolate)
        b = ref(**batch, return_loss=True, interpolate_pos_encoding=interpolate)
    diffs = [diff(getattr(a, f), getattr(b, f)) for f in CLIP_FIELDS]
    print(f"clip eos={eos} {size}: max|diff| = {max(diffs):.2e}")
    return max(diffs)


@pytest.mark.parametrize("eos", [2, VOCAB - 3], ids=["legacy-argmax", "real-eos"])
def test_clip_matches_reference(tmp_path, eos, device):
    ref = clip_reference(eos=eos)
    ours = loaded_both_ways(ref, tmp_path, None)
    c = ours.config
    assert (c.arch, c.d_model, c.vision_d_model, c.vision_n_heads, c.projection_dim, c.eos_token_id) == (
        "clip", 36, 40, 4, 20, eos)
    assert (c.activation, c.logit_scale_init, c.pad_token_id, c.bos_token_id) == ("quick_gelu", 2.0, 1, 0)
    ours, ref = ours.to(device), ref.to(device)
    assert clip_outputs_agree(ours, ref, eos, device=device) <= TOL
    assert clip_outputs_agree(ours, ref, eos, (20, 16), interpolate=True, device=device) <= TOL


def test_clip_saved_by_tformer_loads_in_transformers(tmp_path):
    ours = tformer.load_hf(_saved(clip_reference(act="gelu"), tmp_path / "ref"))
    assert ours.config.activation == "gelu"
    perturbed(ours, seed=3)
    back = loaded_both_ways(ours, tmp_path / "ours", transformers.CLIPModel)
    assert clip_outputs_agree(ours, back, VOCAB - 1) <= TOL
    again = tformer.load_hf(tmp_path / "ours")
    assert again.config == ours.config.replace(name=again.config.name)
    for (k, a), b in zip(ours.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k


def test_presets_save_as_the_families_they_name(tmp_path):
    """A ViT built here (any unused text field left as it is) and a CLIP preset write configs transformers reads
    back as the same sizes."""
    vit = tformer.preset("vit-tiny-16", n_layers=1, image_size=32, n_classes=5, vocab_size=11)
    clip = tformer.preset("clip-vit-b-32", n_layers=1, vision_n_layers=1, d_model=32, n_heads=2, d_ff=40,
                          vision_d_model=24, vision_n_heads=2, vision_d_ff=28, projection_dim=8, image_size=64)
    for config in (vit, clip):
        d = config_to_hf(config)
        assert config_from_hf(d) == config.replace(name=f"hf-{config.arch}", vocab_size=(
            65 if config.arch == "vit" else config.vocab_size))
    assert hf_family(vit.replace(n_classes=0)) == ("vit", "ViTModel")
    assert hf_family(clip) == ("clip", "CLIPModel")


def test_configs_no_hugging_face_class_holds_are_refused(tmp_path):
    for config, problem in [
        (tformer.preset("vit-tiny-16", n_layers=1, patch_bias=False), "patch_bias"),
        (tformer.preset("vit-tiny-16", n_layers=1, embedding_norm=True), "embedding_norm"),
        (tformer.preset("clip-vit-b-32", n_layers=1, vision_n_layers=1, bias=False), "bias"),
    ]:
        model = tformer.build_model(config, device="meta")
        with pytest.raises(tformer.TformerError, match=problem):
            tformer.save_hf(model, tmp_path / "x")
    assert not (tmp_path / "x").exists()
