"""BERT's and ALBERT's pretraining heads against Hugging Face BertForPreTraining / AlbertForPreTraining: the MLM
and pair (NSP / SOP) logits within 1e-5, the total loss (masked tokens + pair class) equal to HF's, and the
BertForPreTraining folder saved back. Tiny random configs with odd sizes; no downloads."""

from __future__ import annotations

import json

import pytest
import torch

import tformer
from tformer.model import build
from tformer.model.runners import Batch, runner_for
from tformer.train.objectives import pair_heads

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

TOL = 1e-5
VOCAB = 97


def _bert():
    return transformers.BertConfig(num_hidden_layers=2, hidden_size=36, num_attention_heads=4, intermediate_size=44,
                                   vocab_size=VOCAB, max_position_embeddings=19, type_vocab_size=2)


def _albert():
    return transformers.AlbertConfig(num_hidden_layers=3, hidden_size=36, embedding_size=14, num_attention_heads=4,
                                     intermediate_size=44, vocab_size=VOCAB, max_position_embeddings=17)


CASES = {"bert": (_bert, "BertForPreTraining", "next_sentence_label", "seq_relationship_logits"),
         "albert": (_albert, "AlbertForPreTraining", "sentence_order_label", "sop_logits")}


def _reference(name):
    make, cls, _, _ = CASES[name]
    torch.manual_seed(0)
    model = getattr(transformers, cls)._from_config(make(), attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def _inputs(seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (3, 9), generator=g)
    types = (torch.arange(9)[None, :] >= torch.tensor([[4], [6], [2]])).long()
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[2, 7:] = 0
    labels = torch.full((3, 9), -100)
    labels[:, 2] = ids[:, 2]
    labels[0, 5] = ids[0, 5]
    return {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}, labels, torch.tensor([0, 1, 1])


@pytest.fixture(scope="module", params=list(CASES))
def pair(request, tmp_path_factory):
    ref = _reference(request.param)
    path = tmp_path_factory.mktemp(request.param)
    ref.save_pretrained(path)
    return request.param, ref, tformer.load_hf(path)


def _compare(name, ours, ref):
    _, _, label_name, pair_logits = CASES[name]
    inputs, labels, pair_labels = _inputs()
    with torch.no_grad():
        a = ours(**inputs, labels=labels, pair_labels=pair_labels)
        b = ref(**inputs, labels=labels, **{label_name: pair_labels})
        runner_loss = runner_for(ours).loss(Batch(inputs, labels, pair_labels))
    keep = inputs["attention_mask"].bool()
    assert (a.logits - b.prediction_logits).abs()[keep].max().item() <= TOL
    assert (a.pair_logits - getattr(b, pair_logits)).abs().max().item() <= TOL
    assert abs(a.loss.item() - b.loss.item()) <= TOL
    assert abs(runner_loss.item() - b.loss.item()) <= TOL


def test_pretraining_heads_and_loss_equal_hf(pair):
    name, ref, ours = pair
    assert (ours.config.pooler, ours.config.pair_head, ours.config.lm_head) == (True, True, True)
    assert ours.num_parameters() == sum(p.numel() for p in ref.parameters())
    _compare(name, ours, ref)


def test_pretraining_folder_saves_back(pair, tmp_path):
    name, _, ours = pair
    tformer.save_hf(ours, tmp_path)
    cls = CASES[name][1]
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == [cls]
    back = getattr(transformers, cls).from_pretrained(tmp_path, attn_implementation="eager").eval()
    _compare(name, ours, back)
    again = tformer.load_hf(tmp_path)
    assert again.config == ours.config.replace(name=again.config.name)


def test_a_config_that_trains_mlm_nsp_saves_as_bert_for_pretraining(tmp_path):
    """What `tformer train --objective mlm+nsp` builds is a BertForPreTraining."""
    config = pair_heads(tformer.preset("bert-base", n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=VOCAB))
    torch.manual_seed(0)
    ours = build(config).eval()
    tformer.save_hf(ours, tmp_path)
    back = transformers.BertForPreTraining.from_pretrained(tmp_path, attn_implementation="eager").eval()
    _compare("bert", ours, back)
