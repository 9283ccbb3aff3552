"""The KV cache never changes what generation produces.

tests/model/test_kv_cache_model.py feeds the model fixed tokens step by step; here the runners'
prefill and step, which `generate` uses, are driven by the tokens they choose themselves, with
left-padded batches, growing caches with and without a reserve, GQA, and every position scheme, and compared with the recompute-everything
path at every step.
"""

import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.generate import generate, pad_batch
from tformer.model import build, runner_for

POSITIONS = ["learned", "sinusoidal", "rope", "alibi", "relative"]
PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]  # different lengths: the batch is left-padded
STEPS = 8


def model_for(arch, position, **kw):
    config = ModelConfig(arch=arch, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=40,
                         max_positions=40, position=position, decoder_start_token_id=0, tied_embeddings=False, **kw)
    torch.manual_seed(0)
    model = build(config).eval()
    # The default init gives near-uniform logits and repeats the input token (more so with a tied
    # head); an untied head and larger random weights make each choice depend on the context, so
    # a cache or padding bug changes the tokens.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def _states(model, static):
    """(runner, cache with KV, cache without, prefill(cache) -> logits) for PROMPTS, on the model's device."""
    runner = runner_for(model)
    device = runner.device
    if runner.takes_source:
        src, src_mask = pad_batch(PROMPTS, 0, "right", device)
        start = torch.zeros(len(PROMPTS), 1, dtype=torch.long, device=device)
        prefix = 1
        prefill = lambda c: runner.prefill(c, start, source=src, source_mask=src_mask)
    else:
        ids, mask = pad_batch(PROMPTS, 0, "left", device)
        prefix = ids.shape[1]
        prefill = lambda c: runner.prefill(c, ids, mask)
    cached = runner.new_cache(len(PROMPTS), prefix + STEPS if static else None)
    return runner, cached, runner.new_cache(len(PROMPTS), kv=False), prefill


@pytest.mark.parametrize("static", [False, True], ids=["growing", "static"])
@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_cached_logits_equal_uncached_at_every_step(arch, position, static, device):
    model = model_for(arch, position).to(device)
    runner, cached, uncached, prefill = _states(model, static)
    with torch.no_grad():
        a, b = prefill(cached), prefill(uncached)
        for step in range(STEPS):
            assert torch.allclose(a, b, atol=1e-5, rtol=0), f"step {step}: max diff {(a - b).abs().max():.2e}"
            tokens = a.argmax(-1)
            a, b = runner.step(cached, tokens), runner.step(uncached, tokens)
    assert (cached.kv.reserved > 0) == static  # prompt + new tokens reserved up front, or none
    assert uncached.kv is None and uncached.nbytes == 0
    assert cached.kv.length == uncached.ids.shape[1]  # every token read so far, padding included, is cached


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_greedy_same_tokens_with_and_without_cache_and_reserved(arch, position, device):
    model = model_for(arch, position).to(device)
    growing = generate(model, PROMPTS, max_new_tokens=STEPS, stop_tokens=[], reserve_cache=False)
    none = generate(model, PROMPTS, max_new_tokens=STEPS, stop_tokens=[], use_cache=False)
    reserved = generate(model, PROMPTS, max_new_tokens=STEPS, stop_tokens=[], reserve_cache=True)
    assert growing.sequences == none.sequences == reserved.sequences
    assert len({tuple(s) for s in growing.sequences}) > 1  # the rows really differ
    assert none.cache_bytes == 0 and growing.cache_bytes == reserved.cache_bytes > 0


def test_the_old_name_static_cache_still_works_with_a_notice():
    model = model_for("decoder", "rope")
    with pytest.warns(FutureWarning, match="static_cache is now reserve_cache"):
        old = generate(model, PROMPTS, max_new_tokens=STEPS, stop_tokens=[], static_cache=False)
    assert old.sequences == generate(model, PROMPTS, max_new_tokens=STEPS, stop_tokens=[], reserve_cache=False).sequences


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_padded_batch_equals_each_prompt_alone(arch, position):
    model = model_for(arch, position)
    batch = generate(model, PROMPTS, max_new_tokens=STEPS, stop_tokens=[])
    alone = [generate(model, [p], max_new_tokens=STEPS, stop_tokens=[]).sequences[0] for p in PROMPTS]
    assert batch.sequences == alone


def test_padded_batch_beam_search_equals_each_prompt_alone():
    model = model_for("decoder", "learned")
    batch = generate(model, PROMPTS, max_new_tokens=STEPS, num_beams=3, stop_tokens=[7])
    alone = [generate(model, [p], max_new_tokens=STEPS, num_beams=3, stop_tokens=[7]).sequences[0] for p in PROMPTS]
    assert batch.sequences == alone


