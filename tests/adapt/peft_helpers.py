"""Tiny random Hugging Face BERT and GPT-2 models (odd sizes) and the same models in tformer, for the peft tests."""

from __future__ import annotations

import torch

import tformer
from tformer.model import build

VOCAB, CLASSES = 53, 3


def hf_bert(seq_cls: bool = True, seed: int = 0):
    import transformers  # the tests importorskip it first

    config = transformers.BertConfig(vocab_size=VOCAB, hidden_size=18, num_hidden_layers=2, num_attention_heads=3,
                                     intermediate_size=22, max_position_embeddings=40, num_labels=CLASSES)
    cls = transformers.BertForSequenceClassification if seq_cls else transformers.BertModel
    torch.manual_seed(seed)
    model = cls._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def hf_gpt2(seed: int = 0, lm: bool = False):
    """A GPT2ForSequenceClassification, or (``lm``) a GPT2LMHeadModel."""
    import transformers

    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=15, n_layer=2, n_head=3, n_positions=40,
                                     num_labels=CLASSES, pad_token_id=0, bos_token_id=1, eos_token_id=1)
    torch.manual_seed(seed)
    cls = transformers.GPT2LMHeadModel if lm else transformers.GPT2ForSequenceClassification
    model = cls._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model


def tformer_twin(hf_model, folder):
    """The tformer model equal to ``hf_model``: its body saved by transformers and read by tformer.load_hf, the
    task head (classifier / score) copied over."""
    if hasattr(hf_model, "lm_head"):
        hf_model.save_pretrained(folder)
        return tformer.load_hf(folder).eval()
    body = hf_model.bert if hasattr(hf_model, "bert") else getattr(hf_model, "transformer", hf_model)
    body.save_pretrained(folder)
    loaded = tformer.load_hf(folder)
    head = getattr(hf_model, "classifier", None) or getattr(hf_model, "score", None)
    if head is None:
        return loaded.eval()
    config = loaded.config.replace(task="sequence-classification", n_classes=CLASSES)
    model = build(config)
    missing, _ = model.load_state_dict(loaded.state_dict(), strict=False)
    assert set(missing) <= {"head.weight", "head.bias"}, missing
    with torch.no_grad():
        model.head.weight.copy_(head.weight)
        if head.bias is not None:
            model.head.bias.copy_(head.bias)
    return model.eval()


def ids_and_mask(batch: int = 2, length: int = 7, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (batch, length), generator=g)
    mask = torch.ones(batch, length, dtype=torch.long)
    mask[1, -2:] = 0
    return ids, mask
