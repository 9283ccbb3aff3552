"""Pretraining corruptions on fixed seeds: T5's span corruption (noise density 0.15, mean span 3, exact
reconstruction from input and target) and BART's text infilling (30% masked, Poisson(3) spans) and sentence
permutation."""

import math
from itertools import permutations

import pytest
import torch

from tformer.core.errors import TformerError
from tformer.data.objectives import (
    infill, infill_spans, noise_spans, permute_sentences, span_corrupt, span_counts, span_uncorrupt,
)


def test_span_corruption_noise_density_and_mean_span_over_seeded_draws():
    noise = spans = tokens = 0
    for seed in range(200):
        g = torch.Generator().manual_seed(seed)
        length = 100 + seed  # many lengths, so rounding does not fix the answer
        drawn = noise_spans(length, g)
        assert all(b > a for a, b in drawn) and all(b1 < a2 for (_, b1), (a2, _) in zip(drawn, drawn[1:]))
        assert drawn[0][0] > 0  # T5 starts with a non-noise run
        noise += sum(b - a for a, b in drawn)
        spans += len(drawn)
        tokens += length
    assert abs(noise / tokens - 0.15) < 0.005
    assert abs(noise / spans - 3.0) < 0.1


def test_span_lengths_vary_and_same_seed_same_spans():
    draws = [noise_spans(512, torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert draws[0] == draws[1] and draws[0] != draws[2]
    lengths = [b - a for a, b in draws[0]]
    assert len(set(lengths)) > 3  # random segmentation, not a fixed length of 3


@pytest.mark.parametrize("length", [2, 7, 10, 64, 257])
def test_original_text_is_reconstructed_from_input_and_target(length):
    top, ids = 999, torch.randint(0, 500, (length,), generator=torch.Generator().manual_seed(length))
    for seed in range(20):
        inputs, targets = span_corrupt(ids, top, torch.Generator().manual_seed(seed))
        noise, n_spans = span_counts(length)
        sentinels = [top - k for k in range(n_spans)]
        assert [t for t in inputs.tolist() if t > 500] == sentinels[: len([t for t in inputs.tolist() if t > 500])]
        assert len(targets) - (targets > 500).sum() == noise  # the target holds exactly the noise tokens
        assert torch.equal(span_uncorrupt(inputs, targets, top, n_spans), ids)


def test_span_corruption_refuses_a_one_token_row():
    with pytest.raises(TformerError, match="at least 2 tokens"):
        span_counts(1)


def test_infilling_masks_30_percent_in_poisson_3_spans():
    lengths, masked, total = [], 0, 0
    for seed in range(300):
        g = torch.Generator().manual_seed(seed)
        spans = infill_spans(200, g)
        lengths += [b - a for a, b in spans]
        masked += sum(b - a for a, b in spans)
        total += 200
        assert all(a2 >= b1 for (_, b1), (a2, _) in zip(spans, spans[1:]))  # in order, not overlapping
    assert masked / total == pytest.approx(0.3, abs=0.005)
    # The last span of each row is clipped to reach exactly 30%, so the mean is a little under lambda = 3.
    assert 2.6 < sum(lengths) / len(lengths) < 3.1
    zero = lengths.count(0) / len(lengths)
    assert abs(zero - math.exp(-3)) < 0.03  # Poisson(3) gives a zero-length span (an inserted mask) 5% of the time


def test_each_span_becomes_one_mask_token():
    ids, mask = torch.arange(100), -7
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    spans = infill_spans(100, g1)
    out = infill(ids, mask, g2)
    assert (out == mask).sum() == len(spans)
    assert len(out) == 100 - sum(b - a for a, b in spans) + len(spans)
    kept = out[out != mask]
    assert torch.equal(kept, torch.tensor([i for i in range(100) if not any(a <= i < b for a, b in spans)]))


def test_sentence_permutation_shuffles_whole_sentences():
    end = 0
    ids = torch.tensor([5, 6, end, 7, end, 8, 9, 10, end, 11, 12])  # the last sentence is unterminated
    sentences = [[5, 6, end], [7, end], [8, 9, 10, end], [11, 12]]
    arrangements = {tuple(sum((sentences[i] for i in order), [])): order for order in permutations(range(4))}
    seen = set()
    for seed in range(30):
        out = tuple(permute_sentences(ids, end, torch.Generator().manual_seed(seed)).tolist())
        assert out in arrangements  # whole sentences, each once
        seen.add(out)
    assert len(seen) > 5
    assert torch.equal(permute_sentences(ids, None, torch.Generator()), ids)
