"""tformer's LoRA equals peft's LoRA on the same base, targets and weights (1e-5), both ways through peft's folder
format; merge then unmerge gives back the base weights exactly.

The base is a tiny random BertForSequenceClassification / BertModel (odd sizes); tformer reads its body through
tformer.load_hf and the classifier is copied (tests/adapt/peft_helpers.py). lora_B starts at zero in both libraries,
so B is set to random values first: otherwise the update would be zero and any A would pass.
"""

from __future__ import annotations

import pytest
import torch
from peft_helpers import hf_bert, hf_gpt2, ids_and_mask, tformer_twin

from tformer.adapt.lora import LoraLinear
from tformer.adapt.peft import apply_peft, merge_peft, trainable_parameters, unmerge_peft
from tformer.adapt.peft_format import load_adapter, save_adapter
from tformer.core.peft import PeftSpec

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

TOL = 1e-5


def _randomise_b(model, seed: int = 3) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)


def _peft_lora(hf_model, targets=("query", "value"), r=3, alpha=5):
    task = "SEQ_CLS" if hasattr(hf_model, "classifier") or hasattr(hf_model, "score") else "FEATURE_EXTRACTION"
    config = peft.LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(targets), task_type=task)
    model = peft.get_peft_model(hf_model, config)
    _randomise_b(model)
    return model.eval()


@pytest.mark.parametrize("seq_cls", [True, False])
def test_peft_adapter_loads_into_tformer(tmp_path, seq_cls):
    hf = hf_bert(seq_cls)
    ours = tformer_twin(hf, tmp_path / "base")
    theirs = _peft_lora(hf)
    theirs.save_pretrained(tmp_path / "adapter")
    spec = load_adapter(ours, tmp_path / "adapter")
    assert (spec.method, spec.rank, spec.alpha) == ("lora", 3, 5.0)
    assert sorted(spec.targets) == ["q_proj", "v_proj"]
    ids, mask = ids_and_mask()
    with torch.no_grad():
        want = theirs(input_ids=ids, attention_mask=mask)
        got = ours.eval()(ids, attention_mask=mask)
    if seq_cls:
        torch.testing.assert_close(got.logits, want.logits, atol=TOL, rtol=0)
    else:
        real = mask.bool()
        torch.testing.assert_close(got.last_hidden_state[real], want.last_hidden_state[real], atol=TOL, rtol=0)


def test_tformer_adapter_loads_into_peft(tmp_path):
    hf = hf_bert(True)
    ours = tformer_twin(hf, tmp_path / "base")
    spec = PeftSpec("lora", rank=2, alpha=7.0, targets=("q_proj", "v_proj", "mlp.down"))
    apply_peft(ours, spec)
    _randomise_b(ours)
    with torch.no_grad():
        ours.head.weight.add_(0.5)  # the head trains too: it must travel in the adapter
    save_adapter(ours, spec, tmp_path / "adapter")
    theirs = peft.PeftModel.from_pretrained(hf_bert(True), tmp_path / "adapter").eval()
    ids, mask = ids_and_mask()
    with torch.no_grad():
        torch.testing.assert_close(ours.eval()(ids, attention_mask=mask).logits,
                                   theirs(input_ids=ids, attention_mask=mask).logits, atol=TOL, rtol=0)
    # "output.dense" alone would also pick attention.output.dense: the shortest endings that pick only the FFN's
    assert theirs.peft_config["default"].target_modules == {"query", "value", "0.output.dense", "1.output.dense"}


