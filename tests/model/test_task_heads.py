"""Task heads (tformer.model.task_heads) on their own: pooling reads only the real tokens (a padded row equals the
same row unpadded; the last token with left and right padding), TaskRunner's loss and accuracy counts, and bad
labels as one-line TformerErrors."""

from __future__ import annotations

import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.model import build
from tformer.model.runner_base import Batch
from tformer.model.runners import runner_for
from tformer.model.task_heads import TaskRunner, pool

PAD = 0


def _model(arch="encoder", task="sequence-classification", **kw):
    kw = dict(arch=arch, task=task, n_layers=2, d_model=12, n_heads=3, d_ff=17, vocab_size=23, max_positions=16,
              pad_token_id=PAD) | ({"n_classes": 3} if task != "question-answering" else {}) | kw
    if arch == "encoder":
        kw.setdefault("lm_head", False)
    torch.manual_seed(0)
    return build(ModelConfig.from_dict(kw)).eval()


def _row(n=5, seed=3):
    return torch.randint(1, 23, (1, n), generator=torch.Generator().manual_seed(seed))


def _padded(row, pads: int, side: str):
    ids = torch.full((1, row.shape[1] + pads), PAD)
    mask = torch.zeros_like(ids)
    where = slice(pads, None) if side == "left" else slice(0, row.shape[1])
    ids[:, where], mask[:, where] = row, 1
    return ids, mask


@pytest.mark.parametrize("arch", ["encoder", "decoder"])
def test_mean_pooling_ignores_padding(arch):
    model, row = _model(arch, pooling="mean"), _row()
    ids, mask = _padded(row, 3, "right")
    with torch.no_grad():
        alone = model(row).logits
        padded = model(torch.cat([ids, ids]), attention_mask=torch.cat([mask, mask])).logits
    torch.testing.assert_close(padded, alone.expand(2, -1), atol=1e-6, rtol=0)


@pytest.mark.parametrize("side", ["right", "left"])
def test_last_pooling_reads_the_last_real_token(side):
    model, row = _model("decoder", pooling="last"), _row()
    ids, mask = _padded(row, 2, side)
    # left padding: the real tokens keep their positions 0..n-1, as a generation-ready decoder numbers them
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        alone = model(row).logits
        padded = model(ids, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(padded, alone, atol=1e-6, rtol=0)


def test_pool_picks_the_rows_vectors():
    h = torch.arange(2 * 4 * 1, dtype=torch.float).reshape(2, 4, 1)  # each position's state is its index
    mask = torch.tensor([[1, 1, 0, 0], [0, 1, 1, 1]])  # right-padded, left-padded
    ids = torch.where(mask.bool(), 5, PAD)
    assert pool(h, "last", mask, ids, PAD).flatten().tolist() == [1.0, 7.0]
    assert pool(h, "last", mask, None, None).flatten().tolist() == [1.0, 7.0]  # the mask alone
    assert pool(h, "mean", mask, ids, PAD).flatten().tolist() == [0.5, 6.0]
    assert pool(h, "cls", mask, ids, PAD).flatten().tolist() == [0.0, 4.0]
    assert pool(h, "last", None, None, None).flatten().tolist() == [3.0, 7.0]  # no padding known: the last column


def test_runner_is_a_task_runner_that_does_not_generate():
    runner = runner_for(_model())
    assert isinstance(runner, TaskRunner) and not runner.generates and runner.objective == "sequence-classification"


@pytest.mark.parametrize("task,targets", [
    ("sequence-classification", torch.tensor([0, 2, 1])),
    ("token-classification", torch.tensor([[0, 1, -100, 2], [2, -100, -100, 1], [1, 1, 0, 0]])),
    ("question-answering", torch.tensor([[0, 1], [2, 3], [1, 1]])),
])
def test_runner_loss_and_accuracy_counts(task, targets):
    model = _model(task=task)
    runner = runner_for(model)
    ids = torch.randint(1, 23, (3, 4), generator=torch.Generator().manual_seed(1))
    scored = runner.scored(Batch({"input_ids": ids}, targets))
    loss = runner.loss(Batch({"input_ids": ids}, targets))
    with torch.no_grad():
        out = model(ids)
    if task == "question-answering":
        hit = (out.start_logits.argmax(-1) == targets[:, 0]) & (out.end_logits.argmax(-1) == targets[:, 1])
        expected = [int(hit.sum()), 3]
    else:
        kept = targets != -100
        expected = [int(((out.logits.argmax(-1) == targets) & kept).sum()), int(kept.sum())]
    assert [scored.right, scored.rows] == expected and expected[1] == (9 if task == "token-classification" else 3)
    assert loss.ndim == 0 and loss.item() > 0 and scored.loss.item() == loss.item()


def test_regression_counts_no_accuracy_and_scores_mse():  # no right answers to count: the loop then shows no accuracy
    model = _model(n_classes=1)
    targets = torch.tensor([0.5, -1.0])
    ids = torch.randint(1, 23, (2, 4), generator=torch.Generator().manual_seed(2))
    scored = runner_for(model).scored(Batch({"input_ids": ids}, targets))
    loss = scored.loss
    with torch.no_grad():
        expected = ((model(ids).logits.squeeze(-1) - targets) ** 2).mean()
    assert scored.rows == 0 and loss.item() == pytest.approx(expected.item(), rel=1e-6)


def _one_line_error(call, words):
    with pytest.raises(TformerError, match=words) as err:
        call()
    assert "\n" not in str(err.value)


def test_label_beyond_the_classes_is_one_line():
    model, ids = _model(), _row()
    _one_line_error(lambda: model(ids, labels=torch.tensor([3])), r"label 3 is outside the head's 3 classes")


def test_labels_to_an_answer_head_is_one_line():
    model, ids = _model(task="question-answering"), _row()
    _one_line_error(lambda: model(ids, labels=torch.tensor([1])), "start_positions and end_positions")


def test_float_labels_of_the_wrong_shape_are_one_line():
    model, ids = _model(), _row()
    _one_line_error(lambda: model(ids, labels=torch.tensor([1.0])), "not whole class ids")
    model(ids, labels=torch.tensor([[1.0, 0.0, 1.0]]))  # one float per class: multi-label, accepted


def test_label_smoothing_on_a_head_is_one_line():
    runner, ids = runner_for(_model()), _row()
    _one_line_error(lambda: runner.loss(Batch({"input_ids": ids}, torch.tensor([1])), label_smoothing=0.1),
                    "label smoothing")
