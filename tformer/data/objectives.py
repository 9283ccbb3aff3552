"""Pretraining corruptions beyond BERT's masking: T5's span corruption, BART's text infilling and
sentence permutation. Each takes one row of token ids (1-D long tensor) and a torch.Generator, so a
seed fixes every draw and a sampler's state makes resume exact.

Span corruption (Raffel et al. 2019, section 3.1.4; T5's ``random_spans_noise_mask``): of L tokens,
round(0.15 L) are noise, in round(noise / 3) spans; noise and non-noise lengths are each a random
composition into that many positive parts, interleaved starting with non-noise. The input keeps the
non-noise tokens with each noise span replaced by one sentinel; the target is each sentinel followed
by the span it stands for. Sentinel k (k = 0, 1, ...) is the id ``top - k``: the vocabulary's highest
ids, as T5's <extra_id_0> = vocab_size - 1.

Text infilling (Lewis et al. 2019, section 2.2): span lengths drawn from Poisson(lambda = 3) until
30% of the tokens are covered; each span becomes ONE mask token, a zero-length span inserts one.
Sentence permutation: split on a sentence-end token and shuffle the sentences. BART's target is the
original text.
"""

from __future__ import annotations

import torch

from tformer.core.objectives import MEAN_SPAN, NOISE_DENSITY, span_counts

INFILL_FRACTION = 0.3
POISSON_LAMBDA = 3.0


def _composition(total: int, parts: int, generator: torch.Generator) -> torch.Tensor:
    """``total`` split into ``parts`` positive integers, uniformly over all such splits: (parts,) long."""
    cuts = torch.randperm(total - 1, generator=generator)[: parts - 1].sort().values + 1
    edges = torch.cat([torch.zeros(1, dtype=torch.long), cuts, torch.tensor([total])])
    return edges.diff()


def noise_spans(length: int, generator: torch.Generator, noise_density: float = NOISE_DENSITY,
                mean_span: float = MEAN_SPAN) -> list[tuple[int, int]]:
    """The noise spans of a row, as (start, end) pairs in order; T5's draw."""
    noise, spans = span_counts(length, noise_density, mean_span)
    spans = min(spans, length - noise)  # every span needs a non-noise token before it
    noise_len = _composition(noise, spans, generator).tolist()
    keep_len = _composition(length - noise, spans, generator).tolist()
    out, at = [], 0
    for keep, span in zip(keep_len, noise_len):
        at += keep
        out.append((at, at + span))
        at += span
    return out


def span_corrupt(ids: torch.Tensor, sentinel_top: int, generator: torch.Generator, noise_density: float = NOISE_DENSITY,
                 mean_span: float = MEAN_SPAN) -> tuple[torch.Tensor, torch.Tensor]:
    """(input, target) of one row (1-D): input = ids with span k replaced by sentinel ``sentinel_top - k``;
    target = sentinel 0, span 0, sentinel 1, span 1, ..."""
    spans = noise_spans(len(ids), generator, noise_density, mean_span)
    pieces_in, pieces_out, at = [], [], 0
    for k, (start, end) in enumerate(spans):
        sentinel = ids.new_tensor([sentinel_top - k])
        pieces_in += [ids[at:start], sentinel]
        pieces_out += [sentinel, ids[start:end]]
        at = end
    pieces_in.append(ids[at:])
    return torch.cat(pieces_in), torch.cat(pieces_out)


def span_uncorrupt(inputs: torch.Tensor, targets: torch.Tensor, sentinel_top: int, n_sentinels: int) -> torch.Tensor:
    """The original row from span_corrupt's (input, target): each sentinel in the input replaced by what
    follows the same sentinel in the target."""
    is_sentinel = lambda t: sentinel_top - n_sentinels < t <= sentinel_top
    fill, current = {}, None
    for token in targets.tolist():
        if is_sentinel(token):
            current = token
            fill[current] = []
        elif current is not None:
            fill[current].append(token)
    out = []
    for token in inputs.tolist():
        out += fill.get(token, []) if is_sentinel(token) else [token]
    return inputs.new_tensor(out)


def infill_spans(length: int, generator: torch.Generator, fraction: float = INFILL_FRACTION,
                 lam: float = POISSON_LAMBDA) -> list[tuple[int, int]]:
    """BART's infilling spans of a row, (start, end) in order (end == start: a zero-length span, an
    inserted mask). Lengths are Poisson(lam) draws until round(fraction * length) tokens are covered
    (the last one clipped); the unmasked tokens fall into the gaps between spans uniformly at random."""
    target = round(length * fraction)
    lengths: list[int] = []
    covered = 0
    while covered < target:
        n = int(torch.poisson(torch.tensor([lam]), generator=generator).item())
        n = min(n, target - covered)
        lengths.append(n)
        covered += n
    if not lengths:
        return []
    # The length - covered kept tokens go into len(lengths) + 1 gaps (zero allowed): stars and bars.
    kept, k = length - covered, len(lengths)
    bars = torch.randperm(kept + k, generator=generator)[:k].sort().values.tolist()
    out, at, prev = [], 0, -1
    for bar, n in zip(bars, lengths):
        at += bar - prev - 1  # kept tokens before this span
        out.append((at, at + n))
        at += n
        prev = bar
    return out


def infill(ids: torch.Tensor, mask_id: int, generator: torch.Generator, fraction: float = INFILL_FRACTION,
           lam: float = POISSON_LAMBDA) -> torch.Tensor:
    """One row with each infilling span replaced by a single ``mask_id``."""
    pieces, at = [], 0
    for start, end in infill_spans(len(ids), generator, fraction, lam):
        pieces += [ids[at:start], ids.new_tensor([mask_id])]
        at = end
    pieces.append(ids[at:])
    return torch.cat(pieces)


def permute_sentences(ids: torch.Tensor, end_id: int | None, generator: torch.Generator) -> torch.Tensor:
    """The row's sentences (each ending at ``end_id``, the last possibly unterminated) in a random order."""
    if end_id is None:
        return ids
    ends = (ids == end_id).nonzero().flatten() + 1
    edges = [0, *ends.tolist()]
    if edges[-1] != len(ids):
        edges.append(len(ids))
    sentences = [ids[a:b] for a, b in zip(edges, edges[1:])]
    order = torch.randperm(len(sentences), generator=generator).tolist()
    return torch.cat([sentences[i] for i in order]) if sentences else ids
