"""Logits processors on hand-made distributions, validation, seeded sampling and streaming."""

import math

import pytest
import torch

from tformer.core.errors import TformerError
from tformer.generate import generate, stream
from tformer.generate import sampling as S
from test_generate_cache import PROMPTS, model_for

# probabilities 0.5, 0.25, 0.15, 0.1 in a shuffled vocabulary order
PROBS = torch.tensor([[0.15, 0.5, 0.1, 0.25]])
LOGITS = PROBS.log()


def kept(logits):
    return torch.isfinite(logits[0]).nonzero().flatten().tolist()


def test_top_k_keeps_the_k_most_likely():
    assert sorted(kept(S.top_k_filter(LOGITS, 2))) == [1, 3]
    assert S.top_k_filter(LOGITS, 0) is LOGITS  # 0 = off


@pytest.mark.parametrize("top_p, expected", [(0.5, [1]), (0.51, [1, 3]), (0.75, [1, 3]), (0.76, [0, 1, 3]),
                                             (0.9, [0, 1, 3]), (0.91, [0, 1, 2, 3]), (1e-6, [1])])
def test_top_p_keeps_the_smallest_set_reaching_p(top_p, expected):
    assert sorted(kept(S.top_p_filter(LOGITS, top_p))) == expected


def test_min_p_scales_with_the_top_probability():
    # threshold = 0.4 x 0.5 = 0.2: keeps 0.5 and 0.25
    assert sorted(kept(S.min_p_filter(LOGITS, 0.4))) == [1, 3]
    assert sorted(kept(S.min_p_filter(LOGITS, 0.2))) == [0, 1, 3]  # threshold 0.1: 0.1 is not below it


def test_temperature_sharpens_and_flattens():
    cold = torch.softmax(S.apply_temperature(LOGITS, 0.5), -1)
    hot = torch.softmax(S.apply_temperature(LOGITS, 2.0), -1)
    assert cold[0, 1] > PROBS[0, 1] > hot[0, 1]
    # T = 0.5 squares the probabilities (then renormalises)
    assert torch.allclose(cold, PROBS**2 / (PROBS**2).sum(), atol=1e-6)


def test_repetition_penalty_lowers_seen_tokens_of_either_sign():
    logits = torch.tensor([[2.0, -2.0, 1.0]])
    seen = torch.tensor([[True, True, False]])
    out = S.repetition_penalty(logits, seen, 2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0]]  # positive divided, negative multiplied, unseen untouched


def test_seen_tokens_ignores_padding():
    ids = torch.tensor([[0, 0, 5, 6]])
    mask = torch.tensor([[0, 0, 1, 1]])
    seen = S.seen_tokens(ids, 8, mask)
    assert seen[0].nonzero().flatten().tolist() == [5, 6]


@pytest.mark.parametrize("call", [
    lambda: S.top_p_filter(LOGITS, 0.0), lambda: S.top_p_filter(LOGITS, 1.5), lambda: S.top_p_filter(LOGITS, -0.1),
    lambda: S.apply_temperature(LOGITS, -1.0), lambda: S.top_k_filter(LOGITS, -1), lambda: S.min_p_filter(LOGITS, 1.5),
    lambda: S.repetition_penalty(LOGITS, LOGITS > 0, 0.0), lambda: S.apply_temperature(LOGITS, float("nan")),
])
def test_invalid_values_are_named(call):
    with pytest.raises(TformerError):
        call()


@pytest.mark.parametrize("bad", [dict(top_p=1.5), dict(top_p=0), dict(temperature=-0.5), dict(top_k=-2),
                                 dict(min_p=2.0), dict(max_new_tokens=0), dict(num_beams=0),
                                 dict(num_beams=2, do_sample=True), dict(early_stopping="sometimes")])
def test_generate_rejects_bad_settings(bad):
    model = model_for("decoder", "learned")
    with pytest.raises(TformerError):
        generate(model, PROMPTS, **bad)


