"""Attention rollout by hand (tformer.teach.rollout), the digits ViT it is drawn for, and its pictures."""

import json

import numpy as np
import pytest
import torch

from tformer.cli import main
from tformer.core.errors import TformerError
from tformer.teach import digit_vit
from tformer.teach.pictures import patches_png, rollout_png
from tformer.teach.rollout import cls_map, rollout

PNG = b"\x89PNG\r\n\x1a\n"


def stochastic(b, h, n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(b, h, n, n, generator=g), dim=-1)


def test_identity_attention_rolls_out_to_the_identity():
    eye = torch.eye(5).expand(2, 3, 5, 5)
    r = rollout([eye, eye, eye])
    assert r.shape == (2, 5, 5)
    assert torch.equal(r, torch.eye(5, dtype=torch.float64).expand(2, 5, 5))


def test_one_layer_by_hand():
    # Two heads over two tokens; their mean is [[0.5, 0.5], [0.25, 0.75]].
    a = torch.tensor([[[[1.0, 0.0], [0.5, 0.5]], [[0.0, 1.0], [0.0, 1.0]]]])
    # + I = [[1.5, 0.5], [0.25, 1.75]]; rows sum to 2: halve them.
    expected = torch.tensor([[[0.75, 0.25], [0.125, 0.875]]], dtype=torch.float64)
    assert torch.allclose(rollout([a]), expected, atol=0, rtol=0)
    # Without the residual it is the head mean itself.
    assert torch.equal(rollout([a], residual=False), torch.tensor([[[0.5, 0.5], [0.25, 0.75]]], dtype=torch.float64))


def test_layers_multiply_top_layer_on_the_left():
    a1, a2 = stochastic(1, 2, 4, 1), stochastic(1, 2, 4, 2)
    eye = torch.eye(4, dtype=torch.float64)

    def hat(a):
        m = a.double().mean(1)[0] + eye
        return m / m.sum(-1, keepdim=True)
    assert torch.allclose(rollout([a1, a2])[0], hat(a2) @ hat(a1), atol=1e-15)
    assert not torch.allclose(hat(a2) @ hat(a1), hat(a1) @ hat(a2))  # the order matters here


def test_rows_sum_to_one():
    r = rollout([stochastic(3, 4, 10, s) for s in range(4)])
    assert torch.allclose(r.sum(-1), torch.ones(3, 10, dtype=torch.float64), atol=1e-12)
    assert (r >= 0).all()


def test_cls_map_shapes_square_and_not():
    layers = [stochastic(2, 2, 1 + 6, s) for s in range(2)]  # [CLS] + 2 x 3 patches
    m = cls_map(layers, grid=(2, 3))
    assert m.shape == (2, 2, 3)
    assert torch.equal(m.reshape(2, 6), rollout(layers)[:, 0, 1:])  # row-major: patch t at (t // 3, t % 3)
    assert cls_map(layers, grid=(3, 2)).shape == (2, 3, 2)
    assert cls_map([stochastic(1, 1, 17)]).shape == (1, 4, 4)


@pytest.mark.parametrize("layers, grid, expect", [
    ([], None, "at least one layer"),
    ([None], None, "attn_impl='reference'"),
    ([torch.ones(1, 1, 3, 4)], None, "(B, H, n, n)"),
    ([stochastic(1, 1, 3), stochastic(1, 1, 4)], None, "same shape"),
    ([stochastic(1, 1, 7)], None, "square grid"),
    ([stochastic(1, 1, 7)], (2, 2), "grid 2x2 holds 4"),
])
def test_bad_weights_are_one_line(layers, grid, expect):
    with pytest.raises(TformerError) as err:
        cls_map(layers, grid)
    assert expect in str(err.value) and "\n" not in str(err.value)


def test_patch_tokens_are_the_convolutions_order():
    image = np.arange(2 * 4 * 6, dtype=np.float32).reshape(2, 4, 6)
    tokens = digit_vit.patch_tokens(image, 2)
    assert tokens.shape == (6, 8)
    # Token 5 (0-based 4) is row 1, column 1 of the 2 x 3 grid: channel 0's 2x2 block, then channel 1's.
    assert tokens[4].tolist() == [image[c, r, q] for c in range(2) for r in (2, 3) for q in (2, 3)]
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(2, 5, 2, stride=2)
    out = conv(torch.from_numpy(image)[None]).flatten(2).transpose(1, 2)[0]  # (6, 5), the patch embedding's order
    by_matmul = torch.from_numpy(tokens) @ conv.weight.reshape(5, -1).T + conv.bias
    assert torch.allclose(out, by_matmul, atol=1e-5)


