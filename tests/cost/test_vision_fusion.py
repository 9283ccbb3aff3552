"""Image models in the ledger, torch-free: CLIP's N x N logits and activations against the batch, the
image-size table, and the three fusion modes against hand counts and the ledgers of the equivalent models."""

from __future__ import annotations

import pytest

from tformer.core.config import ModelConfig, preset
from tformer.core.errors import TformerError
from tformer.cost.fusion import clip_pair, cross_fusion, early_fusion, fusion_costs, late_fusion, text_tower, towers
from tformer.cost.ledger import Workload, ledger
from tformer.cost.vision import image_size_table, logits_bytes, token_formula

# A tiny pair: a 4x4 RGB image in 2x2 patches (n_image = 5), an encoder of width 8 over n_text tokens.
VISION = ModelConfig(arch="vit", n_layers=1, d_model=6, n_heads=2, d_ff=10, image_size=4, patch_size=2, num_channels=3)
TEXT = ModelConfig(arch="encoder", n_layers=2, d_model=8, n_heads=2, d_ff=12, vocab_size=11, max_positions=16,
                   lm_head=False, position="learned")


def _layer_matmul(rows, n, d, f, batch):
    """One block's forward matmul FLOPs over ``rows`` query rows of ``n`` keys: q, k, v, o, QK^T, AV, up, down."""
    return batch * (4 * 2 * rows * d * d + 2 * 2 * rows * n * d + 2 * 2 * rows * d * f)


@pytest.mark.parametrize("dtype,a", [("fp32", 4), ("bf16", 2)])
def test_clip_logits_are_n_squared_and_activations_quadratic_in_the_batch(dtype, a):
    c = preset("clip-vit-b-32").replace(n_layers=1, vision_n_layers=1)
    acts = []
    for n in range(1, 6):
        lg = ledger(c, phase="train", batch=n, seq=7, dtype=dtype)
        assert lg.memory["logits"] == logits_bytes(lg) == n * n * a
        acts.append(lg.memory["activations"])
    second = [acts[i + 1] - 2 * acts[i] + acts[i - 1] for i in range(1, 4)]
    # The N^2 part: the scaled logits kept (a bytes) and both losses' fp32 log-probabilities (4 bytes each).
    assert second == [2 * (a + 2 * 4)] * 3
    vit = [ledger(preset("vit-tiny-32"), phase="train", batch=n).memory["activations"] for n in (1, 2, 3)]
    assert vit[2] - 2 * vit[1] + vit[0] == 0  # a classifier's batch is linear


def test_image_size_table_attention_grows_as_n_squared_the_rest_as_n():
    c = preset("vit-base-16")
    t = image_size_table(c, Workload(), [224, 384], [16, 32, 48])
    assert [(r["image_size"], r["patch_size"], r["tokens"]) for r in t["rows"]] == \
        [(224, 16, 197), (224, 32, 50), (384, 16, 577), (384, 32, 145), (384, 48, 65)]
    assert t["skipped"] == ["224/48"]
    for r in t["rows"]:
        assert r["attention_ratio"] == pytest.approx(r["tokens_squared_ratio"])  # 12 layers x 4 n^2 d
    assert t["rows"][2]["other_ratio"] == pytest.approx(577 / 197, rel=1e-4)
    assert token_formula(c) == "n = HW/P^2 + 1 = 224·224/16^2 + 1 = 197"
    with pytest.raises(TformerError, match="reads no images"):
        image_size_table(preset("gpt2"), Workload(), [224])
    with pytest.raises(TformerError, match="divides"):
        image_size_table(c, Workload(), [100], [16])


def test_late_fusion_of_clips_towers_is_clips_own_ledger():
    c = preset("clip-vit-b-32")
    w = Workload(batch=3, seq=9)
    late = late_fusion(*towers(c), w)
    own = ledger(c, phase="train", batch=3, seq=9).select(phase="forward")
    assert [(o.name, o.matmul_flops, o.params, o.saved_bytes) for o in late.ledger.ops] == \
        [(o.name, o.matmul_flops, o.params, o.saved_bytes) for o in own]
    # CLIP's text tower is causal: one element-wise FLOP a masked score more than the encoder it is costed as.
    masks = 3 * c.n_heads * 9 * 9 * c.n_layers
    assert sum(o.other_flops for o in own) - late.ledger.flops["other"] == masks
    assert text_tower(c).d_model == 512 and late.ledger.params["total"] == ledger(c, seq=9).params["total"]


