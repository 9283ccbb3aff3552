"""The patch embedding's two forms agree, and bad images or texts stop ViT and CLIP with one clear line."""

from __future__ import annotations

import pytest
import torch

import tformer
from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError

VIT = dict(arch="vit", n_layers=1, d_model=36, n_heads=3, d_ff=52, image_size=12, patch_size=4, n_classes=7)
CLIP = dict(arch="clip", n_layers=1, d_model=36, n_heads=3, d_ff=52, vocab_size=50, max_positions=9, image_size=12,
            patch_size=4, vision_n_layers=1, vision_d_model=40, vision_n_heads=4, vision_d_ff=44, projection_dim=20)


def model(**kw):
    return tformer.build_model(tformer.ModelConfig(**kw)).eval()


@pytest.mark.parametrize("channels,bias,size", [(3, True, (12, 12)), (1, True, (20, 12)), (3, False, (8, 16))])
def test_patch_embedding_conv_equals_unfold_and_matmul(channels, bias, size):
    embed = model(**VIT, num_channels=channels, patch_bias=bias).encoder.patch_embed
    with torch.no_grad():  # the initialised weights (bias and [CLS] moved off zero), outputs of size about 3
        embed.cls_token.normal_()
        if bias:
            embed.proj.bias.normal_(0, 0.1)
    pixels = torch.randn(4, channels, *size)
    conv, unfolded = embed(pixels), embed.unfolded(pixels)
    assert conv.shape == (4, 1 + size[0] * size[1] // 16, 36)
    assert (conv - unfolded).abs().max().item() <= 1e-6


def one_line_error(call, match: str) -> str:
    with pytest.raises(TformerError, match=match) as err:
        call()
    assert "\n" not in str(err.value), str(err.value)
    return str(err.value)


def test_bad_images_are_refused_in_one_line():
    vit, clip = model(**VIT), model(**CLIP, eos_token_id=49)
    ids = torch.tensor([[0, 5, 49]])
    one_line_error(lambda: vit(torch.randn(2, 1, 12, 12)), "1 channels but the model reads 3")
    one_line_error(lambda: clip(ids, torch.randn(1, 4, 12, 12)), "4 channels but the model reads 3")
    one_line_error(lambda: vit(torch.randn(2, 3, 16, 16)), "interpolate_pos_encoding=True")
    one_line_error(lambda: clip(ids, torch.randn(1, 3, 20, 12)), "interpolate_pos_encoding=True")
    one_line_error(lambda: vit(torch.randn(2, 3, 13, 12), interpolate_pos_encoding=True), "not whole 4x4 patches")
    one_line_error(lambda: vit(torch.randn(3, 12, 12)), "batch, channels, height, width")
    one_line_error(lambda: vit(torch.zeros(1, 3, 12, 12, dtype=torch.long)), "floating-point")


def test_clip_text_without_its_end_token_is_refused():
    clip = model(**CLIP, eos_token_id=49)
    pixels = torch.randn(2, 3, 12, 12)
    with torch.no_grad():
        clip(torch.tensor([[0, 5, 49, 1], [0, 49, 1, 1]]), pixels)  # both end: fine
    one_line_error(lambda: clip(torch.tensor([[0, 5, 49, 1], [0, 7, 8, 1]]), pixels), "no end token \\(id 49\\)")
    one_line_error(lambda: clip(torch.tensor([[0, 49], [0, 49], [3, 49]]), pixels, return_loss=True),
                   "3 texts and 2 images")


def test_image_size_the_patches_do_not_divide_is_refused():
    one_line_error(lambda: tformer.ModelConfig(**{**VIT, "image_size": 14}), "does not divide image_size=14")


@pytest.mark.parametrize("size, patch, near", [(8, 3, 2), (224, 15, 14), (224, 33, 32), (8, 9, 8)])
def test_a_patch_that_does_not_divide_names_the_nearest_that_does(size, patch, near):
    with pytest.raises(TformerError, match=rf"patch_size={patch} does not divide image_size={size} .*\(e\.g\. {near}\)"):
        ModelConfig(arch="vit", image_size=size, patch_size=patch)
