"""Pruning: magnitude pruning zeroes the smallest weights (global or per matrix, heads and embeddings left alone);
structured pruning removes heads and FFN neurons so that the smaller model equals the original with them masked,
and the ledger counts the new config's parameters and FLOPs exactly."""

from __future__ import annotations

import pytest
import torch

from tformer.adapt.prune import importance, magnitude_prune, prune_structured, prune_targets
from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.cost.ledger import Workload, ledger
from tformer.measure.flops import FlopCounter
from tformer.model import build
from tformer.model.attention import MultiHeadAttention
from tformer.model.feedforward import FeedForward
from tformer.model.runner_base import Batch

ARCHS = ["decoder", "encoder", "encoder-decoder"]


def _model(arch="decoder", **kw):
    fields = dict(arch=arch, n_layers=2, d_model=32, n_heads=4, d_ff=48, vocab_size=40, max_positions=32,
                  decoder_start_token_id=0, pad_token_id=0, lm_head=True if arch == "encoder" else None)
    fields.update(kw)
    config = ModelConfig(**{k: v for k, v in fields.items() if v is not None})
    torch.manual_seed(0)
    return build(config).eval()


def _inputs(model):
    ids = torch.randint(1, 40, (2, 9), generator=torch.Generator().manual_seed(1))
    if model.config.arch == "encoder-decoder":
        return {"input_ids": ids, "decoder_input_ids": ids[:, :7]}
    return {"input_ids": ids}


def _logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


