"""`tformer train --objective NAME`: the pretraining objectives, which architecture each trains, and the
batch source that makes its data.

Without --objective a model trains on its architecture's own objective (causal, mlm, seq2seq). The
others corrupt windows of a plain-text token stream:

    span-corruption  T5: 15% of tokens in spans of mean length 3, each span -> one sentinel (enc-dec)
    denoise          BART: sentence permutation, then Poisson(3) spans -> one mask each (enc-dec)
    prefix-lm        a decoder sees a random prefix bidirectionally and predicts the rest (decoder)

Ids the tokenizer lacks (pad, start, end, mask, T5's sentinels) are added above its vocabulary, so
the model's vocabulary is the tokenizer's plus those; the sentinels take the very top ids, as in T5
(<extra_id_0> = vocab_size - 1, downward).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

from tformer.core.errors import TformerError
from tformer.data.objectives import infill, permute_sentences, span_corrupt, span_counts
from tformer.model import ARCHITECTURES
from tformer.train.sources import CorruptedTextSource, PrefixLMSource

# Kinds that read the whole mask (its dense bias), so a prefix LM's mask is honoured; the others read
# mask.causal and would treat the prefix as causal.
PREFIX_KINDS = ("sdpa", "reference")
SENTENCE_END = "."


@dataclass(frozen=True)
class Objective:
    needs: str  # the architecture it trains: "decoder" (decoder-only), "encoder" (encoder-only), "encoder-decoder"
    summary: str


OBJECTIVES = {
    "causal": Objective("decoder", "next-token prediction"),
    "mlm": Objective("encoder", "BERT's masked tokens (a new mask every time a window is drawn)"),
    "seq2seq": Objective("encoder-decoder", "translation pairs, teacher forcing"),
    "span-corruption": Objective("encoder-decoder", "T5: noise spans -> sentinels, target = sentinels + spans"),
    "denoise": Objective("encoder-decoder", "BART: sentence permutation + text infilling, target = the text"),
    "prefix-lm": Objective("decoder", "bidirectional over a random prefix, causal after; loss after the prefix"),
}
TEXT_OBJECTIVES = ("span-corruption", "denoise", "prefix-lm")  # built here; the others in setup.build_run
_FIX = {"decoder": "a decoder-only model (e.g. --preset gpt2)",
        "encoder": "an encoder-only model (e.g. --preset bert-base)",
        "encoder-decoder": "an encoder-decoder model (e.g. --preset t5-small or bart-base)"}


def _kind(config) -> str:
    traits = config.traits
    return "encoder-decoder" if traits.seq2seq else "decoder" if traits.decoder else "encoder"


def resolve_objective(name: str | None, config) -> str:
    """The objective to train ``config`` on: its architecture's own when ``name`` is None; an unknown name or
    one the architecture cannot train is a TformerError naming the problem and the fix."""
    if name is None:
        return config.traits.objective
    if name not in OBJECTIVES:
        raise TformerError(f"unknown objective {name!r}; choose one of {', '.join(OBJECTIVES)}")
    needs = OBJECTIVES[name].needs
    if _kind(config) != needs or (needs == "decoder" and config.traits.objective != "causal"):
        raise TformerError(f"--objective {name} trains {_FIX[needs].split(' (')[0]}, but this is "
                           f"{config.traits.label}; use {_FIX[needs]} or another --objective")
    if name == "prefix-lm" and config.attn_impl not in PREFIX_KINDS:
        raise TformerError(f"prefix-lm needs an attention kind that reads the full mask ({', '.join(PREFIX_KINDS)}), "
                           f"not {config.attn_impl}; --set attn_impl=sdpa")
    return name


def text_objective(name: str, tok, train_ids, val_ids, seq_len: int, seed: int, config):
    """(config with its vocabulary and special ids set, batch source) for one of TEXT_OBJECTIVES."""
    base = tok.vocab_size
    if name == "prefix-lm":
        config = config.replace(vocab_size=base)
        if "prefix_length" not in inspect.signature(ARCHITECTURES[config.arch].forward).parameters:
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
