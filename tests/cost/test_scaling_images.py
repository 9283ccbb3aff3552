"""`tformer scale` for image models: the length knob is the image side, the crossover is in image tokens."""

from __future__ import annotations

import pytest

from tformer.core.config import preset
from tformer.core.errors import TformerError
from tformer.cost.ledger import Workload, ledger
from tformer.cost.scaling import attention_crossover, default_knobs, what_if


def test_image_size_knob_is_the_ledger_of_the_larger_image():
    config = preset("vit-tiny-16", n_layers=2)
    w = Workload(phase="forward", batch=2)
    row = {r["knob"]: r for r in what_if(config, w, 2.0, knobs=("image_size",))["rows"]}["image_size"]
    assert row["values"]["flops"] == ledger(config.replace(image_size=448), w).flops["total"]
    assert row["ratios"]["flops"] > 4  # 4x the patches, and attention grows as their square


def test_vit_crossover_is_the_text_encoders_at_the_same_widths():
    # A ViT layer is a BERT layer: attention overtakes the FFN at the same token count (n = d_ff here).
    assert attention_crossover(preset("vit-base-16")) == attention_crossover(preset("bert-base"))
    x = attention_crossover(preset("vit-tiny-16"))
    assert x["vs_ffn"] == 768 and x["vs_projections"] == 384  # 4 n H dh = 4 d d_ff; = 8 d^2


def test_knobs_follow_the_architecture():
    assert "seq" not in default_knobs(preset("vit-base-16"))
    assert {"seq", "image_size"} <= set(default_knobs(preset("clip-vit-b-32")))
    assert "image_size" not in default_knobs(preset("gpt2"))


@pytest.mark.parametrize("name,knob,factor,message", [
    ("vit-base-16", "seq", 2.0, "use the knob image_size"),
    ("gpt2", "image_size", 2.0, "applies to image models"),
    ("vit-base-16", "image_size", 1.1, "not whole 16-pixel patches"),
])
def test_knobs_that_do_not_apply_are_refused(name, knob, factor, message):
    with pytest.raises(TformerError, match=message):
        what_if(preset(name), Workload(phase="forward"), factor, knobs=(knob,))


def test_doubling_the_layers_of_a_model_with_per_layer_kinds_keeps_their_pattern():
    """Gemma 3's five sliding layers to one global: twice the layers is twice the pattern, not a refused config."""
    from tformer.cost.scaling import scaled_config

    base = preset("gemma3-270m")
    deeper = scaled_config(base, "n_layers", 2.0)
    assert deeper.n_layers == 36 and deeper.layer_types == base.layer_types * 2
    assert scaled_config(base, "n_layers", 0.5).layer_types == base.layer_types[:9]
