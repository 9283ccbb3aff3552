"""Compiled decoding (tformer.model.compiled) produces what eager decoding produces.

Most cases trace the fixed-shape step with the "eager" backend: dynamo captures the whole step as one
graph (fullgraph: a graph break fails the test) and ATen runs it, which checks the static step's
logic in seconds. The inductor tests compile real kernels (tens of seconds on two cores), on one tiny
model, and check what compiling adds: the same tokens, the compilation timed apart, no recompilation
for a second generation of the same shape, and weights read at every call.
"""

import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.generate import generate, pad_batch
from tformer.model import build, compiled_runner, runner_for
from tformer.model.compiled import cache_length

PROMPTS = [[5, 6, 7, 8, 9, 10], [11, 12], [13, 14, 15, 16]]  # different lengths: the batch is left-padded
STEPS = 8


def model_for(arch="decoder", position="learned", **kw):
    fields = {"arch": arch, "n_layers": 2, "d_model": 36, "n_heads": 6, "n_kv_heads": 2, "d_ff": 52, "vocab_size": 41,
              "max_positions": 48, "position": position, "decoder_start_token_id": 0, "tied_embeddings": False}
    fields.update(kw)
    torch.manual_seed(0)
    model = build(ModelConfig(**fields)).eval()
    with torch.no_grad():  # larger random weights: each choice depends on the context (see test_generate_cache)
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def _prefill(runner, cache):
    if runner.takes_source:
        src, src_mask = pad_batch(PROMPTS, 0, "right")
        start = torch.zeros(len(PROMPTS), 1, dtype=torch.long)
        return runner.prefill(cache, start, source=src, source_mask=src_mask)
    ids, mask = pad_batch(PROMPTS, 0, "left")
    return runner.prefill(cache, ids, mask)


def _logits_agree(model, backend="eager", steps=STEPS):
    eager, compiled = runner_for(model), compiled_runner(model, backend=backend)
    prefix = 1 if eager.takes_source else max(map(len, PROMPTS))
    a_cache = eager.new_cache(len(PROMPTS), prefix + steps)
    b_cache = compiled.new_cache(len(PROMPTS), prefix + steps)
    assert b_cache.kv.columns == cache_length(prefix + steps, model.config.max_positions)
    with torch.no_grad():
        a, b = _prefill(eager, a_cache), _prefill(compiled, b_cache)
        for step in range(steps):
            assert torch.allclose(a, b, atol=1e-5, rtol=0), f"step {step}: max diff {(a - b).abs().max():.2e}"
            tokens = a.argmax(-1)
            a, b = eager.step(a_cache, tokens), compiled.step(b_cache, tokens)


@pytest.mark.parametrize("position", ["learned", "sinusoidal", "rope", "alibi", "relative"])
@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_compiled_step_equals_eager_at_every_step(arch, position):
    _logits_agree(model_for(arch, position))


@pytest.mark.parametrize("dilation", [1, 2])
def test_sliding_window_over_the_full_static_cache_equals_the_rolling_cache(dilation):
    # Eager sliding attention keeps a rolling cache of the window; the compiled step masks the window
    # out of the whole buffer instead. Ten steps carry the query well past a window of 3.
    _logits_agree(model_for(position="rope", attn_impl="sliding", attn_window=3, attn_dilation=dilation), steps=10)


@pytest.mark.parametrize("settings", [
    {},  # greedy
    {"num_beams": 3},
    {"do_sample": True, "top_k": 8, "temperature": 0.9, "seed": 3},
], ids=["greedy", "beam", "sampled"])
def test_generate_with_compile_gives_the_same_tokens(settings):
    model = model_for(position="rope")
    eager = generate(model, PROMPTS, max_new_tokens=9, stop_tokens=[], **settings)
    compiled = generate(model, PROMPTS, max_new_tokens=9, stop_tokens=[], compile="eager", **settings)
    assert compiled.sequences == eager.sequences
    # A second generation reuses the buffers, whose columns still hold the first one's keys: masked.
    again = generate(model, [[7, 3]], max_new_tokens=5, stop_tokens=[], compile="eager")
    assert again.sequences == generate(model, [[7, 3]], max_new_tokens=5, stop_tokens=[]).sequences


def test_a_model_moved_to_another_dtype_gets_a_decoder_of_that_dtype():
    model = model_for(position="rope")
    generate(model, [[1, 2, 3]], max_new_tokens=3, compile="eager")
    model.double()
    out = generate(model, [[1, 2, 3]], max_new_tokens=3, stop_tokens=[], compile="eager")
    assert out.sequences == generate(model, [[1, 2, 3]], max_new_tokens=3, stop_tokens=[]).sequences


