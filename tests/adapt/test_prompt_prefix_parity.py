"""Prompt tuning and prefix tuning equal peft's PROMPT_TUNING / PREFIX_TUNING (no projection) with the same
virtual-token weights (1e-5), through peft's folder format both ways.

peft's semantics, which tformer follows: a prompt goes before the token embeddings, the mask gets ones and the token
types zeros in front, and BERT's pooler reads position 0, the first virtual token. A prefix is a past_key_values
of virtual_tokens positions in every layer; the real tokens' positions start after it.

Prompt tuning is compared on a BERT sequence classifier. Prefix tuning is compared on a GPT-2 language model: in
transformers 5 the models take ``cache``, not ``past_key_values``, and peft 0.21 then refuses prefix tuning for
sequence classifiers ("Model does not support past key values"; BertModel takes no cache at all); its causal-LM
path still passes the prefix. For BERT the nearest check is that the prefix equals running tformer's encoder stack
with a cache that holds those keys and values.
"""

from __future__ import annotations

import pytest
import torch
from peft_helpers import hf_bert, hf_gpt2, ids_and_mask, tformer_twin

from tformer.adapt.peft import apply_peft, trainable_parameters
from tformer.adapt.peft_format import load_adapter, save_adapter
from tformer.core.peft import PeftSpec
from tformer.model.cache import KVCache

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

TOL = 1e-5
P = 4


def _peft_model(hf_model, method: str):
    cls = peft.PromptTuningConfig if method == "prompt" else peft.PrefixTuningConfig
    task = "SEQ_CLS" if method == "prompt" else "CAUSAL_LM"
    model = peft.get_peft_model(hf_model, cls(num_virtual_tokens=P, task_type=task))
    with torch.no_grad():  # random values of the scale real keys / embeddings have
        for name, p in model.named_parameters():
            if "prompt_encoder" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(5)) * 0.5)
    return model.eval()


def _inputs(method: str):
    """BERT (prompt): a padded row and two segments. GPT-2 (prefix): a padded row."""
    ids, mask = ids_and_mask()
    if method == "prefix":
        return ids, {"attention_mask": mask}
    types = torch.zeros_like(ids)
    types[:, 4:] = 1
    return ids, {"attention_mask": mask, "token_type_ids": types}


def _same(got, want, extra) -> None:
    """Equal within TOL; an LM's logits at padded positions are not compared."""
    if got.dim() == 3:
        real = extra["attention_mask"].bool()
        got, want = got[real], want[real]
    torch.testing.assert_close(got, want, atol=TOL, rtol=0)


def _base(method: str):
    return hf_bert(True) if method == "prompt" else hf_gpt2(lm=True)


@pytest.mark.parametrize("method", ["prompt", "prefix"])
def test_peft_folder_loads_into_tformer(tmp_path, method):
    hf = _base(method)
    ours = tformer_twin(hf, tmp_path / "base")
    theirs = _peft_model(hf, method)
    theirs.save_pretrained(tmp_path / "adapter")
    spec = load_adapter(ours, tmp_path / "adapter")
    assert (spec.method, spec.virtual_tokens) == (method, P)
    ids, extra = _inputs(method)
    with torch.no_grad():
        _same(ours.eval()(ids, **extra).logits, theirs(input_ids=ids, **extra).logits, extra)


@pytest.mark.parametrize("method", ["prompt", "prefix"])
def test_tformer_folder_loads_into_peft(tmp_path, method):
    ours = tformer_twin(_base(method), tmp_path / "base")
    spec = PeftSpec(method, virtual_tokens=P)
    apply_peft(ours, spec)
    c = ours.config
    head = sum(p.numel() for n, p in ours.named_parameters() if n.startswith("head."))
    per_token = c.d_model if method == "prompt" else c.n_layers * 2 * c.d_model
    assert trainable_parameters(ours) == head + P * per_token
    with torch.no_grad():
        if head:
            ours.head.weight.add_(0.25)
    save_adapter(ours, spec, tmp_path / "adapter")
    theirs = peft.PeftModel.from_pretrained(_base(method), tmp_path / "adapter").eval()
    ids, extra = _inputs(method)
    with torch.no_grad():
        _same(ours.eval()(ids, **extra).logits, theirs(input_ids=ids, **extra).logits, extra)


def test_bert_prefix_is_the_encoder_run_with_those_keys(tmp_path):
    plain = tformer_twin(hf_bert(True), tmp_path / "base")
    tuned = tformer_twin(hf_bert(True), tmp_path / "base2")
    apply_peft(tuned, PeftSpec("prefix", virtual_tokens=P))
    ids, mask = ids_and_mask()
    h = plain.embed(ids) + plain.type_embed(torch.zeros_like(ids))
    cache = KVCache(2)
    for i, (k, v) in enumerate(tuned.peft_prefix.key_values(ids.shape[0], torch.float32)):
        cache.update(i, k, v)
    full_mask = torch.cat([torch.ones(2, P, dtype=mask.dtype), mask], 1)
    with torch.no_grad():
        want, _, _ = plain.eval().encoder(h, full_mask, cache=cache)
        got = tuned.eval()(ids, attention_mask=mask).last_hidden_state
    assert torch.equal(got, want)


def test_prefix_is_a_cache_holding_those_keys(tmp_path):
    """On a GPT-2 classifier: prefix tuning equals the plain model run with a KV cache that already holds the
    prefix's keys and values (and positions after it): the hook adds nothing else."""
    plain = tformer_twin(hf_gpt2(), tmp_path / "base")
    tuned = tformer_twin(hf_gpt2(), tmp_path / "base2")
    apply_peft(tuned, PeftSpec("prefix", virtual_tokens=P))
    ids, _ = ids_and_mask()
    cache = KVCache(2)
    for i, (k, v) in enumerate(tuned.peft_prefix.key_values(ids.shape[0], torch.float32)):
        cache.update(i, k, v)
    with torch.no_grad():
        want = plain.eval()(ids, past_key_values=cache).logits
        got = tuned.eval()(ids).logits
    assert torch.equal(got, want)


def test_prompt_reaches_the_gradient_and_the_body_does_not(tmp_path):
    ours = tformer_twin(hf_bert(True), tmp_path / "base")
    apply_peft(ours, PeftSpec("prompt", virtual_tokens=P))
    ids, mask = ids_and_mask()
    out = ours.train()(ids, attention_mask=mask, labels=torch.tensor([0, 2]))
    out.loss.backward()
    assert ours.peft_prompt.embedding.weight.grad.abs().sum() > 0
    assert ours.tok_embed.weight.grad is None
