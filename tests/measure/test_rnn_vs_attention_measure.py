"""The pieces bench/rnn_vs_transformer.py measures with, on tiny models: one gradient norm per earlier
position (decaying for an LSTM), recall accuracy per distance, the shared training loop, tokens/s, and the
table built from a record."""

import math

import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.cost.rnn_vs_attention import transformer_config
from tformer.data.recall import RecallTask, recall_batch
from tformer.measure import rnn_vs_attention as M
from tformer.model import build

TASK = RecallTask(distances=(2, 4, 8), n_distractors=5, n_keys=2, n_values=3, prefix=2)


def tiny(arch):
    torch.manual_seed(0)
    if arch == "rnn":
        return build(ModelConfig(arch="rnn", cell="lstm", vocab_size=TASK.vocab_size, d_model=8, d_hidden=12,
                                 n_layers=1, max_positions=64))
    return build(transformer_config(TASK.vocab_size, 64, n_layers=1, d_model=16, n_heads=2, d_ff=32))


@pytest.mark.parametrize("arch", ["rnn", "decoder"])
def test_gradient_reach_gives_one_norm_per_position(arch):
    model = tiny(arch)
    ids, labels, _ = recall_batch(TASK, 3, torch.Generator().manual_seed(0), prefix=TASK.prefix)
    norms = M.gradient_reach(model, ids, labels[:, -1])
    assert len(norms) == TASK.seq_len and all(math.isfinite(x) and x >= 0 for x in norms)
    assert norms[-1] > 0  # the first token still reaches the last prediction
    assert all(p.grad is None for p in model.parameters())
    if arch == "rnn":  # a random LSTM forgets: the gradient from 10 tokens back is far below the nearest
        assert norms[-1] < 0.1 * norms[0]


def test_gradient_reach_is_the_norm_of_the_embedding_gradient():
    model = tiny("rnn")
    ids = torch.randint(0, TASK.vocab_size, (1, 5), generator=torch.Generator().manual_seed(2))
    target = torch.tensor([3])
    emb = model.tok_embed(ids).detach().requires_grad_(True)
    h, _ = model.rnn(emb)
    loss = torch.nn.functional.cross_entropy(model.lm_logits(h)[:, -1], target)
    (grad,) = torch.autograd.grad(loss, emb)
    expected = grad[0].norm(dim=-1).flip(0).tolist()
    assert M.gradient_reach(model, ids, target) == pytest.approx(expected, rel=1e-5)


def test_recall_accuracy_per_distance_and_training_lowers_the_loss():
    model = tiny("decoder")
    g = torch.Generator().manual_seed(0)
    losses = M.train_steps(model, lambda: M.recall_loss(model, *recall_batch(TASK, 16, g)[:2]), 30, 1e-2)
    assert len(losses) == 30 and min(losses[-5:]) < losses[0]
    accuracy = M.recall_accuracy(model, TASK, 2, 8, seed=1)
    assert list(accuracy) == list(TASK.distances) and all(0 <= a <= 1 for a in accuracy.values())
    assert not model.training


def test_tokens_per_s_and_log_distances():
    assert M.train_tokens_per_s(tiny("rnn"), 8, 32, steps=1, reps=1) > 0
    assert M.log_distances(10) == [0, 1, 2, 3, 4, 6, 8, 9]
    assert M.log_distances(2) == [0, 1]


def record():
    rows = [{"n": n, "tokens_per_s": 1000.0 / i, "growth": float(i), "predicted_growth": 1.0, "sequential_steps": n}
            for i, n in enumerate((64, 128), start=1)]
    return {"models": {"lstm": {"params": 1000}, "transformer": {"params": 990}},
            "val_loss": {"lstm": 2.5, "transformer": 2.25},
            "throughput": {"ns": [64, 128], "lstm": rows, "transformer": rows},
            "recall": {"shown": [8], "lstm": [[8, 0.5]], "transformer": [[8, 1.0]]},
            "gradient_reach": {"distances": [0, 1, 8], "lstm": {"init": [1, 0.5, 0.01], "trained": [1, 0.5, 0.02]},
                               "transformer": {"init": [1, 0.1, 0.1], "trained": [1, 0.2, 0.2]}}}


def test_comparison_table_from_a_record():
    headers, rows = M.comparison_rows(record())
    assert headers == ["", "lstm", "transformer"]
    table = {r[0]: r[1:] for r in rows}
    assert table["parameters"] == ["1,000", "990"]
    assert table["validation loss (nats/char)"] == ["2.5", "2.25"]
    assert table["train tokens/s, n = 128"] == ["500", "500"]
    assert table["  time/token vs n = 64 (ledger FLOPs/token)"] == ["2.00x (1.00x)", "2.00x (1.00x)"]
    assert table["recall accuracy, k = 8"] == ["50%", "100%"]
    assert table["|dloss/dx| from 8 back, init -> trained"] == ["0.01 -> 0.02", "0.1 -> 0.2"]
    broken = record()
    del broken["val_loss"]
    with pytest.raises(KeyError):
        M.comparison_rows(broken)
