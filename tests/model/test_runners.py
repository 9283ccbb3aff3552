"""The runners: one per architecture, the only object train/, generate/ and measure/ drive a model by.

For each architecture: prefill + step with the cache give the logits of a full forward pass
without one; the cache's select and rewind do what beam search and the decode profile need; the loss is the
model's own; and runner_for picks the right runner.
"""

import pytest
import torch

from tformer.core.config import ARCH_RECORDS, ModelConfig
from tformer.core.errors import TformerError
from tformer.data.batch import example_batch
from tformer.model import build
from tformer.model.records import runner_class
from tformer.model.runners import (
    Batch,
    DecoderRunner,
    EncoderDecoderRunner,
    Runner,
    runner_for,
)

GENERATING = ["decoder", "encoder-decoder"]


def model_for(arch, position="learned", **kw):
    config = ModelConfig(arch=arch, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, vocab_size=40,
                         max_positions=32, position=position, decoder_start_token_id=0, pad_token_id=0,
                         tied_embeddings=False, **kw)
    torch.manual_seed(0)
    model = build(config).eval()
    with torch.no_grad():  # larger weights: logits that depend on every earlier token
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return model


def full_logits(model, tokens, source=None):
    """Every position's logits from one forward pass, no cache: (N, T, V)."""
    with torch.no_grad():
        if source is not None:
            return model(source, decoder_input_ids=tokens).logits
        return model(tokens).logits


def read(runner, cache, tokens, source, prompt):
    """Prefill ``prompt`` tokens, then step through the rest; the logits after each, (N, T - prompt + 1, V)."""
    with torch.no_grad():
        out = [runner.prefill(cache, tokens[:, :prompt], source=source)]
        for t in range(prompt, tokens.shape[1]):
            out.append(runner.step(cache, tokens[:, t]))
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("kv", [True, False], ids=["kv", "nokv"])
@pytest.mark.parametrize("static", [False, True], ids=["growing", "static"])
@pytest.mark.parametrize("position", ["learned", "rope", "relative"])
@pytest.mark.parametrize("arch", GENERATING)
def test_prefill_and_steps_equal_full_forward(arch, position, static, kv):
    model = model_for(arch, position)
    runner = runner_for(model)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(1, 40, (3, 9), generator=g)
    source = torch.randint(1, 40, (3, 7), generator=g) if runner.takes_source else None
    cache = runner.new_cache(3, 9 if static else None, kv=kv)
    got = read(runner, cache, tokens, source, prompt=4)
    want = full_logits(model, tokens, source)[:, 3:]
    assert torch.allclose(got, want, atol=1e-4, rtol=0), (got - want).abs().max()
    assert (cache.nbytes > 0) == kv


@pytest.mark.parametrize("arch", GENERATING)
def test_prefill_all_logits_is_the_full_forward(arch):
    model = model_for(arch)
    runner = runner_for(model)
    tokens = torch.randint(1, 40, (2, 6), generator=torch.Generator().manual_seed(2))
    source = tokens.flip(1) if runner.takes_source else None
    with torch.no_grad():
        got = runner.prefill(runner.new_cache(2), tokens, source=source, all_logits=True)
    assert torch.allclose(got, full_logits(model, tokens, source), atol=1e-5, rtol=0)


