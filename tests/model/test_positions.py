"""Positional encodings against their papers' definitions, computed independently here."""

import math

import torch

from tformer.model.position import alibi_slopes, apply_rope, relative_position_bucket, rope_cos_sin, sinusoidal_table


def test_sinusoidal_table_is_the_2017_formula():
    table = sinusoidal_table(50, 16)
    for pos in (0, 1, 7, 49):
        for i in range(8):
            angle = pos / 10000 ** (2 * i / 16)
            assert math.isclose(table[pos, 2 * i].item(), math.sin(angle), abs_tol=1e-5)
            assert math.isclose(table[pos, 2 * i + 1].item(), math.cos(angle), abs_tol=1e-5)


def test_alibi_slopes_are_the_geometric_sequence_from_the_paper():
    # For 8 heads the paper lists 1/2, 1/4, ..., 1/256.
    assert torch.allclose(alibi_slopes(8), torch.tensor([2.0 ** -(i + 1) for i in range(8)]))
    # Non-power-of-two head counts: the 8 slopes, then every other slope of the 16-head sequence.
    assert torch.allclose(alibi_slopes(12)[8:], torch.tensor([2.0 ** -(0.5 + i) for i in range(4)]))


def test_rope_scores_depend_only_on_relative_position():
    d = 8
    q, k = torch.randn(1, 1, 1, d), torch.randn(1, 1, 1, d)

    def score(pq, pk):
        cq, sq = rope_cos_sin(torch.tensor([[pq]]), d, 10000.0, torch.float32)
        ck, sk = rope_cos_sin(torch.tensor([[pk]]), d, 10000.0, torch.float32)
        return (apply_rope(q, cq, sq) * apply_rope(k, ck, sk)).sum().item()

    assert math.isclose(score(5, 2), score(13, 10), rel_tol=1e-5, abs_tol=1e-5)
    assert not math.isclose(score(5, 2), score(5, 4), rel_tol=1e-3)


def test_rope_preserves_vector_length():
    x = torch.randn(2, 3, 6, 16)
    cos, sin = rope_cos_sin(torch.arange(6)[None].expand(2, 6), 16, 10000.0, torch.float32)
    assert torch.allclose(apply_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1), atol=1e-5)


def test_t5_buckets_exact_near_and_logarithmic_far():
    rel = torch.arange(-200, 201)
    causal = relative_position_bucket(rel, bidirectional=False, num_buckets=32, max_distance=128)
    # Keys after the query are invisible to a causal stack: all map to bucket 0 like distance 0.
    assert (causal[rel >= 0] == 0).all()
    # Distances below num_buckets/2 get their own bucket.
    assert causal[rel == -5].item() == 5 and causal[rel == -15].item() == 15
    # Far distances share buckets, saturating at the last one.
    assert causal[rel == -128].item() == 31 and causal[rel == -200].item() == 31
    assert (causal.diff()[: 200] <= 0).all()  # monotone in distance
    both = relative_position_bucket(rel, bidirectional=True, num_buckets=32, max_distance=128)
    assert both[rel == 3].item() == 16 + 3 and both[rel == -3].item() == 3
    assert both.max().item() == 31
