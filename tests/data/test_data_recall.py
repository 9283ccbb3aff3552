"""The long-range recall task: every query is the key shown k tokens earlier and is labelled with the
value that followed that key; the value is shown once; nothing else is labelled."""

import pytest
import torch

from tformer.core.errors import TformerError
from tformer.data.recall import IGNORE_INDEX, RecallTask, recall_batch

TASK = RecallTask(distances=(2, 5, 9), n_distractors=6, n_keys=3, n_values=4, prefix=3)


def test_each_query_is_answered_by_the_value_paired_with_the_key_k_tokens_earlier():
    ids, labels, queries = recall_batch(TASK, 64, torch.Generator().manual_seed(0))
    assert ids.shape == labels.shape == (64, TASK.seq_len) and TASK.seq_len == 3 + 9 + 1
    assert queries.shape == (64, 3)
    starts = set()
    for row in range(64):
        for j, k in enumerate(TASK.distances):
            q = int(queries[row, j])
            key, value = int(ids[row, q - k]), int(ids[row, q - k + 1])
            assert TASK.n_distractors <= key < TASK.first_value  # a key ...
            assert int(ids[row, q]) == key  # ... queried k tokens later
            assert TASK.first_value <= value < TASK.vocab_size and int(labels[row, q]) == value
        starts.add(int(queries[row, 0]) - TASK.distances[0])
        values = ids[row] >= TASK.first_value
        assert int(values.sum()) == 1  # the value is never shown again
        labelled = (labels[row] != IGNORE_INDEX).nonzero().flatten().tolist()
        assert labelled == queries[row].tolist()
    assert starts == {0, 1, 2, 3}  # the key's position varies over [0, prefix]


def test_fixed_prefix_puts_the_farthest_query_last_and_up_to_shortens_the_rows():
    _, labels, queries = recall_batch(TASK, 4, torch.Generator().manual_seed(1), prefix=TASK.prefix)
    assert (queries[:, -1] == TASK.seq_len - 1).all() and (labels[:, -1] != IGNORE_INDEX).all()
    short = TASK.up_to(5)
    assert short.distances == (2, 5) and short.seq_len == 3 + 5 + 1
    assert recall_batch(short, 2)[0].shape == (2, 9)


def test_same_generator_seed_same_batch():
    a = recall_batch(TASK, 8, torch.Generator().manual_seed(7))
    b = recall_batch(TASK, 8, torch.Generator().manual_seed(7))
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("bad", [{"distances": ()}, {"distances": (1, 4)}, {"distances": (4, 4)},
                                 {"n_values": 0}, {"prefix": -1}])
def test_bad_tasks_are_refused(bad):
    with pytest.raises(TformerError):
        RecallTask(**bad)


def test_bad_batches_are_refused():
    with pytest.raises(TformerError, match="at least one row"):
        recall_batch(TASK, 0)
    with pytest.raises(TformerError, match="prefix 4"):
        recall_batch(TASK, 1, prefix=4)
    with pytest.raises(TformerError, match="no recall distance"):
        TASK.up_to(1)