def test_magnitude_prune_global_and_per_layer():
    model = _model(tied_embeddings=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    pruned, achieved = magnitude_prune(model, 0.5)
    assert achieved["total"] == pytest.approx(0.5, abs=1e-3)
    targets = prune_targets(pruned)
    assert targets and all(".layers." in name for name in targets)
    kept = torch.cat([w[w != 0].abs() for w in targets.values()])
    zeroed = torch.cat([before[f"{n}.weight"][w == 0].abs() for n, w in targets.items()])
    assert kept.min() >= zeroed.max()  # the smallest magnitudes went, over all matrices together
    assert torch.equal(pruned.lm_head.weight, model.lm_head.weight) and torch.equal(pruned.tok_embed.weight,
                                                                                   model.tok_embed.weight)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the original is unchanged
    per, achieved = magnitude_prune(model, 0.3, per_layer=True)
    assert all(abs(s - 0.3) < 0.01 for s in achieved.values())
    both, achieved = magnitude_prune(model, 0.3, heads=True, embeddings=True)
    assert "lm_head" in achieved and "tok_embed" in achieved
    assert magnitude_prune(model, 0.0)[1]["total"] == 0.0


@pytest.mark.parametrize("bad", [1.0, -0.1, 1.5, "half"])
def test_bad_sparsity_is_one_line(bad):
    with pytest.raises(TformerError, match="sparsity must be a fraction in"):
        magnitude_prune(_model(), bad)


@pytest.mark.parametrize("arch", ARCHS)
def test_pruning_nothing_is_the_identity(arch):
    model = _model(arch)
    same = prune_structured(model, heads=0, ffn=0.0)
    assert torch.equal(_logits(same, _inputs(model)), _logits(model, _inputs(model)))
    assert same.config.n_heads == 4 and same.config.d_ff == 48


def _mask(model, heads: dict, neurons: dict):
    """Forward pre-hooks zeroing the given heads' outputs (o_proj's input columns) and neurons (down's inputs)."""
    hooks = []
    for name, module in model.named_modules():
        if isinstance(module, MultiHeadAttention) and name in heads:
            cols = torch.cat([torch.arange(h * module.head_dim, (h + 1) * module.head_dim) for h in heads[name]])
            target = module.o_proj
        elif isinstance(module, FeedForward) and name in neurons:
            cols, target = torch.tensor(neurons[name]), module.down
        else:
            continue

        def zero(_m, args, cols=cols):
            x = args[0].clone()
            x[..., cols] = 0
            return (x,)

        hooks.append(target.register_forward_pre_hook(zero))
    return hooks


@pytest.mark.parametrize("arch", ARCHS)
def test_removing_heads_and_neurons_equals_masking_them(arch):
    model = _model(arch)
    inputs = _inputs(model)
    # Chosen scores: a different head and different neurons per module, so each layer's own choice is exercised.
    scores, heads, neurons = {}, {}, {}
    for i, (name, module) in enumerate(model.named_modules()):
        if isinstance(module, MultiHeadAttention):
            scores[name] = torch.ones(4)
            scores[name][i % 4] = 0.0
            heads[name] = [i % 4]
        elif isinstance(module, FeedForward):
            scores[name] = torch.arange(48.0).roll(i)
            neurons[name] = scores[name].argsort()[:12].tolist()
    pruned = prune_structured(model, heads=1, ffn=0.25, scores=scores)
    assert (pruned.config.n_heads, pruned.config.head_dim, pruned.config.d_ff, pruned.config.d_model) == (3, 8, 36, 32)
    hooks = _mask(model, heads, neurons)
    try:
        masked = _logits(model, inputs)
    finally:
        for hook in hooks:
            hook.remove()
    torch.testing.assert_close(_logits(pruned, inputs), masked, atol=1e-5, rtol=0)
    assert not torch.allclose(masked, _logits(model, inputs), atol=1e-3)  # the masking did change something


def test_grouped_query_attention_loses_whole_groups():
    model = _model(n_heads=4, n_kv_heads=2, gated_mlp=True, activation="silu")
    scores = {name: torch.tensor([1.0, 1.0, 0.1, 0.1]) for name, m in model.named_modules()
              if isinstance(m, MultiHeadAttention)}
    pruned = prune_structured(model, heads=2, scores=scores)
    assert (pruned.config.n_heads, pruned.config.n_kv_heads) == (2, 1)
    hooks = _mask(model, dict.fromkeys(scores, [2, 3]), {})
    try:
        masked = _logits(model, _inputs(model))
    finally:
        for hook in hooks:
            hook.remove()
    torch.testing.assert_close(_logits(pruned, _inputs(model)), masked, atol=1e-5, rtol=0)
    with pytest.raises(TformerError, match="multiple of 2"):
        prune_structured(model, heads=1)
    prune_structured(model, ffn=0.5)  # gated FFN: up, gate and down all lose the neurons


@pytest.mark.parametrize("arch", ARCHS)
def test_ledger_counts_the_pruned_model(arch):
    model = _model(arch)
    pruned = prune_structured(model, heads=2, ffn=0.5)
    inputs = _inputs(model)
    work = Workload(phase="forward", batch=2, seq=9, seq_decoder=7 if arch == "encoder-decoder" else None)
    new, old = ledger(pruned.config, work), ledger(model.config, work)
    assert new.params["total"] == sum(p.numel() for p in pruned.parameters())
    with torch.no_grad(), FlopCounter() as fc:
        pruned(**inputs)
    assert new.flops["matmul"] == fc.get_total_flops()
    # Each removed head: q, k, v rows (d x D + D bias each) and o_proj's columns (d x D); each neuron: up's row
    # (d + 1) and down's column (d). Every attention module (cross too) and every FFN loses them.
    d, D = 32, 8
    n_attn = sum(isinstance(m, MultiHeadAttention) for m in model.modules())
    n_ffn = sum(isinstance(m, FeedForward) for m in model.modules())
    saved = n_attn * 2 * (4 * d * D + 3 * D) + n_ffn * 24 * (2 * d + 1)
    assert old.params["total"] - new.params["total"] == saved
    assert new.flops["matmul"] < old.flops["matmul"]


def test_gradient_importance_finds_a_dead_head():
    model = _model()
    with torch.no_grad():
        model.decoder.layers[0].attn.o_proj.weight[:, 8:16] = 0  # head 1 of layer 0 writes nothing
    ids = torch.randint(0, 40, (4, 10), generator=torch.Generator().manual_seed(3))
    batches = [Batch({"input_ids": ids[:, :-1]}, ids[:, 1:])]
    scores = importance(model, "gradient", batches)
    first = scores["decoder.layers.0.attn"]
    assert first.shape == (4,) and first[1] == 0 and (first[[0, 2, 3]] > 0).all()
    assert scores["decoder.layers.1.mlp"].shape == (48,)
    assert not any(p.grad is not None for p in model.parameters())
    assert importance(model)["decoder.layers.0.attn"][1] == 0  # the weight norms see it too
    pruned = prune_structured(model, heads=1, method="gradient", batches=batches)
    assert pruned.config.n_heads == 3


@pytest.mark.parametrize("kwargs, text", [
    ({"heads": 4}, "leaves none"), ({"ffn": 1.0}, r"in \[0, 1\)"), ({"heads": -1}, "at least 0"),
    ({"heads": 1, "method": "gradient"}, "needs a few batches"), ({"heads": 1, "method": "taylor"}, "unknown"),
])
def test_bad_structured_inputs_are_one_line(kwargs, text):
    with pytest.raises(TformerError, match=text):
        prune_structured(_model(), **kwargs)


def test_unprunable_models_are_refused():
    with pytest.raises(TformerError, match="arch 'rnn'"):
        prune_structured(build(ModelConfig(arch="rnn", n_layers=2, d_model=16, vocab_size=20)), heads=1)
    with pytest.raises(TformerError, match="alibi"):
        prune_structured(_model(position="alibi"), heads=1)
    prune_structured(_model(position="alibi"), ffn=0.5)  # neurons carry no per-head position bias
    with pytest.raises(TformerError, match="sparse or approximate"):
        prune_structured(_model(attn_impl="linear"), heads=1)
    assert prune_structured(_model(attn_impl="tiled"), heads=1).config.n_heads == 3  # exact kinds prune