def test_rewind_then_step_equals_eager():
    model = model_for(position="rope")
    eager, compiled = runner_for(model), compiled_runner(model, backend="eager")
    a_cache, b_cache = eager.new_cache(3, 20), compiled.new_cache(3, 20)
    tokens = torch.tensor([1, 2, 3])
    with torch.no_grad():
        _prefill(eager, a_cache), _prefill(compiled, b_cache)
        for runner, cache in ((eager, a_cache), (compiled, b_cache)):
            runner.step(cache, tokens)
            runner.step(cache, tokens + 4)
            cache.rewind(1)
        a, b = eager.step(a_cache, tokens + 9), compiled.step(b_cache, tokens + 9)
    assert torch.allclose(a, b, atol=1e-5, rtol=0)


@pytest.mark.parametrize("settings, words", [
    ({"attn_impl": "linear"}, "exact or sliding-window attention"),
    ({"position": "rope", "rope_scaling": "dynamic", "rope_factor": 2.0}, "dynamic NTK"),
])
def test_models_the_compiled_step_cannot_run_are_refused_in_one_line(settings, words):
    model = model_for(**settings)
    with pytest.raises(TformerError, match=words) as err:
        generate(model, [[1, 2]], max_new_tokens=2, compile="eager")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("settings, words", [
    ({"use_cache": False}, "preallocated KV cache"),
    ({"reserve_cache": False}, "preallocated KV cache"),
    ({"compile": "turbo"}, "compile must be"),
])
def test_settings_compiled_decoding_cannot_honour_are_refused(settings, words):
    model = model_for()
    settings.setdefault("compile", True)
    with pytest.raises(TformerError, match=words):
        generate(model, [[1, 2]], max_new_tokens=2, **settings)


def test_an_encoder_cannot_be_compiled_for_decoding():
    with pytest.raises(TformerError, match="does not generate"):
        compiled_runner(model_for(arch="encoder", lm_head=True), backend="eager")


def test_cache_lengths_are_rounded_to_few_sizes_within_the_window():
    assert [cache_length(n, 1024) for n in (1, 64, 65, 300, 1000)] == [64, 64, 128, 512, 1024]
    assert cache_length(40, 48) == 48 and cache_length(30, 20) == 30


@pytest.mark.slow
def test_inductor_compiled_decoding_equals_eager_compiles_once_and_reads_current_weights():
    model = model_for(position="rope")
    eager = generate(model, PROMPTS, max_new_tokens=6, stop_tokens=[])
    first = generate(model, PROMPTS, max_new_tokens=6, stop_tokens=[], compile=True)
    assert first.sequences == eager.sequences
    assert first.compile_seconds > 0 and first.decode_tokens_per_s > 0
    second = generate(model, PROMPTS, max_new_tokens=6, stop_tokens=[], compile=True)
    assert second.compile_seconds == 0 and second.sequences == eager.sequences  # the same shape: no new graph
    with torch.no_grad():  # "trained further": the graph must read the new weights, not constants folded in
        model.lm_head.weight.mul_(-1.0)
    flipped = generate(model, PROMPTS, max_new_tokens=6, stop_tokens=[])
    assert flipped.sequences != eager.sequences
    assert generate(model, PROMPTS, max_new_tokens=6, stop_tokens=[], compile=True).sequences == flipped.sequences


@pytest.mark.parametrize("position", ["rope", "learned", "alibi"])
def test_every_cache_takes_a_padded_prompt_and_keeps_its_padding(position):
    """The one face: a left-padded prompt's attention_mask goes to the preallocated cache as to the growing one (each
    keeps the padding and counts positions over real tokens), and the next step over each gives the logits of
    the unpadded prompt alone. Fails if either cache ignores the mask or counts padding as positions."""
    from tformer.model.slot_cache import SlotCache

    model = model_for(position=position)
    ids, mask = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]]), torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    alone = model(torch.tensor([[5, 6, 7, 8]])).logits[0, -1]
    for kv in (model.new_cache(), SlotCache.allocate(model.config, model.config.n_layers, 2, 16, torch.float32, "cpu")):
        model(ids, attention_mask=mask, past_key_values=kv)
        step = model(torch.tensor([[8], [6]]), past_key_values=kv).logits[0, -1]
        torch.testing.assert_close(step, alone, rtol=1e-5, atol=1e-5)
