"""Hugging Face weight names of the encoder families: BERT, RoBERTa, DistilBERT, ALBERT.

Each table pairs a checkpoint tensor with ours (see tformer.interop.hf_rules); ``encoder_heads``
reads off the tensors which heads a file has (config.json does not say), and ``segment_fill``
gives the zero segment row a file needs when our model has no segment table.
"""

from __future__ import annotations

import torch

from tformer.interop.hf_rules import Alias, Rule, linear_rules, norm_rules, with_head


def _embeddings(c, e: str, segments: bool = True) -> list[Rule]:
    """word, position (and segment) tables, then their LayerNorm: one naming in all four families."""
    rules = [Rule(f"{e}.word_embeddings.weight", ("tok_embed.weight",)),
             Rule(f"{e}.position_embeddings.weight", ("encoder.positions.weight",))]
    if segments and c.type_vocab_size:
        rules.append(Rule(f"{e}.token_type_embeddings.weight", ("type_embed.weight",)))
    return rules + norm_rules(f"{e}.LayerNorm", "encoder.embed_norm", c)


def _layer(c, h: str, o: str, names: tuple[str, ...]) -> list[Rule]:
    """One post-norm layer: ``names`` are the HF names of q, k, v, o, attn_norm, up, down, mlp_norm."""
    ours = ("attn.q_proj", "attn.k_proj", "attn.v_proj", "attn.o_proj", "attn_norm", "mlp.up", "mlp.down", "mlp_norm")
    rules: list[Rule] = []
    for hf_name, mine in zip(names, ours):
        rules += (norm_rules(f"{h}.{hf_name}", f"{o}.{mine}", c) if mine.endswith("norm")
                  else linear_rules(f"{h}.{hf_name}", f"{o}.{mine}", True))
    return rules


def _mlm_head(c, rules, head: str, names: tuple[str, str, str], embedding: str):
    """dense, norm, bias (names[0..2] under ``head``), decoder weight tied to ``embedding``."""
    dense, norm, bias = names
    rules = rules + linear_rules(f"{head}{dense}", "mlm_head.dense", True)
    rules += norm_rules(f"{head}{norm}", "mlm_head.norm", c)
    rules.append(Rule(f"{head}{bias}", ("mlm_head.decoder.bias",)))
    aliases = [Alias(f"{head}decoder.bias", f"{head}{bias}")] if bias != "decoder.bias" else []
    rules, head_aliases = with_head(rules, c, f"{head}decoder.weight", embedding, ours="mlm_head.decoder.weight")
    return rules, aliases + head_aliases


_BERT_LAYER = ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
               "attention.output.LayerNorm", "intermediate.dense", "output.dense", "output.LayerNorm")


def _bert_body(c, p: str) -> list[Rule]:
    rules = _embeddings(c, f"{p}embeddings")
    for i in range(c.n_layers):
        rules += _layer(c, f"{p}encoder.layer.{i}", f"encoder.layers.{i}", _BERT_LAYER)
    if c.pooler:
        rules += linear_rules(f"{p}pooler.dense", "pooler.dense", True)
    return rules


def bert_rules(c, p: str) -> tuple[list[Rule], list[Alias]]:
    rules = _bert_body(c, p)
    if c.pair_head:  # BertForPreTraining's next-sentence head
        rules += linear_rules("cls.seq_relationship", "pair_head", True)
    if not c.lm_head:
        return rules, []
    return _mlm_head(c, rules, "cls.predictions.", ("transform.dense", "transform.LayerNorm", "bias"),
                     f"{p}embeddings.word_embeddings.weight")


def roberta_rules(c, p: str) -> tuple[list[Rule], list[Alias]]:
    """BERT's body; the head is lm_head.{dense, layer_norm, bias, decoder}."""
    rules = _bert_body(c, p)
    if not c.lm_head:
        return rules, []
    return _mlm_head(c, rules, "lm_head.", ("dense", "layer_norm", "bias"), f"{p}embeddings.word_embeddings.weight")


