"""arch='rnn': the config's fields, the model (fast and teaching paths agree), its runner (the state is the
cache: cached generation equals running the whole sequence again), and what it refuses."""

import pytest
import torch

from tformer.core.config import ARCH_RECORDS, ModelConfig
from tformer.core.errors import TformerError
from tformer.cost.ledger import Workload
from tformer.data.batch import example_batch
from tformer.generate import GenerationConfig, generate
from tformer.measure.step import StepRunner
from tformer.model import RecurrentLM, build, runner_for
from tformer.model.compiled import check_compilable
from tformer.model.runners import RecurrentRunner

V = 37


def config(**kw):
    return ModelConfig.from_dict({"arch": "rnn", "vocab_size": V, "d_model": 18, "d_hidden": 23, "n_layers": 2, **kw})


def model(**kw):
    torch.manual_seed(0)
    return build(config(**kw)).eval()


def test_config_fields_and_their_errors():
    c = ModelConfig.from_dict({"arch": "rnn", "vocab_size": V, "d_model": 30, "n_layers": 1})
    assert (c.cell, c.d_hidden) == ("lstm", 30)  # defaults follow d_model
    assert c.to_dict()["d_hidden"] is None and c.replace(d_model=14).d_hidden == 14
    assert ARCH_RECORDS["rnn"].objective == "causal" and ARCH_RECORDS["rnn"].decoder and not ARCH_RECORDS["rnn"].encoder
    unknown = r"^cell='lstn' is unknown \(did you mean 'lstm'\?\); choose one of: lstm, gru, rnn$"
    with pytest.raises(TformerError, match=unknown):
        config(cell="lstn")
    with pytest.raises(TformerError, match="^d_hidden must be at least 1, got 0$"):
        config(d_hidden=0)
    with pytest.raises(TformerError, match="only applies to arch='rnn'"):
        ModelConfig.from_dict({"cell": "gru"})
    with pytest.raises(TformerError, match="only applies to arch='rnn'"):
        ModelConfig.from_dict({"d_hidden": 8})


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_teaching_and_fast_paths_give_the_same_logits(cell):
    fast = model(cell=cell)
    slow = build(config(cell=cell, rnn_teaching=True)).eval()
    slow.load_state_dict(fast.state_dict())
    ids = torch.randint(0, V, (3, 9))
    assert torch.allclose(fast(ids).logits, slow(ids).logits, atol=1e-5)


def test_head_is_tied_only_when_the_widths_agree():
    tied = build(config(d_hidden=18))
    assert tied.lm_head.weight is tied.tok_embed.weight
    untied = build(config())
    assert untied.lm_head.weight.shape == (V, 23)


@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
def test_cached_generation_equals_rerunning_the_whole_sequence(cell):
    m = model(cell=cell)
    runner = runner_for(m)
    assert type(runner) is RecurrentRunner and runner.generates and runner.objective == "causal"
    ids = torch.randint(0, V, (2, 6))
    cache, plain = runner.new_cache(2), runner.new_cache(2, kv=False)
    with torch.no_grad():
        a, b = runner.prefill(cache, ids), runner.prefill(plain, ids)
        assert torch.allclose(a, b, atol=1e-6)
        seq = ids
        for _ in range(4):
            tok = a.argmax(-1)
            a, b = runner.step(cache, tok), runner.step(plain, tok)
            seq = torch.cat([seq, tok[:, None]], dim=1)
            full = m(seq).logits[:, -1]
            assert torch.allclose(a, full, atol=1e-5) and torch.allclose(b, full, atol=1e-5)
    assert cache.nbytes == 2 * 2 * 2 * 23 * 4 if cell == "lstm" else 2 * 2 * 23 * 4  # fixed size
    greedy = GenerationConfig(max_new_tokens=5, do_sample=False)
    with_cache = generate(m, ids, config=greedy)
    without = generate(m, ids, config=GenerationConfig(max_new_tokens=5, do_sample=False, use_cache=False))
    assert with_cache.sequences == without.sequences and len(with_cache.sequences[0]) == 5


def test_left_padding_leaves_the_state_as_it_was():
    m = model()
    runner = runner_for(m)
    short = torch.randint(0, V, (1, 3))
    long = torch.randint(0, V, (1, 5))
    ids = torch.cat([torch.cat([torch.zeros(1, 2, dtype=torch.long), short], 1), long])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    with torch.no_grad():
        batch = runner.prefill(runner.new_cache(2), ids, mask)
        one = runner.prefill(runner.new_cache(1), short)
        two = runner.prefill(runner.new_cache(1), long)
    assert torch.allclose(batch[0], one[0], atol=1e-6) and torch.allclose(batch[1], two[0], atol=1e-6)


def test_reorder_follows_the_rows_and_rewind_refuses():
    m = model(cell="gru")
    runner = runner_for(m)
    ids = torch.randint(0, V, (3, 4))
    cache = runner.new_cache(3)
    with torch.no_grad():
        runner.prefill(cache, ids)
        cache.select(torch.tensor([2, 2, 0]))
        out = runner.step(cache, torch.tensor([1, 1, 1]))
        ref = m(torch.cat([ids[[2, 2, 0]], torch.ones(3, 1, dtype=torch.long)], 1)).logits[:, -1]
    assert torch.allclose(out, ref, atol=1e-5)
    with pytest.raises(TformerError, match="cannot forget"):
        cache.rewind(1)
    with pytest.raises(TformerError, match="reads no source"):
        runner.prefill(runner.new_cache(3), ids, source=ids)


def test_loss_trains_every_parameter_and_compile_is_refused():
    m = model().train()
    runner = runner_for(m)
    loss = runner.loss(example_batch(m.config, torch.randint(0, V, (2, 7))))
    loss.backward()
    assert isinstance(m, RecurrentLM) and all(p.grad is not None for p in m.parameters())
    with pytest.raises(TformerError, match="recurrent model.*drop --compile"):
        check_compilable(m.config)


def test_profile_step_runner_decodes_from_the_same_state_every_step():
    runner = StepRunner(config(), Workload(phase="decode", batch=2, seq=6))
    before = runner.cache.snapshot()
    runner.step()
    runner.step()
    assert runner.cache.snapshot() is before  # put back after each timed step


@pytest.mark.parametrize("arch", ["rnn", "rnn-seq2seq"])
def test_recurrent_models_start_from_torchs_initialisation(arch):
    """Embedding N(0, 1) and every Linear / LSTM weight uniform in +-1/sqrt(fan_in), as torch's own modules
    start; not the Transformers' N(0, 0.02), which starves the gates of input."""
    config = ModelConfig(arch=arch, cell="lstm", vocab_size=300, d_model=64, d_hidden=96, n_layers=2,
                         tied_embeddings=False)
    torch.manual_seed(0)
    model = build(config)
    assert 0.95 < float(model.tok_embed.weight.detach().std()) < 1.05
    checked = 0
    for module in model.modules():
        if isinstance(module, torch.nn.RNNBase):
            bound, weights = 1 / module.hidden_size ** 0.5, [p for n, p in module.named_parameters()]
        elif isinstance(module, torch.nn.Linear):
            bound, weights = 1 / module.in_features ** 0.5, [module.weight]
        else:
            continue
        for p in weights:
            top = float(p.detach().abs().max())
            assert 0.8 * bound < top <= bound + 1e-6  # the whole uniform range, not a narrow normal
            checked += 1
    assert checked >= 5
