"""Sentence-pair rows (tformer.data.pairs) and their batch source, on fixed seeds: labels balanced, NSP's IsNext
segments really follow in the stream, SOP's swapped ones are the stream's consecutive segments in reverse, rows
fill the window, segment ids, BERT masking at 15% and never on [CLS]/[SEP], same seed -> same batch."""

import numpy as np
import pytest
import torch

from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.data.pairs import draw_pair, pair_batch, pair_row
from tformer.model.base import IGNORE_INDEX
from tformer.train.objectives import resolve_objective, text_objective

STREAM = np.arange(20_000)  # every token is its own position: where a segment came from is readable off it
CLS, SEP = 100_000, 100_001
LENGTH = 37


def _batch(task, rows=2000, seed=0):
    return pair_batch(STREAM, rows, LENGTH, task, torch.Generator().manual_seed(seed), CLS, SEP)


def _segments(ids):
    """(first, second) content of a row [CLS] first [SEP] second [SEP]."""
    ids = ids.tolist()
    sep = ids.index(SEP)
    return ids[1:sep], ids[sep + 1:-1]


@pytest.mark.parametrize("task", ["nsp", "sop"])
def test_labels_are_balanced_and_rows_fill_the_window(task):
    batch = _batch(task)
    assert 0.46 < batch.labels.float().mean().item() < 0.54
    assert batch.input_ids.shape == (2000, LENGTH) and batch.token_type_ids.shape == (2000, LENGTH)
    assert (batch.input_ids[:, 0] == CLS).all() and (batch.input_ids[:, -1] == SEP).all()
    assert ((batch.input_ids == SEP).sum(1) == 2).all() and ((batch.input_ids == CLS).sum(1) == 1).all()
    splits = set()
    for ids, types in zip(batch.input_ids, batch.token_type_ids):
        first, second = _segments(ids)
        assert first and second and len(first) + len(second) == LENGTH - 3
        assert types.tolist() == [0] * (len(first) + 2) + [1] * (len(second) + 1)
        splits.add(len(first))
    assert len(splits) > LENGTH // 2  # the split point is random


def test_nsp_is_next_follows_and_not_next_comes_from_elsewhere():
    batch = _batch("nsp")
    for ids, label in zip(batch.input_ids, batch.labels.tolist()):
        first, second = _segments(ids)
        assert first == list(range(first[0], first[0] + len(first)))  # A is contiguous text
        assert second == list(range(second[0], second[0] + len(second)))
        if label == 0:
            assert second[0] == first[-1] + 1
        else:  # overlaps neither A nor the text that really follows it
            window = set(range(first[0], first[0] + LENGTH - 3))
            assert not window & set(second)


def test_sop_swapped_rows_are_the_consecutive_segments_in_reverse():
    batch = _batch("sop")
    for ids, label in zip(batch.input_ids, batch.labels.tolist()):
        first, second = _segments(ids)
        text = second + first if label == 1 else first + second
        assert text == list(range(text[0], text[0] + LENGTH - 3))


def test_same_seed_same_batch_other_seed_other_batch():
    a, b, c = _batch("nsp", 64, 3), _batch("nsp", 64, 3), _batch("nsp", 64, 4)
    assert torch.equal(a.input_ids, b.input_ids) and torch.equal(a.labels, b.labels)
    assert not torch.equal(a.input_ids, c.input_ids)


def test_one_row_from_a_draw():
    draw = draw_pair(len(STREAM), 8, "sop", torch.Generator().manual_seed(1))
    ids, types = pair_row(STREAM, draw, CLS, SEP)
    assert len(ids) == 8 and ids[0] == CLS and types.sum() == draw.second[1] - draw.second[0] + 1


class _Tok:
    vocab_size, mask_id, special_ids = 50, None, {}

    def encode(self, text):
        return [49]


IDS = np.arange(20_000) % 50
BERT = ModelConfig(arch="encoder", type_vocab_size=2, n_layers=1, d_model=16, n_heads=2, d_ff=32)


def test_source_masks_fifteen_percent_never_specials_and_sets_the_heads():
    config, source = text_objective("mlm+nsp", _Tok(), IDS, IDS, 40, 0, BERT)
    assert config.vocab_size == 53 and config.pooler and config.pair_head and config.lm_head
    cls_id, sep_id, mask_id = 50, 51, 52  # added above the tokenizer's vocabulary in that order
    batch = source.next_batch(512)
    ids, targets = batch.inputs["input_ids"], batch.targets
    scored = targets != IGNORE_INDEX
    assert (ids[:, 0] == cls_id).all() and ((ids == sep_id).sum(1) == 2).all()
    assert not scored[:, 0].any() and not scored[:, -1].any()
    assert 0.14 < scored.float().sum().item() / (512 * (40 - 3)) < 0.16
    assert 0.77 < (ids[scored] == mask_id).float().mean().item() < 0.83
    assert (ids[~scored] != mask_id).all() and (targets[scored] < 50).all()
    assert batch.pair_targets.shape == (512,) and set(batch.pair_targets.tolist()) == {0, 1}
    assert torch.equal(batch.inputs["token_type_ids"][:, 0], torch.zeros(512, dtype=torch.long))
    again = text_objective("mlm+nsp", _Tok(), IDS, IDS, 40, 0, BERT)[1].next_batch(512)
    assert torch.equal(again.inputs["input_ids"], ids) and torch.equal(again.pair_targets, batch.pair_targets)


def test_source_resumes_the_same_stream():
    _, source = text_objective("mlm+sop", _Tok(), IDS, IDS, 40, 0, BERT)
    source.next_batch(8)
    state = {k: v.clone() for k, v in source.state_dict().items()}
    want = source.next_batch(8)
    _, other = text_objective("mlm+sop", _Tok(), IDS, IDS, 40, 0, BERT)
    other.load_state_dict(state)
    got = other.next_batch(8)
    assert torch.equal(got.inputs["input_ids"], want.inputs["input_ids"]) and torch.equal(got.targets, want.targets)
    assert torch.equal(got.pair_targets, want.pair_targets)


@pytest.mark.parametrize("config, message", [
    (ModelConfig(arch="encoder", type_vocab_size=0), "--set type_vocab_size=2"),
    (ModelConfig(arch="encoder", type_vocab_size=1), "needs segment ids 0 and 1"),
    (ModelConfig(arch="decoder"), "trains an encoder-only model, but this is a decoder-only model"),
])
def test_a_model_without_segments_or_an_encoder_is_refused(config, message):
    with pytest.raises(TformerError, match=message):
        resolve_objective("mlm+nsp", config)


def test_too_short_a_window_or_stream_is_refused():
    with pytest.raises(TformerError, match="at least 5"):
        draw_pair(1000, 4, "nsp", torch.Generator())
    with pytest.raises(TformerError, match="fewer than 3 x --seq-len"):
        text_objective("mlm+nsp", _Tok(), IDS, IDS[:100], 40, 0, BERT)
