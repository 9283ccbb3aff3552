"""The objectives' batch sources: prefix LM scores only after each row's prefix; span corruption's batches
hold the sentinels at the top of the model's vocabulary and give back the text; same seed, same batches."""

import numpy as np
import torch

from tformer.core.config import ModelConfig
from tformer.data.objectives import span_uncorrupt
from tformer.model.base import IGNORE_INDEX
from tformer.train.objectives import text_objective

IDS = np.arange(5000) % 50


class _Tok:
    vocab_size, mask_id = 50, None

    def encode(self, text):
        return [49]


def test_prefix_lm_scores_only_after_the_prefix():
    config, source = text_objective("prefix-lm", _Tok(), IDS, IDS, 16, 0, ModelConfig(arch="decoder"))
    batch = source.next_batch(64)
    prefix = batch.inputs["prefix_length"]
    assert config.vocab_size == 50 and prefix.min() >= 1 and prefix.max() <= 15 and len(set(prefix.tolist())) > 5
    scored = batch.targets != IGNORE_INDEX
    want = torch.arange(16)[None, :] >= prefix[:, None] - 1  # position p-1 predicts the first token after it
    assert torch.equal(scored, want)
    assert torch.equal(batch.targets[scored], (batch.inputs["input_ids"] + 1)[scored] % 50)


def test_span_corruption_batches_give_back_the_text_and_repeat_on_a_seed():
    config, source = text_objective("span-corruption", _Tok(), IDS, IDS, 33, 0,
                                    ModelConfig(arch="encoder-decoder", n_decoder_layers=1))
    batch = source.next_batch(8)
    spans = config.vocab_size - 53  # pad, start, end, then one sentinel per span
    assert spans == 2 and config.decoder_start_token_id == 51
    for src, tgt in zip(batch.inputs["input_ids"], batch.targets):
        text = span_uncorrupt(src[:-1], tgt[:-1], config.vocab_size - 1, spans)  # less the [end] each ends in
        assert len(text) == 32 and torch.equal(text, (text[0] + torch.arange(32)) % 50)
    _, again = text_objective("span-corruption", _Tok(), IDS, IDS, 33, 0,
                              ModelConfig(arch="encoder-decoder", n_decoder_layers=1))
    assert torch.equal(again.next_batch(8).inputs["input_ids"], batch.inputs["input_ids"])
