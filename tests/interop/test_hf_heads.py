"""tformer's task heads equal Hugging Face's BertForSequenceClassification, BertForTokenClassification,
BertForQuestionAnswering, GPT2ForSequenceClassification (and LlamaForSequenceClassification): logits and loss
within 1e-5, both ways (an HF folder through tformer.load_hf; a tformer model through save_hf and HF's
AutoModelFor*.from_pretrained with no missing or unexpected key). Tiny random configs with odd sizes (d 36, d_ff
44, vocab 97); every batch has a padded row and its attention mask."""

from __future__ import annotations

import json

import pytest
import torch

import tformer
from tformer.core.errors import TformerError
from tformer.interop.hf_config import config_to_hf
from tformer.model import build

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()

TOL = 1e-5
VOCAB, B, T, PAD = 97, 3, 7, 0


def _bert(**kw):
    kw = dict(num_hidden_layers=2, hidden_size=36, num_attention_heads=4, intermediate_size=44, vocab_size=VOCAB,
              max_position_embeddings=19, type_vocab_size=2) | kw
    return transformers.BertConfig(**kw)


def _gpt2(**kw):
    kw = dict(n_layer=2, n_embd=36, n_head=4, n_inner=44, vocab_size=VOCAB, n_positions=19, pad_token_id=PAD) | kw
    return transformers.GPT2Config(**kw)


def _llama(**kw):  # RoPE needs an even head width: 4 heads of 10, 2 key-value heads
    kw = dict(num_hidden_layers=2, hidden_size=40, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=44, vocab_size=VOCAB, max_position_embeddings=19, pad_token_id=PAD) | kw
    return transformers.LlamaConfig(**kw)


def _class_labels(n):
    return lambda g: {"labels": torch.randint(0, n, (B,), generator=g)}


def _token_labels(n):
    def make(g):
        labels = torch.randint(0, n, (B, T), generator=g)
        labels[1, 4:] = -100  # the padded row's pads
        labels[0, 0] = -100  # and a real token left unscored ([CLS], a word's second piece)
        return {"labels": labels}
    return make


def _answers(g):
    start = torch.randint(0, T, (B,), generator=g)
    end = torch.randint(0, T, (B,), generator=g)
    start[2], end[0] = T + 5, 40  # answers cut off by truncation: beyond the sequence, not scored
    return {"start_positions": start, "end_positions": end}


# name -> (HF config maker, its arguments, HF class, labels maker)
CASES = {
    "bert-sequence": (_bert, {"num_labels": 3}, "BertForSequenceClassification", _class_labels(3)),
    "bert-regression": (_bert, {"num_labels": 1}, "BertForSequenceClassification",
                        lambda g: {"labels": torch.randn(B, generator=g)}),
    "bert-multi-label": (_bert, {"num_labels": 4, "problem_type": "multi_label_classification"},
                         "BertForSequenceClassification",
                         lambda g: {"labels": torch.randint(0, 2, (B, 4), generator=g).float()}),
    "bert-token": (_bert, {"num_labels": 5}, "BertForTokenClassification", _token_labels(5)),
    "bert-answers": (_bert, {}, "BertForQuestionAnswering", _answers),
    "gpt2-sequence": (_gpt2, {"num_labels": 3}, "GPT2ForSequenceClassification", _class_labels(3)),
    "gpt2-multi-label": (_gpt2, {"num_labels": 4, "problem_type": "multi_label_classification"},
                         "GPT2ForSequenceClassification",
                         lambda g: {"labels": torch.randint(0, 2, (B, 4), generator=g).float()}),
    "gpt2-regression": (_gpt2, {"num_labels": 1}, "GPT2ForSequenceClassification",
                        lambda g: {"labels": torch.randn(B, generator=g)}),
    "llama-sequence": (_llama, {"num_labels": 3}, "LlamaForSequenceClassification", _class_labels(3)),
}
AUTO = {"sequence-classification": "AutoModelForSequenceClassification",
        "token-classification": "AutoModelForTokenClassification",
        "question-answering": "AutoModelForQuestionAnswering"}


