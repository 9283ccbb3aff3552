"""arch='rnn-seq2seq': config fields and their errors; step-by-step decoding equals the teacher-forced forward for
every attention kind and cell; a padded source row equals the row alone; attention weights sum to 1 and are 0 on
padding; the teaching path equals torch's; generation through the existing search functions; Bahdanau's score
written out by hand."""

import pytest
import torch

from tformer.core.config import ARCH_RECORDS, ModelConfig
from tformer.core.errors import TformerError
from tformer.generate import GenerationConfig, generate
from tformer.model import RecurrentSeq2Seq, build, runner_for
from tformer.model.runners import RecurrentSeq2SeqRunner
from tformer.model.compiled import check_compilable

V = 31
KINDS = ["bahdanau", "luong-dot", "luong-general", "none"]


def config(**kw):
    return ModelConfig.from_dict({"arch": "rnn-seq2seq", "vocab_size": V, "d_model": 10, "d_hidden": 7, "n_layers": 2,
                                  "pad_token_id": 0, "decoder_start_token_id": 1, **kw})


def model(dtype=torch.float32, **kw):
    torch.manual_seed(0)
    m = build(config(**kw)).to(dtype).eval()
    with torch.no_grad():  # larger than the 0.02 init, so attention is far from uniform
        for name, p in m.named_parameters():
            if name.startswith(("attention", "bridge")):
                p.normal_(0, 0.5)
    return m


def test_config_fields_and_their_errors():
    c = ModelConfig.from_dict({"arch": "rnn-seq2seq", "vocab_size": V, "d_model": 12})
    assert (c.cell, c.d_hidden, c.rnn_attention, c.rnn_input_feeding, c.bidirectional) == ("lstm", 12, "bahdanau",
                                                                                          True, False)
    assert c.to_dict()["rnn_attention"] is None and ARCH_RECORDS["rnn-seq2seq"].seq2seq
    with pytest.raises(TformerError, match=r"^rnn_attention='luong' is unknown \(did you mean 'luong-dot'\?\)"):
        config(rnn_attention="luong")
    with pytest.raises(TformerError, match="^rnn_attention .* only applies to arch='rnn-seq2seq'$"):
        ModelConfig.from_dict({"arch": "rnn", "rnn_attention": "bahdanau"})
    with pytest.raises(TformerError, match="^bidirectional .* only applies to arch='rnn-seq2seq'$"):
        ModelConfig.from_dict({"bidirectional": True})
    with pytest.raises(TformerError, match="^rnn_input_feeding is Luong's"):
        config(rnn_input_feeding=False)
    with pytest.raises(TformerError, match="^d_hidden must be at least 1, got 0$"):
        config(d_hidden=0)
    with pytest.raises(TformerError, match="^n_decoder_layers only applies"):
        config(n_decoder_layers=3)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
@pytest.mark.parametrize("kind", KINDS)
def test_step_by_step_equals_teacher_forcing(kind, cell, bidirectional):
    m = model(cell=cell, rnn_attention=kind, bidirectional=bidirectional)
    src, tgt = torch.randint(2, V, (3, 6)), torch.randint(2, V, (3, 5))
    runner = runner_for(m)
    assert isinstance(runner, RecurrentSeq2SeqRunner) and isinstance(m, RecurrentSeq2Seq)
    with torch.no_grad():
        full = m(src, decoder_input_ids=tgt).logits
        cache = runner.new_cache(3)
        steps = [runner.prefill(cache, tgt[:, :1], source=src)] + [runner.step(cache, tgt[:, t]) for t in range(1, 5)]
    assert torch.allclose(torch.stack(steps, 1), full, atol=1e-5)


@pytest.mark.parametrize("kind", ["luong-dot", "luong-general"])
def test_input_feeding_off_runs_all_steps_at_once_and_still_matches_steps(kind):
    m = model(rnn_attention=kind, rnn_input_feeding=False)
    on = model(rnn_attention=kind)
    assert m.decoder.input_size == 10 and on.decoder.input_size == 17  # [E y; h~_{t-1}] with feeding
    src, tgt = torch.randint(2, V, (2, 5)), torch.randint(2, V, (2, 4))
    runner = runner_for(m)
    with torch.no_grad():
        full = m(src, decoder_input_ids=tgt).logits
        cache = runner.new_cache(2)
        steps = [runner.prefill(cache, tgt[:, :1], source=src)] + [runner.step(cache, tgt[:, t]) for t in range(1, 4)]
    assert torch.allclose(torch.stack(steps, 1), full, atol=1e-5)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("kind", ["bahdanau", "luong-general", "none"])