def test_generate_rejects_empty_and_too_long_prompts_and_encoders():
    model = model_for("decoder", "learned")  # context window 40
    with pytest.raises(TformerError, match="empty prompt"):
        generate(model, [[1, 2], []])
    with pytest.raises(TformerError, match="longer than the context window of 40"):
        generate(model, [list(range(1, 39)) * 2])
    out = generate(model, [list(range(1, 39)) * 2], truncate=True, max_new_tokens=4, stop_tokens=[])
    assert out.truncated and len(out.sequences[0]) == 4
    encoder = model_for("encoder", "learned")
    with pytest.raises(TformerError, match="no decoder"):
        generate(encoder, PROMPTS)


def test_seeded_sampling_is_reproducible_and_seed_dependent():
    model = model_for("decoder", "rope")
    kw = dict(do_sample=True, max_new_tokens=12, stop_tokens=[], temperature=1.5)
    a = generate(model, PROMPTS, seed=7, **kw).sequences
    torch.manual_seed(123)  # the global RNG must not matter
    b = generate(model, PROMPTS, seed=7, **kw).sequences
    c = generate(model, PROMPTS, seed=8, **kw).sequences
    assert a == b
    assert a != c
    # sampling with or without the cache draws the same tokens from the same seed
    assert a == generate(model, PROMPTS, seed=7, use_cache=False, **kw).sequences


def test_sampling_limits_that_leave_one_token_are_greedy():
    model = model_for("decoder", "alibi")
    greedy = generate(model, PROMPTS, max_new_tokens=8, stop_tokens=[]).sequences
    for kw in (dict(top_k=1), dict(top_p=1e-6), dict(min_p=1.0), dict(temperature=0.0)):
        assert generate(model, PROMPTS, do_sample=True, seed=0, max_new_tokens=8, stop_tokens=[], **kw).sequences == greedy


def test_sampled_tokens_respect_top_k():
    model = model_for("decoder", "learned")
    out = generate(model, PROMPTS, do_sample=True, seed=3, top_k=3, max_new_tokens=6, stop_tokens=[], temperature=5.0)
    # replay the contexts: every sampled token must be among the 3 most likely at its step
    for prompt, seq in zip(PROMPTS, out.sequences):
        with torch.no_grad():
            logits = model(torch.tensor([prompt + seq])).logits[0]
        for i, t in enumerate(seq):
            assert t in torch.topk(logits[len(prompt) - 1 + i], 3).indices.tolist()


def test_repetition_penalty_changes_greedy_output_away_from_repeats():
    model = model_for("decoder", "relative")
    plain = generate(model, PROMPTS, max_new_tokens=10, stop_tokens=[]).sequences
    penalised = generate(model, PROMPTS, max_new_tokens=10, stop_tokens=[], repetition_penalty=100.0).sequences

    def repeats(seqs):
        return sum(len(p + s) - len(set(p + s)) for p, s in zip(PROMPTS, seqs))

    assert repeats(penalised) < repeats(plain)


def test_stream_yields_the_tokens_generate_returns():
    model = model_for("decoder", "sinusoidal")
    kw = dict(max_new_tokens=7, stop_tokens=[], do_sample=True, seed=1)
    steps = list(stream(model, PROMPTS, **kw))
    assert len(steps) == 7 and all(s.shape == (3,) for s in steps)
    assert torch.stack(steps, 1).tolist() == generate(model, PROMPTS, **kw).sequences
    seen = []
    generate(model, PROMPTS, streamer=seen.append, **kw)
    assert torch.equal(torch.stack(seen, 1), torch.stack(steps, 1))
    with pytest.raises(TformerError, match="beam search"):
        next(stream(model, PROMPTS, num_beams=2))


def test_timing_and_token_counts_are_reported():
    model = model_for("decoder", "learned")
    out = generate(model, PROMPTS, max_new_tokens=5, stop_tokens=[])
    assert out.prefill_tokens == sum(len(p) for p in PROMPTS)
    assert out.decode_steps == 4 and out.decode_tokens == 4 * len(PROMPTS)
    assert out.prefill_seconds > 0 and out.decode_seconds > 0 and math.isfinite(out.decode_tokens_per_s)
