"""What each pretraining objective (`tformer train --objective NAME`) is, which architecture it trains and
what it changes in the model it trains: the facts `tformer train` and `tformer count --objective` share
(no torch, so the cost commands stay fast). The data pipelines live in tformer.data and tformer.train.

``objective_config`` is the model an objective trains, for a tokenizer that has none of the special ids
(tformer train's default char tokenizer): the ids it adds enlarge the embedding and the LM head (T5's
sentinels, BART's mask, BERT's [CLS]/[SEP]/[MASK]); mlm+nsp / mlm+sop switch on the pooler, the 2-class
pair head and the MLM head.
"""

from __future__ import annotations

from dataclasses import dataclass

from tformer.core.errors import TformerError

NOISE_DENSITY = 0.15  # T5's span corruption: the fraction of tokens that are noise
MEAN_SPAN = 3.0  # ... and the mean noise span length
ENC_DEC_SPECIALS = 3  # pad, start, end: added for span-corruption and denoise
PAIR_SPECIALS = 3  # [CLS], [SEP], [MASK]: added for mlm+nsp / mlm+sop


# Kinds that read the whole mask (its dense bias), so a prefix LM's mask is honoured; the others read
# mask.causal and would treat the prefix as causal.
PREFIX_KINDS = ("sdpa", "reference")


@dataclass(frozen=True)
class Objective:
    # the architecture it trains: "decoder" (decoder-only), "encoder" (encoder-only), "encoder-decoder", or for the
    # image objectives the one architecture whose own objective it is ("vit", "clip")
    needs: str
    summary: str
    adds: str = ""  # heads it switches on in the model it trains (said in the run's first line)


OBJECTIVES = {
    "causal": Objective("decoder", "next-token prediction"),
    "mlm": Objective("encoder", "BERT's masked tokens (a new mask every time a window is drawn)"),
    "seq2seq": Objective("encoder-decoder", "translation pairs, teacher forcing"),
    "span-corruption": Objective("encoder-decoder", "T5: noise spans -> sentinels, target = sentinels + spans"),
    "denoise": Objective("encoder-decoder", "BART: sentence permutation + text infilling, target = the text"),
    "prefix-lm": Objective("decoder", "bidirectional over a random prefix, causal after; loss after the prefix"),
    "mlm+nsp": Objective("encoder", "BERT: masked tokens + next-sentence prediction on [CLS] A [SEP] B [SEP]",
                         "pooler + 2-class pair head + MLM head switched on"),
    "mlm+sop": Objective("encoder", "ALBERT: masked tokens + sentence-order prediction on [CLS] A [SEP] B [SEP]",
                         "pooler + 2-class pair head + MLM head switched on"),
    "image-classification": Objective("vit", "ViT: the class of each image, from the [CLS] state (--data digits or an "
                                             "image folder)"),
    "contrastive": Objective("clip", "CLIP: images and captions of their class meet in one embedding space "
                                     "(symmetric InfoNCE)"),
}
IMAGE_OBJECTIVES = ("image-classification", "contrastive")  # the own objectives of the architectures that read images
PAIR_OBJECTIVES = {"mlm+nsp": "nsp", "mlm+sop": "sop"}  # objective -> tformer.data.pairs task
# built here; the others in setup.build_run
TEXT_OBJECTIVES = ("span-corruption", "denoise", "prefix-lm", *PAIR_OBJECTIVES)
_FIX = {"decoder": "a decoder-only model (e.g. --preset gpt2)",
        "encoder": "an encoder-only model (e.g. --preset bert-base)",
        "encoder-decoder": "an encoder-decoder model (e.g. --preset t5-small or bart-base)",
        "vit": "a vision Transformer (e.g. --preset vit-digits)",
        "clip": "an image-text model (e.g. --preset clip-digits)"}


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
    own = config.traits.objective
    if (name in IMAGE_OBJECTIVES or own in IMAGE_OBJECTIVES) and name != own:
        fix = f"--task {own} (its own), or {_FIX[needs]}" if own in IMAGE_OBJECTIVES else _FIX[needs]
        raise TformerError(f"--task/--objective {name} does not fit {config.traits.label}; use {fix}")
    if name in IMAGE_OBJECTIVES:
        return name
    if _kind(config) != needs or (needs == "decoder" and config.traits.objective != "causal"):
        raise TformerError(f"--objective {name} trains {_FIX[needs].split(' (')[0]}, but this is "
                           f"{config.traits.label}; use {_FIX[needs]} or another --objective")
    if name == "prefix-lm" and config.attn_impl not in PREFIX_KINDS:
        raise TformerError(f"prefix-lm needs an attention kind that reads the full mask ({', '.join(PREFIX_KINDS)}), "
                           f"not {config.attn_impl}; --set attn_impl=sdpa")
    if name in PAIR_OBJECTIVES and config.type_vocab_size < 2:
        raise TformerError(f"--objective {name} needs segment ids 0 and 1, but this config has type_vocab_size "
                           f"{config.type_vocab_size}; --set type_vocab_size=2 (or train RoBERTa-style with mlm)")
    return name


def pair_heads(config):
    """The model a sentence-pair objective trains: ``config`` with the MLM head, pooler and pair head on."""
    return config.replace(lm_head=True, pooler=True, pair_head=True)


def span_counts(length: int, noise_density: float = NOISE_DENSITY, mean_span: float = MEAN_SPAN) -> tuple[int, int]:
    """(noise tokens, noise spans) of a row of ``length`` tokens: fixed by the length, as in T5."""
    if length < 2:
        raise TformerError(f"span corruption needs rows of at least 2 tokens; got {length}: raise --seq-len")
    noise = min(max(round(length * noise_density), 1), length - 1)
    return noise, max(round(noise / mean_span), 1)


def objective_config(name: str, config, seq_len: int):
    """The config ``tformer train --objective name --seq-len seq_len`` builds from ``config`` (whose
    vocab_size is the tokenizer's), for a tokenizer with none of the special ids. Refuses as train does."""
    name = resolve_objective(name, config)
    base = config.vocab_size
    if name == "mlm":
        return config.replace(lm_head=True, pair_head=False)
    if name in PAIR_OBJECTIVES:
        return pair_heads(config).replace(vocab_size=base + PAIR_SPECIALS)
    if name == "span-corruption":
        return config.replace(vocab_size=base + ENC_DEC_SPECIALS + span_counts(seq_len - 1)[1])
    if name == "denoise":
        return config.replace(vocab_size=base + ENC_DEC_SPECIALS + 1)  # + BART's <mask>
    return config  # causal, seq2seq, prefix-lm: nothing added
