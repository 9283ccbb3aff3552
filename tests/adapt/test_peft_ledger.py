"""tformer.cost.peft (no torch) counts what apply_peft builds: trainable and added parameters equal the model's for
every method on several tiny configs; the memory prediction follows its rules."""

from __future__ import annotations

import pytest

from tformer.adapt.peft import apply_peft, trainable_parameters
from tformer.core.config import ModelConfig
from tformer.core.peft import PeftSpec
from tformer.cost import peft as cost
from tformer.cost.workload import Workload
from tformer.model import build

CONFIGS = {
    "bert-cls": dict(arch="encoder", vocab_size=41, d_model=18, n_heads=3, n_layers=2, d_ff=22, max_positions=40,
                     task="sequence-classification", n_classes=3),
    "bert-tokens": dict(arch="encoder", vocab_size=41, d_model=15, n_heads=5, n_layers=3, d_ff=17, max_positions=40,
                        task="token-classification", n_classes=4, type_vocab_size=2),
    "gpt2-cls": dict(arch="decoder", vocab_size=37, d_model=15, n_heads=3, n_layers=2, d_ff=26, max_positions=40,
                     task="sequence-classification", n_classes=2),
    "llama-lm": dict(arch="decoder", vocab_size=37, d_model=24, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=30,
                     max_positions=40, position="rope", norm="rmsnorm", gated_mlp=True, activation="silu", bias=False),
    "albert-qa": dict(arch="encoder", vocab_size=41, d_model=16, n_heads=4, n_layers=3, d_ff=20, max_positions=40,
                      embed_dim=8, share_layers=True, task="question-answering"),
}
SPECS = [PeftSpec("full"), PeftSpec("head"), PeftSpec("bitfit"), PeftSpec("lora", rank=2, alpha=4.0),
         PeftSpec("lora", rank=3, targets=("o_proj", "up", "down")), PeftSpec("lora", rank=1, targets=(r".*\.k_proj",)),
         PeftSpec("adapter", bottleneck=5), PeftSpec("prompt", virtual_tokens=3), PeftSpec("prefix", virtual_tokens=4)]


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.method}-{s.targets[0] if s.method == 'lora' else ''}")
def test_counts_equal_the_model(name, spec):
    config = ModelConfig(**CONFIGS[name])
    if spec.method == "prefix" and config.share_layers:
        pytest.skip("prefix tuning refuses shared layers (tested in test_peft_errors)")
    model = build(config)
    before = sum(p.numel() for p in model.parameters())
    apply_peft(model, spec)
    after = sum(p.numel() for p in model.parameters())
    assert cost.added_parameters(config, spec) == after - before
    assert cost.trainable_parameters(config, spec) == trainable_parameters(model)


def test_flops_per_token_formulas():
    config = ModelConfig(**CONFIGS["bert-cls"])
    d, L = 18, 2
    assert cost.added_flops_per_token(config, PeftSpec("lora", rank=2)) == L * 2 * (2 * 2 * (d + d))
    assert cost.added_flops_per_token(config, PeftSpec("adapter", bottleneck=5)) == L * 2 * 4 * d * 5
    assert cost.added_flops_per_token(config, PeftSpec("prefix", virtual_tokens=4)) == L * 4 * d * 4
    prompt = cost.added_flops_per_token(config, PeftSpec("prompt", virtual_tokens=4), seq=16)
    assert 0 < prompt and prompt * 16 > 4 * 2 * L * (4 * d * d + 2 * d * 22)  # at least the P positions' matmuls


def test_training_memory_rules():
    config = ModelConfig(**CONFIGS["bert-cls"])
    w = Workload(phase="train", batch=4, seq=16)
    full = cost.training_memory(config, PeftSpec("full"), w)
    head = cost.training_memory(config, PeftSpec("head"), w)
    lora = cost.training_memory(config, PeftSpec("lora", rank=2), w)
    prompt = cost.training_memory(config, PeftSpec("prompt", virtual_tokens=8), w)
    n_lora = cost.trainable_parameters(config, PeftSpec("lora", rank=2))
    assert lora["gradients"] == 4 * n_lora and lora["optimizer"] == 8 * n_lora  # fp32 AdamW: grads, m and v
    assert lora["weights"] == full["weights"] + 4 * cost.added_parameters(config, PeftSpec("lora", rank=2))
    assert head["activations"] < lora["activations"] < full["activations"]
    assert prompt["activations"] > cost.training_memory(config, PeftSpec("prompt", virtual_tokens=1), w)["activations"]
    assert full["total"] == sum(v for k, v in full.items() if k != "total")


def test_ledger_imports_no_torch():
    import subprocess
    import sys

    code = "import sys, tformer.cost.peft; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_same_targets_as_the_model():
    config = ModelConfig(**CONFIGS["llama-lm"])
    model = build(config)
    spec = PeftSpec("lora", rank=2, targets=("gate", "v_proj"))
    apply_peft(model, spec)
    wrapped = [n for n, p in model.named_parameters() if n.endswith("lora_A.weight")]
    assert [n.removesuffix(".lora_A.weight") for n in wrapped] == list(cost.lora_targets(config, spec))
