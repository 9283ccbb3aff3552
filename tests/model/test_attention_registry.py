"""The attention registry: one name list shared with the config, one signature, switching by building anew."""

import math

import pytest
import torch

from tformer.core.attention_kinds import ATTN_KINDS
from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.model import ATTENTION, attention_fn, build, with_attention
from tformer.model.attention import MultiHeadAttention, make_attention
from tformer.cost.attention import ATTENTION_COSTS
from tformer.model.masks import build_mask

ATTN_IMPLS = tuple(ATTENTION)


def test_registry_names_equal_the_config_and_ledger_names_exactly():
    # A kind added to the model but not to core or the ledger (or the other way round) fails here.
    assert tuple(ATTENTION) == tuple(ATTN_KINDS)
    assert set(ATTENTION_COSTS) == set(ATTN_KINDS)


@pytest.mark.parametrize("name", ATTN_IMPLS)
def test_every_kind_has_the_one_signature(name):
    causal = ATTN_KINDS[name].causal
    config = ModelConfig(arch="decoder" if causal else "encoder", n_layers=1, d_model=32, n_heads=4, n_kv_heads=2,
                         d_ff=8, max_positions=16, attn_impl=name, attn_window=2, attn_block=2, attn_features=8,
                         attn_proj=4, lm_head=causal)
    kind = make_attention(config.attention_options(0), 4, 8)
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    out, weights = kind(q, k, v, build_mask(5, 5, causal=causal), 1 / math.sqrt(8), 0.0)
    assert out.shape == (2, 4, 5, 8) and torch.isfinite(out).all()
    assert weights is None or weights.shape == (2, 4, 5, 5)


def test_unknown_kind_is_one_line_naming_the_known_ones():
    with pytest.raises(TformerError) as err:
        attention_fn("flash")
    message = str(err.value)
    assert "\n" not in message and "'flash'" in message and all(name in message for name in ATTN_IMPLS)


def test_unknown_attn_impl_in_the_config_is_one_line_naming_the_known_ones():
    with pytest.raises(TformerError) as err:
        ModelConfig(attn_impl="flash")
    message = str(err.value)
    assert "\n" not in message and "attn_impl='flash'" in message and all(name in message for name in ATTN_IMPLS)
    with pytest.raises(TformerError, match="attn_impl"):
        ModelConfig().replace(attn_impl="sdpa2")


def _kinds(model):
    return {m.attend.fn for m in model.modules() if isinstance(m, MultiHeadAttention)}


@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_with_attention_returns_an_equal_model_and_leaves_the_original_alone(arch):
    config = ModelConfig(arch=arch, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=50,
                         max_positions=32, dropout=0.1, decoder_start_token_id=0 if arch == "encoder-decoder" else None)
    model = build(config).eval()
    model.tok_embed.weight.requires_grad_(False)
    before = {k: v.clone() for k, v in model.state_dict().items()}

    switched = with_attention(model, "reference")

    assert switched is not model and switched.config is not model.config
    assert switched.config.attn_impl == "reference" and switched.config == config.replace(attn_impl="reference")
    assert model.config.attn_impl == "sdpa" and model.config == config
    assert _kinds(model) == {ATTENTION["sdpa"]} and _kinds(switched) == {ATTENTION["reference"]}
    assert not switched.training and not switched.tok_embed.weight.requires_grad
    # Same values, separate storage: training the new model cannot move the old one's weights.
    mine, theirs = switched.state_dict(), model.state_dict()
    assert mine.keys() == theirs.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(theirs[key], value) and torch.equal(mine[key], value)
        assert mine[key].data_ptr() != theirs[key].data_ptr()
    if config.tied_embeddings:
        assert switched.lm_head.weight is switched.tok_embed.weight

    ids = torch.randint(0, 50, (2, 9))
    kwargs = {"decoder_input_ids": ids[:, :5]} if arch == "encoder-decoder" else {}
    with torch.no_grad():
        assert torch.allclose(model(ids, **kwargs).logits, switched(ids, **kwargs).logits, atol=1e-5, rtol=0)
        back = with_attention(switched, "sdpa")
        assert torch.equal(model(ids, **kwargs).logits, back(ids, **kwargs).logits)


def test_with_attention_keeps_dtype_and_training_mode():
    model = build(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32), dtype=torch.float64).train()
    switched = with_attention(model, "reference")
    assert switched.training and all(p.dtype == torch.float64 for p in switched.parameters())


def test_with_attention_unknown_kind_is_the_config_error():
    model = build(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32))
    with pytest.raises(TformerError, match="choose one of: sdpa, reference, tiled"):
        with_attention(model, "flash")
    assert model.config.attn_impl == "sdpa"
