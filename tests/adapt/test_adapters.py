"""Bottleneck adapters: the base model's output at initialisation (up is zero), the trainable count of the formula,
the base names kept, and a gradient that reaches the adapters and not the body."""

from __future__ import annotations

import copy

import torch

from tformer.adapt.adapters import BottleneckAdapter
from tformer.adapt.peft import apply_peft, trainable_parameters
from tformer.core.config import ModelConfig
from tformer.core.peft import PeftSpec
from tformer.model import build

CONFIG = ModelConfig(arch="decoder", vocab_size=37, d_model=15, n_heads=3, n_layers=3, d_ff=26, max_positions=40,
                     task="sequence-classification", n_classes=2)


def test_identity_at_init_and_count():
    model = build(CONFIG).eval()
    ids = torch.randint(0, 37, (2, 9))
    with torch.no_grad():
        before = model(ids).logits
    names = set(model.state_dict())
    apply_peft(model, PeftSpec("adapter", bottleneck=4))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, before)
    d, b, L, head = 15, 4, 3, 15 * 2
    assert trainable_parameters(model) == L * 2 * (2 * d * b + b + d) + head
    assert names <= set(model.state_dict())
    assert "decoder.layers.2.mlp.down.adapter.up.weight" in model.state_dict()


def test_trained_adapter_changes_output_and_only_adapters_get_gradients():
    model = build(CONFIG)
    apply_peft(model, PeftSpec("adapter", bottleneck=4))
    adapter = model.decoder.layers[0].attn.o_proj.adapter
    assert isinstance(adapter, BottleneckAdapter)
    with torch.no_grad():
        adapter.up.weight.normal_()
    ids = torch.randint(0, 37, (2, 9))
    model(ids, labels=torch.tensor([0, 1])).loss.backward()
    assert adapter.down.weight.grad.abs().sum() > 0
    assert model.decoder.layers[0].attn.q_proj.weight.grad is None
    twin = copy.deepcopy(model)  # the hook is a bound method: the copy runs its own adapter
    with torch.no_grad():
        twin.decoder.layers[0].attn.o_proj.adapter.up.weight.zero_()
        assert not torch.equal(twin.eval()(ids).logits, model.eval()(ids).logits)