@pytest.mark.parametrize("teaching", [False, True])
def test_padded_source_rows_equal_each_row_alone(kind, bidirectional, teaching):
    m = model(rnn_attention=kind, bidirectional=bidirectional, rnn_teaching=teaching)
    rows = [torch.randint(2, V, (n,)) for n in (6, 3, 4)]
    tgt = torch.randint(2, V, (3, 4))
    for side in ("right", "left"):
        src, mask = torch.zeros(3, 6, dtype=torch.long), torch.zeros(3, 6, dtype=torch.long)
        for i, r in enumerate(rows):
            cols = slice(0, len(r)) if side == "right" else slice(6 - len(r), 6)
            src[i, cols], mask[i, cols] = r, 1
        with torch.no_grad():
            out = m(src, mask, decoder_input_ids=tgt, output_attentions=True)
            for i, r in enumerate(rows):
                alone = m(r[None], decoder_input_ids=tgt[i:i + 1], output_attentions=True)
                assert torch.allclose(out.logits[i], alone.logits[0], atol=1e-5)
                if kind != "none":
                    w, w_alone = out.cross_attentions[0][i], alone.cross_attentions[0][0]
                    assert torch.allclose(w[:, mask[i].bool()], w_alone, atol=1e-5)
                    assert torch.all(w[:, ~mask[i].bool()] == 0)  # padding gets no weight
                    assert torch.allclose(w.sum(-1), torch.ones(4), atol=1e-6)


@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("cell", ["lstm", "gru", "rnn"])
@pytest.mark.parametrize("kind", KINDS)
def test_teaching_path_equals_torch(kind, cell, bidirectional):
    fast = model(torch.float64, cell=cell, rnn_attention=kind, bidirectional=bidirectional)
    slow = build(config(cell=cell, rnn_attention=kind, bidirectional=bidirectional, rnn_teaching=True)).double()
    slow.load_state_dict(fast.state_dict())
    src, tgt = torch.randint(2, V, (2, 6)), torch.randint(2, V, (2, 5))
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[1, :2] = 0  # one left-padded row: packed sequences against the masked loop
    a, b = fast(src, mask, decoder_input_ids=tgt, labels=tgt), slow(src, mask, decoder_input_ids=tgt, labels=tgt)
    assert torch.allclose(a.logits, b.logits, atol=1e-6)
    a.loss.backward()
    b.loss.backward()
    for (name, p), q in zip(fast.named_parameters(), slow.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name


def test_bahdanau_score_by_hand():
    """Two source positions, h = 3, numbers small enough to check on paper:
    e_j = v . tanh(W_s s + W_h h_j); with W_s = W_h = I and v = (1, 1, 1)."""
    m = model(rnn_attention="bahdanau", d_hidden=3)
    with torch.no_grad():
        for name in ("query_proj", "key_proj"):
            m.attention[name].weight.copy_(torch.eye(3))
        m.attention["score"].weight.copy_(torch.ones(1, 3))
    h = torch.tensor([[[0.5, 0.0, -0.5], [1.0, 1.0, 0.0]]])  # (1, 2, 3): h_1, h_2
    s = torch.tensor([[[0.0, 0.5, 0.5]]])  # (1, 1, 3): s_{t-1}
    memory = m.encode(torch.tensor([[2, 3]]))
    memory.outputs, memory.keys = h, m._keys(h)
    context, weights = m.attend(s, memory)
    # e_1 = tanh(0.5) + tanh(0.5) + tanh(0) ; e_2 = tanh(1) + tanh(1.5) + tanh(0.5)
    t = torch.tanh(torch.tensor([0.5, 1.0, 1.5]))
    e1, e2 = 2 * t[0], t[1] + t[2] + t[0]
    a1 = 1 / (1 + torch.exp(e2 - e1))
    assert torch.allclose(weights[0, 0], torch.stack([a1, 1 - a1]), atol=1e-6)
    assert torch.allclose(context[0, 0], a1 * h[0, 0] + (1 - a1) * h[0, 1], atol=1e-6)


@pytest.mark.parametrize("kind", ["bahdanau", "luong-dot"])
def test_greedy_and_beam_search_through_generate(kind):
    m = model(rnn_attention=kind, bidirectional=True)
    sources = [[5, 6, 7, 8], [9, 10]]
    greedy = generate(m, sources, config=GenerationConfig(max_new_tokens=5, do_sample=False, stop_tokens=[]),
                      decoder_input_ids=[[1], [1]])
    rerun = generate(m, sources, config=GenerationConfig(max_new_tokens=5, do_sample=False, stop_tokens=[],
                                                         use_cache=False),
                     decoder_input_ids=[[1], [1]])
    assert [len(s) for s in greedy.sequences] == [5, 5] and greedy.sequences == rerun.sequences
    beams = generate(m, sources, config=GenerationConfig(max_new_tokens=5, num_beams=3, stop_tokens=[]),
                     decoder_input_ids=[[1], [1]])
    assert len(beams.sequences) == 2
    alone = generate(m, sources[1:], config=GenerationConfig(max_new_tokens=5, do_sample=False, stop_tokens=[]),
                     decoder_input_ids=[[1]])  # the short source, padded in the batch, alone here
    assert alone.sequences[0] == greedy.sequences[1]


def test_rewind_and_compile_refuse_in_one_line():
    m = model()
    runner = runner_for(m)
    cache = runner.new_cache(1)
    runner.prefill(cache, torch.tensor([[1]]), source=torch.tensor([[4, 5]]))
    assert cache.nbytes == (2 * 2 * 7 + 2 * 2 * 7) * 4  # h and c of 2 layers, memory and keys of 2 positions
    with pytest.raises(TformerError, match="cannot forget tokens"):
        cache.rewind(1)
    with pytest.raises(TformerError, match="recurrent model") as err:
        check_compilable(m.config)
    assert "\n" not in str(err.value)