def test_left_padded_prefill_equals_each_prompt_alone():
    model = model_for("decoder", "rope")
    runner = runner_for(model)
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = (torch.arange(5) >= torch.tensor([[2], [0]])).long()
    with torch.no_grad():
        cache = runner.new_cache(2, 8)
        batch = [runner.prefill(cache, ids, mask), runner.step(cache, torch.tensor([13, 14]))]
        for row, real in ((0, [5, 6, 7]), (1, [8, 9, 10, 11, 12])):
            alone = full_logits(model, torch.tensor([real + [13 + row]]))[0]
            assert torch.allclose(batch[0][row], alone[-2], atol=1e-4, rtol=0)
            assert torch.allclose(batch[1][row], alone[-1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("kv", [True, False], ids=["kv", "nokv"])
@pytest.mark.parametrize("arch", GENERATING)
def test_select_within_inputs_keeps_the_chosen_rows(arch, kv):
    """After select(index, within_inputs=True), each row continues exactly as row index[i] would have. Beam
    search moves rows only among the beams of one input, so a seq2seq model's rows share one source here."""
    model = model_for(arch)
    runner = runner_for(model)
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(1, 40, (3, 5), generator=g)
    source = torch.randint(1, 40, (1, 6), generator=g).expand(3, -1) if runner.takes_source else None
    index = torch.tensor([2, 2, 0])
    nxt = torch.tensor([7, 8, 9])
    with torch.no_grad():
        cache = runner.new_cache(3, 8, kv=kv)
        runner.prefill(cache, tokens, source=source)
        cache.select(index, within_inputs=True)
        got = runner.step(cache, nxt)
    want = full_logits(model, torch.cat([tokens[index], nxt[:, None]], 1),
                       None if source is None else source[index])[:, -1]
    assert torch.allclose(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", GENERATING)
def test_select_gives_each_input_its_beams(arch):
    model = model_for(arch)
    runner = runner_for(model)
    g = torch.Generator().manual_seed(4)
    tokens = torch.randint(1, 40, (2, 3), generator=g)
    source = torch.randint(1, 40, (2, 5), generator=g) if runner.takes_source else None
    expand = torch.arange(2).repeat_interleave(3)  # 2 inputs x 3 beams
    with torch.no_grad():
        cache = runner.new_cache(2, 6)
        first = runner.prefill(cache, tokens, source=source)
        cache.select(expand)
        got = runner.step(cache, torch.arange(6) + 1)
    assert cache.rows == 6
    want = full_logits(model, torch.cat([tokens[expand], (torch.arange(6) + 1)[:, None]], 1),
                       None if source is None else source[expand])[:, -1]
    assert torch.allclose(got, want, atol=1e-4, rtol=0)
    assert first.shape == (2, 40)


@pytest.mark.parametrize("static", [False, True], ids=["growing", "static"])
@pytest.mark.parametrize("context", [0, 3])
@pytest.mark.parametrize("arch", GENERATING)
def test_rewind_reads_the_same_position_again(arch, context, static):
    """Step, rewind one, step with another token: the same as stepping with it in the first place
    (the decode profile times one position this way, again and again)."""
    model = model_for(arch)
    runner = runner_for(model)
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(1, 40, (2, context), generator=g)
    source = torch.randint(1, 40, (2, 5), generator=g) if runner.takes_source else None
    a, b = torch.tensor([3, 4]), torch.tensor([5, 6])
    with torch.no_grad():
        cache = runner.new_cache(2, context + 1 if static else None)
        runner.prefill(cache, prompt, source=source)
        runner.step(cache, a)
        cache.rewind(1)
        assert cache.kv.length == context
        again = runner.step(cache, b)
        fresh = runner.new_cache(2, context + 1 if static else None)
        runner.prefill(fresh, prompt, source=source)
        want = runner.step(fresh, b)
    assert torch.allclose(again, want, atol=1e-5, rtol=0)


def test_rewind_without_kv_cache_drops_tokens():
    model = model_for("decoder")
    runner = runner_for(model)
    ids = torch.tensor([[1, 2, 3]])
    with torch.no_grad():
        cache = runner.new_cache(1, kv=False)
        runner.prefill(cache, ids)
        runner.step(cache, torch.tensor([4]))
        cache.rewind(2)
        got = runner.step(cache, torch.tensor([9]))
    assert cache.ids.tolist() == [[1, 2, 9]]
    assert torch.allclose(got, full_logits(model, torch.tensor([[1, 2, 9]]))[:, -1], atol=1e-5)


@pytest.mark.parametrize("arch", ["decoder", "encoder", "encoder-decoder"])
def test_loss_equals_the_models_own(arch):
    model = model_for(arch, lm_head=True) if arch == "encoder" else model_for(arch)
    runner = runner_for(model)
    g = torch.Generator().manual_seed(6)
    ids = torch.randint(1, 40, (2, 8), generator=g)
    target = torch.randint(1, 40, (2, 5), generator=g)
    with torch.no_grad():
        if runner.objective == "causal":  # the source's shift: position t predicts token t + 1
            got = runner.loss(Batch({"input_ids": ids[:, :-1]}, ids[:, 1:]))
            want = model(ids, labels=ids).loss
        elif runner.takes_source:
            batch = example_batch(model.config, ids, target)
            got = runner.loss(batch)
            want = model(ids, decoder_input_ids=target, labels=target).loss
        else:
            labels = torch.where(torch.rand(2, 8, generator=g) < 0.5, ids, -100)
            got = runner.loss(Batch(example_batch(model.config, ids).inputs, labels))
            want = model(ids, labels=labels).loss
    assert torch.allclose(got, want, atol=1e-5), (got, want)


def test_loss_of_a_headless_encoder_needs_a_stand_in():
    model = model_for("encoder", lm_head=False, pooler=True)
    runner, batch = runner_for(model), example_batch(model.config, torch.randint(1, 40, (2, 4)))
    with pytest.raises(TformerError, match="no LM head"):
        runner.loss(batch)
    loss = runner.loss(batch, stand_in=True)
    loss.backward()  # what the train profile times
    assert all(p.grad is not None for p in runner.model.encoder.parameters())


@pytest.mark.parametrize("arch,cls", [("decoder", DecoderRunner), ("encoder", Runner),
                                      ("encoder-decoder", EncoderDecoderRunner)])
def test_runner_for_each_architecture(arch, cls):
    runner = runner_for(model_for(arch))
    assert type(runner) is cls
    traits = ARCH_RECORDS[arch]
    assert runner.generates == traits.decoder and runner.takes_source == traits.seq2seq
    assert runner.phases == traits.phases and runner.label == traits.label
    assert runner_class(arch) is cls  # the runner the arch's record names


def test_runner_for_rejects_other_modules_and_encoders_do_not_generate():
    with pytest.raises(TformerError, match="tformer model"):
        runner_for(torch.nn.Linear(2, 2))
    runner = runner_for(model_for("encoder"))
    with pytest.raises(TformerError, match="cannot generate"):
        runner.new_cache(1)


def test_prefill_checks_its_inputs():
    dec = runner_for(model_for("decoder"))
    with pytest.raises(TformerError, match="reads no source"):
        dec.prefill(dec.new_cache(1), torch.tensor([[1]]), source=torch.tensor([[1]]))
    with pytest.raises(TformerError, match="made for 2 rows"):
        dec.prefill(dec.new_cache(2), torch.tensor([[1]]))
    s2s = runner_for(model_for("encoder-decoder"))
    with pytest.raises(TformerError, match="needs a source"):
        s2s.prefill(s2s.new_cache(1), torch.tensor([[0]]))
