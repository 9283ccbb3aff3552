"""The equal-size pair of bench/rnn_vs_transformer.py: the LSTM's width solved with the ledger lands within
2% of the Transformer's parameters (and is the closest width), the counts are the built models' numel, and
the predicted growth with n is flat for the LSTM and grows for attention."""

import itertools

import pytest
import torch

from tformer.core.errors import TformerError
from tformer.cost import rnn_vs_attention as R
from tformer.model import build


@pytest.mark.parametrize("vocab", [65, 28])
def test_lstm_width_is_solved_within_two_percent(vocab):
    pair = R.model_pair(vocab)
    lstm, transformer = pair["lstm"], pair["transformer"]
    target = R.param_count(transformer)
    assert lstm.arch == "rnn" and lstm.cell == "lstm" and lstm.n_layers == R.RNN_LAYERS
    assert R.relative_gap(R.param_count(lstm), target) <= R.TOLERANCE
    for h in (lstm.d_hidden - 1, lstm.d_hidden + 1):  # no neighbouring width is closer
        other = lstm.replace(d_hidden=h)
        assert abs(R.param_count(other) - target) >= abs(R.param_count(lstm) - target)


def test_ledger_counts_are_the_built_models():
    for config in R.model_pair(28).values():
        torch.manual_seed(0)
        assert R.param_count(config) == build(config).num_parameters()


def test_gru_and_other_depths_match_too():
    t = R.transformer_config(65)
    for cell, layers in (("gru", 2), ("lstm", 1), ("rnn", 3)):
        r = R.matched_rnn(t, cell, layers)
        assert r.cell == cell and R.relative_gap(R.param_count(r), R.param_count(t)) <= R.TOLERANCE


def test_no_match_is_one_clear_error():
    with pytest.raises(TformerError, match="within 2%"):
        R.matched_rnn(R.transformer_config(65), d_model=20000)  # the embedding alone is too big


def test_predicted_growth_flat_for_the_lstm_and_n_squared_for_attention():
    pair = R.model_pair(65)
    lstm, attention = R.predicted_growth(pair["lstm"]), R.predicted_growth(pair["transformer"])
    assert [r["n"] for r in lstm] == list(R.NS) and lstm[0]["growth"] == attention[0]["growth"] == 1.0
    assert all(abs(r["growth"] - 1) < 0.05 for r in lstm)
    assert [r["sequential_steps"] for r in lstm] == [R.RNN_LAYERS * n for n in R.NS]
    assert {r["sequential_steps"] for r in attention} == {pair["transformer"].n_layers}
    growth = [r["growth"] for r in attention]
    assert growth == sorted(growth) and growth[-1] > 1.5
    # the per-token increase is the score matrix's, linear in n: doubling n doubles it (once the
    # per-sequence terms, spread over n tokens, have faded)
    steps = [b["flops_per_token"] - a["flops_per_token"] for a, b in itertools.pairwise(attention)]
    assert steps[-1] == pytest.approx(2 * steps[-2], rel=0.03)
