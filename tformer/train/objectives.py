"""`tformer train --objective NAME`: the pretraining objectives, which architecture each trains, and the
batch source that makes its data.

Without --objective a model trains on its architecture's own objective (causal, mlm, seq2seq). The
others corrupt windows of a plain-text token stream:

    span-corruption  T5: 15% of tokens in spans of mean length 3, each span -> one sentinel (enc-dec)
    denoise          BART: sentence permutation, then Poisson(3) spans -> one mask each (enc-dec)
    prefix-lm        a decoder sees a random prefix bidirectionally and predicts the rest (decoder)
    mlm+nsp          BERT: [CLS] A [SEP] B [SEP], masked tokens + is B the text after A? (encoder)
    mlm+sop          ALBERT: the same rows from two consecutive segments + are they swapped? (encoder)

The sentence-pair objectives switch on the heads they train (pooler and 2-class pair head, with the MLM
head), as Hugging Face's BertForPreTraining / AlbertForPreTraining always have them; they need two
segment ids (type_vocab_size >= 2), which a RoBERTa or DistilBERT config lacks.

Ids the tokenizer lacks (pad, start, end, mask, T5's sentinels) are added above its vocabulary, so
the model's vocabulary is the tokenizer's plus those; the sentinels take the very top ids, as in T5
(<extra_id_0> = vocab_size - 1, downward).
"""

from __future__ import annotations

import inspect

from tformer.core.errors import TformerError
from tformer.core.objectives import (  # noqa: F401 (the objectives' facts, re-exported for the train layer)
    OBJECTIVES,
    PAIR_OBJECTIVES,
    PREFIX_KINDS,
    TEXT_OBJECTIVES,
    Objective,
    pair_heads,
    resolve_objective,
    span_counts,
)
from tformer.data.mlm import mask_tokens
from tformer.data.objectives import infill, permute_sentences, span_corrupt
from tformer.model import model_class
from tformer.train.sources import CorruptedTextSource, PrefixLMSource, SentencePairSource

SENTENCE_END = "."


def text_objective(name: str, tok, train_ids, val_ids, seq_len: int, seed: int, config):
    """(config with its vocabulary and special ids set, batch source) for one of TEXT_OBJECTIVES."""
    base = tok.vocab_size
    if name in PAIR_OBJECTIVES:
        return _pair_objective(name, tok, train_ids, val_ids, seq_len, seed, config)
    if name == "prefix-lm":
        config = config.replace(vocab_size=base)
        if "prefix_length" not in inspect.signature(model_class(config.arch).forward).parameters:
            raise TformerError(f"{config.arch} models take no prefix mask; prefix-lm trains a Transformer decoder "
                               "(arch decoder)")
        return config, PrefixLMSource(train_ids, val_ids, seq_len, seed)
    # Encoder-decoder objectives: the decoder reads [start] + target and predicts target + [end], so a
    # window of seq_len - 1 tokens keeps both within the model's positions.
    window = seq_len - 1
    pad, start, end = base, base + 1, base + 2
    if name == "span-corruption":
        noise, spans = span_counts(window)
        vocab = base + 3 + spans
        top = vocab - 1

        def corrupt(row, generator):
            return span_corrupt(row, top, generator)

        target_len = noise + spans
    else:
        mask_id = tok.mask_id if tok.mask_id is not None else base + 3
        vocab = base + 3 + (tok.mask_id is None)
        end_ids = tok.encode(SENTENCE_END)
        sentence_end = end_ids[0] if len(end_ids) == 1 else None  # no single-token full stop: no permutation

        def corrupt(row, generator):
            source = infill(permute_sentences(row, sentence_end, generator), mask_id, generator)
            return source[:window], row  # zero-length spans can lengthen a row: keep it within the positions

        target_len = window
    config = config.replace(vocab_size=vocab, pad_token_id=pad, bos_token_id=start, eos_token_id=end,
                            decoder_start_token_id=start)
    source = CorruptedTextSource(train_ids, val_ids, window, seed, corrupt, pad, start, end, target_len)
    return config, source


def _pair_objective(name, tok, train_ids, val_ids, seq_len, seed, config):
    """mlm+nsp / mlm+sop: [CLS], [SEP] (the tokenizer's, else its start / end tokens) and [MASK]; each one
    the tokenizer lacks is added above its vocabulary."""
    base, specials = tok.vocab_size, getattr(tok, "special_ids", {})
    wanted = [specials.get("cls", getattr(tok, "bos_id", None)), specials.get("sep", getattr(tok, "eos_id", None)),
              tok.mask_id]
    ids, vocab = [], base
    for have in wanted:
        ids.append(vocab if have is None else have)
        vocab += have is None
    cls_id, sep_id, mask_id = ids

    def mask_fn(rows, generator):  # random replacements come from the text's own tokens, never an added id
        return mask_tokens(rows, mask_id, base, generator, special_ids=(cls_id, sep_id, getattr(tok, "pad_id", None)))

    config = pair_heads(config).replace(vocab_size=vocab)
    return config, SentencePairSource(train_ids, val_ids, seq_len, seed, PAIR_OBJECTIVES[name], cls_id, sep_id, mask_fn)