@pytest.fixture(scope="module")
def short_run():
    return digit_vit.train_digit_vit(steps=10, seed=3)


def test_training_is_seeded_and_leaves_the_global_rng(short_run):
    state = torch.random.get_rng_state()
    again = digit_vit.train_digit_vit(steps=10, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert again.accuracy == short_run.accuracy
    for a, b in zip(again.model.parameters(), short_run.model.parameters()):
        assert torch.equal(a, b)
    assert len(short_run.val) == 359 and short_run.config.image_tokens == 17
    untrained = digit_vit.train_digit_vit(steps=0, seed=3)
    assert untrained.steps == 0
    moved = [not torch.equal(a, b) for a, b in zip(untrained.model.parameters(), short_run.model.parameters())]
    assert all(moved)  # every parameter, the [CLS] token and the positions included, was trained


def test_summary_and_pictures(short_run):
    shown = digit_vit.examples(short_run.val)
    assert sorted(short_run.val.labels[shown].tolist()) == [0, 2, 4, 5, 7, 9]
    data = digit_vit.summary(short_run, shown)
    assert data["config"]["tokens"] == 17 and data["steps"] == 10
    grids = np.array([s["rollout"] for s in data["shown"]])
    assert grids.shape == (6, 4, 4) and np.all(grids > 0) and np.all(grids.sum(axis=(1, 2)) < 1)
    preds, maps = digit_vit.predict(short_run.model, short_run.val.images[shown])
    assert np.allclose(maps, grids) and [s["predicted"] for s in data["shown"]] == preds.tolist()
    assert patches_png(short_run.val.images[shown[0]], 2, "a zero").startswith(PNG)
    assert rollout_png(short_run.val.images[shown], maps, [0, 2, 4, 5, 7, 9], preds).startswith(PNG)


def test_negative_steps_are_refused():
    with pytest.raises(TformerError, match="steps must be 0 or more"):
        digit_vit.train_digit_vit(steps=-1)


def test_cli_vit_prints_the_steps_and_saves_the_pictures(tmp_path, capsys):
    assert main(["attention", "--vit", "--steps", "3", "--out", str(tmp_path / "pics")]) == 0
    out = capsys.readouterr().out
    for step in ("Step 1. The image (8x8 pixels", "Step 2. Cut into 2x2 patches: 4 x 4 = 16 patches",
                 "n = HW/P² + 1 = 8·8/2² + 1 = 17 tokens", "trained here for 3 Adam steps",
                 "Step 6. Attention rollout of [CLS]"):
        assert step in out
    for name in ("vit_patches.png", "vit_rollout.png"):
        assert (tmp_path / "pics" / name).read_bytes().startswith(PNG) and str(tmp_path / "pics" / name) in out


def test_cli_vit_json(capsys):
    assert main(["attention", "--vit", "--steps", "0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["steps"] == 0 and data["pictures"] == [] and data["config"]["tokens"] == 17
    assert len(data["pixels"]) == 8 and np.array(data["patch_tokens"]).shape == (16, 4)
    first = data["shown"][0]
    # The [CLS] row over the patches plus its share from itself is the whole row of a stochastic matrix: below 1.
    assert 0 < np.sum(first["rollout"]) < 1


@pytest.mark.parametrize("argv, expect", [
    (["attention"], "--walkthrough` or `tformer attention --vit`"),
    (["attention", "--walkthrough", "--vit"], "one of them"),
    (["attention", "--vit", "--steps", "-2"], "--steps must be a whole number in [0, 1e6]"),
    (["attention", "--vit", "--heads", "2"], "belong to --walkthrough"),
    (["attention", "--walkthrough", "--out", "x"], "go with --vit"),
])
def test_cli_bad_vit_options_are_one_line_exit_2(capsys, argv, expect):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expect in err[0], err