def distilbert_rules(c, p: str) -> tuple[list[Rule], list[Alias]]:
    """No segments, no pooler; q_lin ... out_lin, sa/output layer norms, ffn.lin1/lin2, vocab_* head."""
    rules = _embeddings(c, f"{p}embeddings", segments=False)
    names = ("attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin", "sa_layer_norm",
             "ffn.lin1", "ffn.lin2", "output_layer_norm")
    for i in range(c.n_layers):
        rules += _layer(c, f"{p}transformer.layer.{i}", f"encoder.layers.{i}", names)
    if not c.lm_head:
        return rules, []
    rules += linear_rules("vocab_transform", "mlm_head.dense", True)
    rules += norm_rules("vocab_layer_norm", "mlm_head.norm", c)
    rules.append(Rule("vocab_projector.bias", ("mlm_head.decoder.bias",)))
    return with_head(rules, c, "vocab_projector.weight", f"{p}embeddings.word_embeddings.weight",
                     ours="mlm_head.decoder.weight")


def albert_rules(c, p: str) -> tuple[list[Rule], list[Alias]]:
    """Tables of width E, the E -> d projection, one layer group per distinct layer (one when shared)."""
    rules = _embeddings(c, f"{p}embeddings")
    rules += linear_rules(f"{p}encoder.embedding_hidden_mapping_in", "encoder.embed_proj", True)
    names = ("attention.query", "attention.key", "attention.value", "attention.dense", "attention.LayerNorm",
             "ffn", "ffn_output", "full_layer_layer_norm")
    for g in range(1 if c.share_layers else c.n_layers):
        rules += _layer(c, f"{p}encoder.albert_layer_groups.{g}.albert_layers.0", f"encoder.layers.{g}", names)
    if c.pooler:
        rules += linear_rules(f"{p}pooler", "pooler.dense", True)
    if c.pair_head:
        rules += linear_rules("sop_classifier.classifier", "pair_head", True)
    if not c.lm_head:
        return rules, []
    return _mlm_head(c, rules, "predictions.", ("dense", "LayerNorm", "bias"), f"{p}embeddings.word_embeddings.weight")


ENCODER_FAMILIES = {"bert": bert_rules, "roberta": roberta_rules, "distilbert": distilbert_rules,
                    "albert": albert_rules}
# The outer prefix of the task classes (BertForMaskedLM -> "bert."); the bare models have none.
ENCODER_PREFIX = {"bert": "bert.", "roberta": "roberta.", "distilbert": "distilbert.", "albert": "albert."}
# (embedding, tied head) without prefix, to spot an untied head in a file.
ENCODER_EMBEDDING = {t: ("embeddings.word_embeddings.weight", head) for t, head in (
    ("bert", "cls.predictions.decoder.weight"), ("roberta", "lm_head.decoder.weight"),
    ("distilbert", "vocab_projector.weight"), ("albert", "predictions.decoder.weight"))}
# Which heads a file holds, told by its tensors: (MLM head prefix, pooler weight under the body prefix,
# pair head weight or None).
_HEADS = {"bert": ("cls.predictions.", "pooler.dense.weight", "cls.seq_relationship.weight"),
          "roberta": ("lm_head.", "pooler.dense.weight", None),
          "distilbert": ("vocab_", None, None),
          "albert": ("predictions.", "pooler.weight", "sop_classifier.classifier.weight")}


def encoder_heads(model_type: str, keys, prefix: str) -> dict[str, bool]:
    """The config fields the tensors decide: lm_head, pooler and pair_head (config.json cannot say)."""
    mlm, pooler, pair = _HEADS[model_type]
    keys = set(keys)
    return dict(lm_head=any(k.startswith(mlm) for k in keys),
                pooler=pooler is not None and f"{prefix}{pooler}" in keys,
                pair_head=pair is not None and pair in keys)


def segment_fill(config, model_type: str, prefix: str, dtype) -> dict[str, torch.Tensor]:
    """BERT, RoBERTa and ALBERT files always hold a segment table: one zero row adds nothing."""
    if model_type in ("bert", "roberta", "albert") and not config.type_vocab_size:
        width = config.embed_dim or config.d_model
        return {f"{prefix}embeddings.token_type_embeddings.weight": torch.zeros(1, width, dtype=dtype)}
    return {}