def test_right_padded_tensor_prompt_is_repadded_left():
    model = model_for("decoder", "learned")
    ids, mask = pad_batch(PROMPTS, 0, "right")
    right = generate(model, ids, attention_mask=mask, max_new_tokens=STEPS, stop_tokens=[])
    assert right.sequences == generate(model, PROMPTS, max_new_tokens=STEPS, stop_tokens=[]).sequences


@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_beam_width_one_is_greedy(arch):
    model = model_for(arch, "rope" if arch == "decoder" else "relative")
    greedy = generate(model, PROMPTS, max_new_tokens=STEPS, stop_tokens=[4])
    beam = generate(model, PROMPTS, max_new_tokens=STEPS, num_beams=1, stop_tokens=[4])
    assert beam.sequences == greedy.sequences


@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_beam_search_same_with_and_without_cache(arch):
    model = model_for(arch, "learned")
    kw = dict(max_new_tokens=STEPS, num_beams=4, length_penalty=0.6, stop_tokens=[9])
    cached = generate(model, PROMPTS, **kw)
    assert cached.sequences == generate(model, PROMPTS, use_cache=False, **kw).sequences
    assert cached.sequences == generate(model, PROMPTS, reserve_cache=False, **kw).sequences
    assert torch.allclose(cached.scores, generate(model, PROMPTS, use_cache=False, **kw).scores, atol=1e-5)


def test_beam_search_scores_are_length_normalised_log_probs():
    """The returned score is sum log p(token) / generated_length ** length_penalty."""
    model = model_for("decoder", "learned")
    out = generate(model, [PROMPTS[0]], max_new_tokens=5, num_beams=3, length_penalty=0.5, stop_tokens=[])
    seq = out.sequences[0]
    with torch.no_grad():
        logits = model(torch.tensor([PROMPTS[0] + seq])).logits[0].float()
    logp = torch.log_softmax(logits, -1)
    n = len(PROMPTS[0])
    total = sum(float(logp[n - 1 + i, t]) for i, t in enumerate(seq))
    assert out.scores[0].item() == pytest.approx(total / len(seq) ** 0.5, abs=1e-4)
    # and it beats the greedy continuation's score under the same rule (beam search found better or equal)
    greedy = generate(model, [PROMPTS[0]], max_new_tokens=5, stop_tokens=[]).sequences[0]
    with torch.no_grad():
        g_logp = torch.log_softmax(model(torch.tensor([PROMPTS[0] + greedy])).logits[0].float(), -1)
    g_total = sum(float(g_logp[n - 1 + i, t]) for i, t in enumerate(greedy))
    assert total >= g_total - 1e-5


def test_stop_tokens_per_sequence():
    model = model_for("decoder", "learned")
    free = generate(model, PROMPTS, max_new_tokens=STEPS, stop_tokens=[])
    # Stop each row at the third token it would produce: different tokens for different rows.
    stops = [[s[2]] for s in free.sequences]
    out = generate(model, PROMPTS, max_new_tokens=STEPS, stop_tokens=stops, pad_token_id=0)
    for row, full, stop in zip(out.sequences, free.sequences, stops):
        assert row == full[: full.index(stop[0]) + 1]
        assert row[-1] == stop[0]
    # Finished rows are padded in the tensor form.
    shortest = min(len(r) for r in out.sequences)
    if shortest < out.tokens.shape[1]:
        row = [len(r) for r in out.sequences].index(shortest)
        assert set(out.tokens[row, shortest:].tolist()) == {0}


def test_context_window_limits_new_tokens():
    model = model_for("decoder", "learned")  # max_positions 40
    out = generate(model, [list(range(1, 36))], max_new_tokens=20, stop_tokens=[])
    assert out.hit_context_limit and len(out.sequences[0]) == 5


@pytest.mark.parametrize("beams", [1, 3])
def test_stop_token_before_the_window_is_not_a_context_limit(beams):
    """A row that ends at its stop token inside the window was not cut short by the window, even when
    max_new_tokens asked for more than the window holds."""
    model = model_for("decoder", "learned")  # max_positions 40
    prompt = [list(range(1, 36))]
    free = generate(model, prompt, max_new_tokens=20, stop_tokens=[], num_beams=beams)
    every = list(range(model.config.vocab_size))  # whatever comes first stops the row: it ends at once
    out = generate(model, prompt, max_new_tokens=20, stop_tokens=every, num_beams=beams)
    assert len(out.sequences[0]) == 1
    assert not out.hit_context_limit
    assert free.hit_context_limit and len(free.sequences[0]) == 5