def test_gpt2_lora_on_projections_both_ways(tmp_path):
    """GPT-2's c_proj / c_fc are Conv1D (weights stored (in, out)); peft keeps A (r, in) and B (out, r) all the same."""
    hf = hf_gpt2()
    ours = tformer_twin(hf, tmp_path / "base")
    spec = PeftSpec("lora", rank=2, alpha=4.0, targets=("o_proj", "up"))
    apply_peft(ours, spec)
    _randomise_b(ours)
    save_adapter(ours, spec, tmp_path / "adapter")
    theirs = peft.PeftModel.from_pretrained(hf_gpt2(), tmp_path / "adapter").eval()
    ids, _ = ids_and_mask()
    with torch.no_grad():
        want = theirs(input_ids=ids).logits
        torch.testing.assert_close(ours.eval()(ids).logits, want, atol=TOL, rtol=0)
    back = tformer_twin(hf_gpt2(), tmp_path / "base2")
    load_adapter(back, tmp_path / "adapter")
    with torch.no_grad():
        torch.testing.assert_close(back.eval()(ids).logits, want, atol=TOL, rtol=0)


def test_gpt2_fused_qkv_is_refused_in_peft_format(tmp_path):
    ours = tformer_twin(hf_gpt2(), tmp_path / "base")
    spec = PeftSpec("lora", rank=2, targets=("q_proj",))
    apply_peft(ours, spec)
    with pytest.raises(Exception, match="fuses q, k and v into h.0.attn.c_attn|fuses q, k and v"):
        save_adapter(ours, spec, tmp_path / "adapter")


def test_merge_unmerge_exact(tmp_path):
    hf = hf_bert(True)
    ours = tformer_twin(hf, tmp_path / "base")
    base = {k: v.clone() for k, v in ours.state_dict().items()}
    apply_peft(ours, PeftSpec("lora", rank=3, alpha=6.0, targets=("q_proj", "v_proj")))
    _randomise_b(ours)
    ids, mask = ids_and_mask()
    with torch.no_grad():
        unmerged = ours(ids, attention_mask=mask).logits
        merge_peft(ours)
        merged = ours(ids, attention_mask=mask).logits
        changed = ours.encoder.layers[0].attn.q_proj.weight.clone()
        unmerge_peft(ours)
        again = ours(ids, attention_mask=mask).logits
    torch.testing.assert_close(merged, unmerged, atol=TOL, rtol=0)
    assert not torch.equal(changed, base["encoder.layers.0.attn.q_proj.weight"])
    for name, value in base.items():
        assert torch.equal(ours.state_dict()[name], value), name
    assert torch.equal(again, unmerged)


def test_lora_names_counts_and_initial_output(tmp_path):
    ours = tformer_twin(hf_bert(True), tmp_path / "base")
    ids, mask = ids_and_mask()
    with torch.no_grad():
        before = ours(ids, attention_mask=mask).logits
    names_before = set(ours.state_dict())
    apply_peft(ours, PeftSpec("lora", rank=4, alpha=8.0, targets=("q_proj", "v_proj")))
    added = set(ours.state_dict()) - names_before
    assert names_before <= set(ours.state_dict())  # the base keeps its names
    assert added == {f"encoder.layers.{i}.attn.{x}_proj.lora_{ab}.weight"
                     for i in range(2) for x in "qv" for ab in "AB"}
    d, head = 18, 18 * 3 + 3
    assert trainable_parameters(ours) == 2 * 2 * (4 * d + d * 4) + head
    assert isinstance(ours.encoder.layers[1].attn.v_proj, LoraLinear)
    with torch.no_grad():
        assert torch.equal(ours(ids, attention_mask=mask).logits, before)  # B = 0: the base model exactly
    bound = 1 / d ** 0.5  # kaiming_uniform(a=sqrt(5)) on (r, in): U(-1/sqrt(in), 1/sqrt(in))
    a = ours.encoder.layers[0].attn.q_proj.lora_A.weight
    assert a.abs().max() <= bound and a.std() > bound / 4


def test_regex_target_is_full_matched(tmp_path):
    ours = tformer_twin(hf_bert(True), tmp_path / "base")
    apply_peft(ours, PeftSpec("lora", rank=2, targets=(r"encoder\.layers\.1\.attn\.(q|k)_proj",)))
    wrapped = sorted(n for n, m in ours.named_modules() if isinstance(m, LoraLinear))
    assert wrapped == ["encoder.layers.1.attn.k_proj", "encoder.layers.1.attn.q_proj"]
