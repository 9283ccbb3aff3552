"""ALiBi slopes for any head count equal BLOOM's (transformers), and an ALiBi model reads past the
max_positions it was configured with: nothing in it is a table indexed by position."""

from __future__ import annotations

import pytest
import torch

import tformer
from tformer.core.config import ModelConfig
from tformer.model.position import alibi_slopes

transformers = pytest.importorskip("transformers")
bloom = pytest.importorskip("transformers.models.bloom.modeling_bloom")


@pytest.mark.parametrize("n_heads", range(1, 34))
def test_slopes_equal_bloom_for_every_head_count(n_heads):
    # BLOOM's bias for key j is slope * j (a per-row constant away from ours, -slope * |i - j|).
    bias = bloom.build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), n_heads, torch.float32)
    reference = bias[:, 0, 1]
    ours = alibi_slopes(n_heads)
    assert ours.shape == (n_heads,)
    assert torch.allclose(ours.float(), reference, rtol=1e-6, atol=0), (ours, reference)


def test_non_power_of_two_interleaves_the_next_power_of_two():
    # 6 heads: the 4-head sequence 2^-2, 2^-4, 2^-6, 2^-8, then 8-head slopes 2^-1 and 2^-3 (every other one).
    assert torch.allclose(alibi_slopes(6), torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]))
    assert len(set(alibi_slopes(33).tolist())) == 33  # all distinct


def _alibi_model(max_positions=16):
    config = ModelConfig(arch="decoder", n_layers=2, d_model=30, n_heads=5, d_ff=44, vocab_size=31,
                         max_positions=max_positions, position="alibi")
    torch.manual_seed(0)
    return tformer.build_model(config).eval()


def test_alibi_model_runs_past_its_max_positions():
    model = _alibi_model()
    ids = torch.randint(0, 31, (2, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        long = model(ids).logits
        short = model(ids[:, :16]).logits
    assert long.shape == (2, 64, 31) and torch.isfinite(long).all()
    assert torch.allclose(long[:, :16], short, atol=1e-5)  # causal: the first 16 positions see the same
    assert (long[:, 40] - long[:, 41]).abs().max() > 0  # and later positions are not a copy


def test_alibi_cached_decode_past_max_positions_equals_the_full_forward():
    model = _alibi_model()
    ids = torch.randint(0, 31, (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids).logits[:, -1]
        cache = model.new_cache()
        model(ids[:, :-1], past_key_values=cache)
        step = model(ids[:, -1:], past_key_values=cache).logits[:, -1]
    assert torch.allclose(full, step, atol=1e-5)
