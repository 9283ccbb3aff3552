"""The prefix LM's mask (bidirectional over each row's prefix, causal after it) against its definition,
allowed(i, j) iff j < prefix or j <= i, and in use by the decoder: prefix tokens see each other, nothing after
the prefix sees its future, and the fused and reference kinds agree."""

import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.model import build
from tformer.model.attention.reference import reference
from tformer.model.attention.sdpa import sdpa
from tformer.model.masks import build_mask

TINY = dict(arch="decoder", vocab_size=40, d_model=16, n_heads=2, n_layers=2, d_ff=32, max_positions=16)


def _definition(prefix, tq, tk, q_start):
    return torch.tensor([[[[j < p or j <= q_start + i for j in range(tk)] for i in range(tq)]] for p in prefix])


@pytest.mark.parametrize("tq, tk, q_start", [(9, 9, 0), (3, 9, 6), (1, 9, 8)])
def test_allowed_is_the_definition(tq, tk, q_start):
    prefix = torch.tensor([1, 4, 9, 0])
    mask = build_mask(tq, tk, causal=True, prefix=prefix, q_start=q_start)
    want = _definition(prefix.tolist(), tq, tk, q_start)
    if bool(want.all()):  # the last query sees every key anyway: nothing to hide
        assert mask.allowed() is None and mask.bias is None
        return
    assert torch.equal(mask.allowed().expand(4, 1, tq, tk), want)
    assert torch.equal(mask.bias.expand(4, 1, tq, tk) == 0, want)
    assert not mask.is_causal  # the fused kernel's plain causal flag would hide the prefix


def test_prefix_is_ignored_by_a_bidirectional_mask_and_combines_with_padding():
    assert build_mask(5, 5, causal=False, prefix=torch.tensor([2])).allowed() is None
    keep = torch.tensor([[0, 1, 1, 1, 1]])
    allowed = build_mask(5, 5, causal=True, key_padding=keep, prefix=torch.tensor([3])).allowed()
    want = _definition([3], 5, 5, 0) & keep.bool()[:, None, None, :]
    assert torch.equal(allowed, want)


def test_sdpa_and_reference_agree_under_a_prefix_mask():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 2, 7, 8, generator=g) for _ in range(3))
    mask = build_mask(7, 7, causal=True, prefix=torch.tensor([2, 5, 7]))
    torch.testing.assert_close(sdpa(q, k, v, mask, 8 ** -0.5)[0], reference(q, k, v, mask, 8 ** -0.5)[0])


@pytest.mark.parametrize("attn_impl", ["sdpa", "reference"])
def test_decoder_attends_over_the_prefix_and_causally_after(attn_impl):
    torch.manual_seed(0)
    model = build(ModelConfig(**TINY, attn_impl=attn_impl)).eval()
    ids = torch.randint(0, 40, (1, 10))
    p = torch.tensor([4])
    base = model(ids, prefix_length=p).logits
    changed = ids.clone()
    changed[0, 3] = (ids[0, 3] + 1) % 40  # the prefix's last token
    out = model(changed, prefix_length=p).logits
    assert not torch.allclose(out[0, :3], base[0, :3])  # earlier prefix positions see it
    later = ids.clone()
    later[0, 7] = (ids[0, 7] + 1) % 40  # a token after the prefix
    out = model(later, prefix_length=p).logits
    torch.testing.assert_close(out[0, :7], base[0, :7])  # nobody before it sees it
    # No prefix (0) is the plain causal model.
    torch.testing.assert_close(model(ids, prefix_length=torch.tensor([0])).logits, model(ids).logits)