def _perturb(model, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def reference(name: str, seed: int = 0):
    make, kw, cls, _ = CASES[name]
    torch.manual_seed(seed)
    return _perturb(getattr(transformers, cls)._from_config(make(**kw), attn_implementation="eager"), seed).eval()


def inputs(name: str, seed: int = 1) -> dict:
    """B rows of T ids: row 1 right-padded after 4 tokens (pad ids, mask 0), row 2 one token short."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, VOCAB, (B, T), generator=g)
    mask = torch.ones(B, T, dtype=torch.long)
    mask[1, 4:] = 0
    mask[2, 6:] = 0
    ids[mask == 0] = PAD
    out = {"input_ids": ids, "attention_mask": mask}
    if name.startswith("bert"):
        out["token_type_ids"] = (torch.arange(T) >= 3).long().expand(B, T) * mask
    return out | CASES[name][3](g)


def differences(ours, ref, name: str) -> dict[str, float]:
    """max |ours - HF| of each output (logits, or start and end logits) and of the loss."""
    batch = inputs(name)
    ref.config.problem_type = CASES[name][1].get("problem_type")  # HF fixes it at its first call
    with torch.no_grad():
        a, b = ours(**batch), ref(**batch)
    fields = ("start_logits", "end_logits") if "start_positions" in batch else ("logits",)
    out = {f: (getattr(a, f) - getattr(b, f)).abs().max().item() for f in fields}
    out["loss"] = abs(a.loss.item() - b.loss.item())
    return out


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    out = {}
    for name in CASES:
        ref = reference(name)
        path = tmp_path_factory.mktemp(name)
        ref.save_pretrained(path)
        out[name] = (ref, tformer.load_hf(path))
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_hf_folder_loads_and_matches(loaded, name):
    ref, ours = loaded[name]
    diffs = differences(ours, ref, name)
    print(name, "HF -> tformer", {k: f"{v:.1e}" for k, v in diffs.items()})
    assert max(diffs.values()) <= TOL, diffs


@pytest.mark.parametrize("name", list(CASES))
def test_saved_folder_loads_in_hf_and_matches(loaded, name, tmp_path):
    ours = _perturb(build(loaded[name][1].config), seed=7).eval()  # fresh weights, not the ones HF made
    tformer.save_hf(ours, tmp_path)
    auto = getattr(transformers, AUTO[ours.config.task])
    ref, info = auto.from_pretrained(tmp_path, output_loading_info=True, attn_implementation="eager")
    assert type(ref).__name__ == CASES[name][2]
    assert not any(info.values()), info  # no missing, unexpected or mismatched key
    diffs = differences(ours, ref.eval(), name)
    print(name, "tformer -> HF", {k: f"{v:.1e}" for k, v in diffs.items()})
    assert max(diffs.values()) <= TOL, diffs


def test_loaded_configs_say_what_each_head_is(loaded):
    c = {name: loaded[name][1].config for name in CASES}
    assert (c["bert-sequence"].task, c["bert-sequence"].n_classes, c["bert-sequence"].pooling) == \
        ("sequence-classification", 3, "cls")
    assert c["bert-sequence"].pooler and not c["bert-token"].pooler and not c["bert-answers"].pooler
    assert (c["bert-token"].task, c["bert-token"].n_classes) == ("token-classification", 5)
    assert c["bert-answers"].task == "question-answering" and c["bert-regression"].n_classes == 1
    assert (c["gpt2-sequence"].pooling, c["gpt2-sequence"].pad_token_id) == ("last", PAD)
    assert c["llama-sequence"].pooling == "last" and not c["bert-sequence"].lm_head
    for name in CASES:  # the head is one Linear: bias for BERT's classifier and qa_outputs, none for score
        ref, ours = loaded[name]
        assert ours.num_parameters() == sum(p.numel() for p in ref.parameters()), name
        assert (ours.head.bias is not None) == name.startswith("bert"), name


def test_last_token_is_the_last_id_that_is_not_padding(loaded):
    """GPT-2's rule: with pad_token_id the end-of-text id, a trailing end-of-text token is read as padding even
    where the mask calls it real; tformer reads the same token."""
    ref, ours = loaded["gpt2-sequence"]
    batch = {k: v for k, v in inputs("gpt2-sequence").items() if k != "labels"}
    batch["attention_mask"] = torch.ones_like(batch["attention_mask"])  # every position "real" to the mask
    with torch.no_grad():
        assert (ours(**batch).logits - ref(**batch).logits).abs().max().item() <= TOL


# Refused ------------------------------------------------------------------------------------------------------
def _folder(tmp_path, **config):
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("cls,model_type", [
    ("RobertaForSequenceClassification", "roberta"),  # dense + tanh + out_proj on <s>
    ("DistilBertForSequenceClassification", "distilbert"),  # pre_classifier + ReLU + classifier
    ("GPT2ForTokenClassification", "gpt2"),  # a bias on a decoder's head
    ("BertForMultipleChoice", "bert"),
])
def test_head_class_tformer_cannot_hold_is_named(tmp_path, cls, model_type):
    d = transformers.AutoConfig.for_model(model_type).to_dict() | {"architectures": [cls]}
    with pytest.raises(TformerError) as err:
        tformer.load_hf(_folder(tmp_path, **d))
    message = str(err.value)
    assert "\n" not in message and cls in message and "BertForSequenceClassification" in message


@pytest.mark.parametrize("change,words", [
    ({"architectures": ["BertForQuestionAnswering"], "num_labels": 3}, "num_labels=2"),
    ({"architectures": ["BertForSequenceClassification"], "num_labels": 3, "problem_type": "regression"},
     "regression"),
    ({"architectures": ["BertForSequenceClassification"], "id2label": {"0": "x"},
      "problem_type": "single_label_classification"}, "num_labels=1"),
    ({"architectures": ["BertForTokenClassification"], "num_labels": 1}, "number of classes"),
])
def test_head_configs_tformer_cannot_reproduce(tmp_path, change, words):
    d = {k: v for k, v in _bert().to_dict().items() if k not in ("id2label", "label2id")} | change
    with pytest.raises(TformerError, match=words):
        tformer.load_hf(_folder(tmp_path, **d))


@pytest.mark.parametrize("changes,words", [
    (dict(task="sequence-classification", n_classes=2, pooling="mean"), "pooling"),
    (dict(task="sequence-classification", n_classes=2, pooler=False), "pooler=true"),
])
def test_save_refuses_a_bert_head_hf_cannot_hold(changes, words):
    config = tformer.preset("bert-base").replace(**changes)
    with pytest.raises(TformerError, match=words):
        config_to_hf(config)


def test_save_refuses_per_token_regression():
    config = tformer.preset("bert-base").replace(task="token-classification", n_classes=1)
    with pytest.raises(TformerError, match="per-token regression"):
        config_to_hf(config)


def test_save_refuses_a_decoder_token_head():
    config = tformer.preset("gpt2").replace(task="token-classification", n_classes=3)
    with pytest.raises(TformerError, match="GPT2ForSequenceClassification"):
        config_to_hf(config)
