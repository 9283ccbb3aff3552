"""The objectives' batch sources: prefix LM scores only after each row's prefix; span corruption's batches
hold the sentinels at the top of the model's vocabulary and give back the text; same seed, same batches."""

import numpy as np
import torch

from tformer.core.config import ModelConfig
from tformer.data.mlm import mask_tokens
from tformer.data.objectives import span_uncorrupt
from tformer.model.base import IGNORE_INDEX
from tformer.train.objectives import text_objective
from tformer.train.sources import MaskedLMSource

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


def test_mlm_masks_dynamically_a_new_mask_each_time_the_same_text_is_seen():
    """RoBERTa's dynamic masking: MaskedLMSource masks each window when it is drawn, from the sampler's
    generator, so the same text seen again (the next epoch) gets a new mask, and a seed repeats them all."""
    same_text = np.full(4000, 7)  # every window holds the same text, so two draws are two epochs of it

    def source():
        return MaskedLMSource(same_text, same_text, 64, 3,
                              lambda ids, g: mask_tokens(ids, 1, 50, g))

    first, second = source(), source()
    epochs = [first.next_batch(16) for _ in range(2)]
    assert not torch.equal(epochs[0].targets != IGNORE_INDEX, epochs[1].targets != IGNORE_INDEX)
    again = [second.next_batch(16) for _ in range(2)]
    for a, b in zip(epochs, again):
        assert torch.equal(a.inputs["input_ids"], b.inputs["input_ids"]) and torch.equal(a.targets, b.targets)