def test_early_fusion_by_hand_and_as_the_vit_over_all_tokens():
    n_t, B = 5, 2
    f = early_fusion(VISION, TEXT, Workload(batch=B, seq=n_t))
    n = 5 + n_t
    d, ff = TEXT.d_model, TEXT.d_ff
    patches = B * 2 * 4 * (3 * 2 * 2) * d
    assert f.ledger.flops["matmul"] == patches + 2 * _layer_matmul(n, n, d, ff, B)
    assert f.score_all_flops == B * B * early_fusion(VISION, TEXT, Workload(batch=1, seq=n_t)).ledger.flops["total"]
    # The same layers as a ViT of the text's sizes over an image of 10 tokens (6x6 in 2x2 patches: 9 + [CLS]).
    vit = ModelConfig(arch="vit", n_layers=2, d_model=d, n_heads=2, d_ff=ff, image_size=6, patch_size=2,
                      num_channels=3)
    layers = ("qkv_proj", "scores", "context", "out_proj", "ffn_up", "ffn_down")
    assert sum(o.matmul_flops for o in f.ledger.select(kind=layers)) == \
        sum(o.matmul_flops for o in ledger(vit, batch=B).select(kind=layers))
    assert f.ledger.params["total"] == ledger(TEXT.replace(max_positions=16), seq=n).params["total"] + \
        (3 * 2 * 2 * d + d) + d  # the patch projection (bias) and [CLS]


@pytest.mark.parametrize("every", [1, 2])
def test_cross_fusion_by_hand(every):
    n_t, B = 3, 2
    f = cross_fusion(VISION, TEXT, Workload(batch=B, seq=n_t), every)
    d, dv, n_i = TEXT.d_model, VISION.d_model, 5
    vision = ledger(VISION, batch=B).flops["matmul"]
    text = ledger(TEXT, batch=B, seq=n_t).flops["matmul"]
    connector = 2 * B * n_i * dv * d
    # q and o over the text rows, k and v over the image rows, n_t x n_i scores and context: layers 0 (and 1)
    cross = B * (2 * 2 * n_t * d * d + 2 * 2 * n_i * d * d + 2 * 2 * n_t * n_i * d)
    crossed = len(range(0, TEXT.n_layers, every))
    assert f.ledger.flops["matmul"] == vision + connector + text + crossed * cross
    assert len([o for o in f.ledger.ops if o.name.endswith("cross_attn.q_proj")]) == crossed
    with pytest.raises(TformerError, match="k of at least 1"):
        cross_fusion(VISION, TEXT, Workload(), 0)


def test_late_fusion_by_hand_and_the_modes_together():
    n_t, B, p = 4, 3, 8
    f = late_fusion(VISION, TEXT, Workload(batch=B, seq=n_t))
    heads = 2 * B * (VISION.d_model + TEXT.d_model) * p + 2 * B * B * p
    assert f.ledger.flops["matmul"] == ledger(VISION, batch=B).flops["matmul"] + \
        ledger(TEXT, batch=B, seq=n_t).flops["matmul"] + heads
    # Both towers, the two projections (no bias) and the temperature (the ViT has a final norm: no pool norm).
    assert f.ledger.params["total"] == ledger(VISION).params["total"] + ledger(TEXT, seq=n_t).params["total"] + \
        (VISION.d_model + TEXT.d_model) * p + 1
    assert clip_pair(VISION, TEXT).projection_dim == p
    modes = fusion_costs(VISION, TEXT, Workload(batch=B, seq=n_t))
    assert [m.mode for m in modes] == ["early", "late", "cross"]
    for m in modes:
        d = m.to_dict()
        assert 0 < d["attention_share"] < 1 and d["memory"] > d["activations"] > 0
    with pytest.raises(TformerError, match="must be a ViT"):
        late_fusion(TEXT, TEXT, Workload())
