"""q, k, v (and a gated MLP's gate and up) as one block-kernel product (tformer.model.stacked_products): bit for bit
what each Linear computes alone, and used only while it still stands for the Linears the module holds."""

from __future__ import annotations

import pytest
import torch

from tformer.adapt.quantize import quantize_model
from tformer.core.config import ModelConfig
from tformer.generate import generate
from tformer.model import build, ggml_kernel, runner_for
from tformer.model.block_quantized import Q4_1Linear, Q8_0Linear
from tformer.model.path_choice import choose_paths
from tformer.model.quantized import use_path
from tformer.model.stacked_products import stack_linears

pytestmark = pytest.mark.skipif(not ggml_kernel.available(), reason="the block kernel is not built here")


def _model(layout="q4_1", **kw):
    fields = dict(arch="decoder", vocab_size=64, d_model=64, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=96,
                  max_positions=32, position="rope", norm="rmsnorm", mlp="swiglu", bias=False)
    torch.manual_seed(0)
    model = quantize_model(build(ModelConfig.from_dict({**fields, **kw})).eval(), layout)
    use_path(model, "blocks")
    choose_paths(model)
    return model


def _stacked(model):
    return [m for m in model.modules() if getattr(m, "_stacked", None) is not None]


def _unstack(model):
    for m in model.modules():
        if hasattr(m, "_stacked"):
            m._stacked = None


def _logits_and_steps(model, ids):
    """Prefill logits of a padded batch, then three decode steps' logits."""
    runner = runner_for(model)
    cache = runner.new_cache(ids.shape[0], 16)
    mask = torch.ones_like(ids)
    mask[1, :2] = 0
    with torch.no_grad():
        out = [runner.prefill(cache, ids, mask)]
        for _ in range(3):
            out.append(runner.step(cache, out[-1].argmax(-1)))
    return out


@pytest.mark.parametrize("layout,kw", [("q4_1", {}), ("q8_0", {}), ("q4_1", {"qkv_bias": True})])
def test_one_product_is_bit_for_bit_the_separate_products(layout, kw):
    model = _model(layout, **kw)
    stacked = _stacked(model)
    assert len(stacked) == 4  # each layer's attention and MLP
    for module in stacked:  # the weights are held once: each Linear's repacked copy is its rows of the stack
        base = module._stacked.blocks.untyped_storage().data_ptr()
        assert all(m.repacked.untyped_storage().data_ptr() == base for m in module._stacked.linears)
    ids = torch.randint(0, 64, (2, 6))
    together = _logits_and_steps(model, ids)
    _unstack(model)
    alone = _logits_and_steps(model, ids)
    assert all(torch.equal(a, b) for a, b in zip(together, alone))


def test_generate_decodes_the_same_tokens_stacked_or_not():
    model = _model()
    stacked = generate(model, [[1, 2, 3], [4, 5]], max_new_tokens=8, stop_tokens=[]).sequences
    _unstack(model)
    with pytest.MonkeyPatch.context() as patch:  # generate chooses the paths again: keep them unstacked
        patch.setattr("tformer.model.attention.multihead.MultiHeadAttention.stack_products", lambda self: None)
        patch.setattr("tformer.model.feedforward.FeedForward.stack_products", lambda self: None)
        alone = generate(model, [[1, 2, 3], [4, 5]], max_new_tokens=8, stop_tokens=[]).sequences
    assert stacked == alone


def test_choosing_the_paths_again_keeps_a_stack_that_still_stands_and_renews_a_stale_one():
    model = _model()
    attn = model.decoder.layers[0].attn
    before = attn._stacked
    choose_paths(model)  # as every generate() does
    assert attn._stacked is before
    attn.q_proj.load_state_dict(Q4_1Linear.from_float(torch.randn(64, 64)).state_dict())
    choose_paths(model)
    assert attn._stacked is not before and attn._stacked.stands_for((attn.q_proj, attn.k_proj, attn.v_proj))


def test_a_stack_that_no_longer_stands_for_its_linears_is_not_used():
    model = _model()
    attn = model.decoder.layers[0].attn
    ids = torch.randint(0, 64, (1, 5))
    # new weights loaded in place: the stack is stale, the Linears run alone on their new weights
    fresh = _model()
    with torch.no_grad():
        torch.manual_seed(1)
        new_q = Q4_1Linear.from_float(torch.randn(attn.q_proj.out_features, attn.q_proj.in_features))
    attn.q_proj.load_state_dict(new_q.state_dict())
    fresh.decoder.layers[0].attn.q_proj.load_state_dict(new_q.state_dict())
    _unstack(fresh)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, fresh(ids).logits)
    # a Linear swapped for another module (an adapter's wrapper) or moved to another path: not used either
    assert not attn._stacked.stands_for((new_q, attn.k_proj, attn.v_proj))
    use_path(model, "reference")
    assert not attn._stacked.stands_for((attn.q_proj, attn.k_proj, attn.v_proj))


def test_only_linears_that_can_be_one_product_are_stacked():
    def blocks(cls, out):
        m = cls.from_float(torch.randn(out, 64))
        m.path = "blocks"
        return m

    assert stack_linears([blocks(Q4_1Linear, 32), blocks(Q4_1Linear, 16)]) is not None
    assert stack_linears([blocks(Q4_1Linear, 32), blocks(Q8_0Linear, 16)]) is None  # two formats
    reference = Q4_1Linear.from_float(torch.randn(16, 64))
    assert stack_linears([blocks(Q4_1Linear, 32), reference]) is None  # one is not on the kernel
    assert stack_linears([blocks(Q4_1Linear, 32), torch.nn.Linear(64, 16)]) is None


def test_the_ledger_stacks_what_the_model_stacks():
    from tformer.core.quant_formats import KEPT_BLOCKS, REPACKED_BLOCKS
    from tformer.cost.ledger import Workload, ledger

    assert set(REPACKED_BLOCKS) == {f.lower() for f in ggml_kernel.PACKED} & set(KEPT_BLOCKS)
    model = _model("q4_1", qkv_bias=True)
    ops = {op.name: op for op in ledger(model.config, Workload(phase="decode", batch=1, seq=5, context=4)).ops}
    names = {m: n for n, m in model.named_modules()}
    stacks = _stacked(model)
    assert len(stacks) == 4  # each layer's attention and MLP
    for module in stacks:
        stack = module._stacked
        biases = 0 if stack.bias is None else stack.bias.numel() * stack.bias.element_size()
        for linear in stack.linears:  # each member carries the one call's weights
            assert ops[names[linear]].stack_bytes == stack.blocks.numel() + biases, names[module]
    stacked_ops = {name for name, op in ops.items() if op.stack_bytes}
    assert stacked_ops == {names[m] for s in stacks for m in s._stacked.linears}  # and nothing else
