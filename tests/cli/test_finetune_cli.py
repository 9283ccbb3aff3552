"""`tformer finetune` end to end on a tiny encoder and a small CSV (short runs): metrics with held-out accuracy, the
test result file and --json, bit-exact --resume, and bad input as one line, exit 2."""

import json

import pytest
from forked_cli import run_tformer
from safetensors.torch import load_file

TINY = ["--from", "bert-base", "--set", "n_layers=1", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64"]
SHORT = ["--max-steps", "6", "--eval-interval", "3", "--ckpt-interval", "3", "--log-interval", "3", "--batch-size",
         "8", "--warmup", "2", "--no-progress", "--lr", "3e-3"]


@pytest.fixture
def data(tmp_path):
    words = ("crown heaven night sweet love death", "tensor batch layer token weight model")
    rows = [(" ".join(words[i % 2].split()[(i + k) % 6] for k in range(8)), "ab"[i % 2]) for i in range(80)]
    path = tmp_path / "lines.csv"
    path.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in rows))
    return path


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_finetune_reports_held_out_accuracy_and_json(tmp_path, data):
    out = tmp_path / "run"
    result = run_tformer(["finetune", *TINY, "--data", data, "--out", out, "--json", *SHORT])
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads(result.stdout)
    assert summary == json.loads((out / "finetune.json").read_text())
    assert summary["classes"] == ["a", "b"] and summary["peft"]["method"] == "full" and summary["test_rows"] == 8
    assert 0 <= summary["test_accuracy"] <= 1 and summary["trainable_parameters"] == summary["parameters"]
    records = _records(out)
    assert [r["step"] for r in records if "val_accuracy" in r] == [3, 6]
    assert records[-1]["test_accuracy"] == summary["test_accuracy"]
    assert "a new head (random init)" in result.stderr and (out / "checkpoint").is_dir()


def test_head_only_trains_the_head_alone(tmp_path, data):
    out = tmp_path / "head"
    result = run_tformer(["finetune", *TINY, "--data", data, "--out", out, "--method", "head", *SHORT])
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((out / "finetune.json").read_text())["trainable_parameters"] == 32 * 2 + 2
    assert "66 trainable: head" in result.stdout


def test_resume_is_bit_exact(tmp_path, data):
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    flags = [*TINY, "--data", data, "--schedule", "constant", *SHORT[2:]]
    assert run_tformer(["finetune", *flags, "--out", straight, "--max-steps", "6"]).returncode == 0
    first = run_tformer(["finetune", *flags, "--out", broken, "--max-steps", "3"])
    assert first.returncode == 0, first.stderr[-2000:]
    again = run_tformer(["finetune", "--resume", "--out", broken, "--max-steps", "6"])
    assert again.returncode == 0, again.stderr[-2000:]
    a, b = load_file(straight / "model.safetensors"), load_file(broken / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    losses = lambda out: [r["train_loss"] for r in _records(out) if "train_loss" in r]
    assert losses(straight) == losses(broken) and len(losses(straight)) == 2


@pytest.mark.parametrize("extra, message", [
    (["--method", "sideways"], "fine-tuning method 'sideways' is unknown"),
    (["--method", "lora", "--rank", "0"], "rank must be a whole number of at least 1"),
    (["--task", "question-answering"], "labelled lines train a sequence classifier only"),
    (["--from", "char-small", "--pooling", "cls"], "--pooling cls reads the first token"),
    (["--from", "no/such/folder"], "no such folder"),
])
def test_bad_input_is_one_line_exit_2(tmp_path, data, extra, message):
    result = run_tformer(["finetune", *TINY, "--data", data, "--out", tmp_path / "bad", *SHORT, *extra])
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_a_file_of_one_class_is_one_line(tmp_path):
    one = tmp_path / "one.jsonl"
    one.write_text("".join(json.dumps({"text": f"line {i}", "label": "x"}) + "\n" for i in range(10)))
    result = run_tformer(["finetune", *TINY, "--data", one, "--out", tmp_path / "bad", *SHORT])
    assert result.returncode == 2 and "one label ('x') for every row" in result.stderr


def test_lora_run_leaves_a_merged_model_and_its_peft_adapter(tmp_path, data):
    """The run's folder loads as a plain checkpoint (LoRA folded in) that gives the trained model's outputs, and the
    adapter folder holds peft's LoRA files with the trained rank."""
    import torch

    from tformer.adapt.peft import merged_weights
    from tformer.interop.checkpoint import load_model

    out = tmp_path / "lora"
    result = run_tformer(["finetune", *TINY, "--data", data, "--out", out, "--method", "lora", "--rank", "4", *SHORT])
    assert result.returncode == 0, result.stderr[-2000:]
    adapter = json.loads((out / "adapter" / "adapter_config.json").read_text())
    assert adapter["peft_type"] == "LORA" and adapter["r"] == 4
    assert any(k.endswith("lora_A.weight") for k in load_file(out / "adapter" / "adapter_model.safetensors"))
    plain = load_model(out)  # no lora_* names: the config alone builds it
    trained = load_file(out / "checkpoint" / "model.safetensors")
    assert any(".lora_A." in k for k in trained) and not any(".lora_" in k for k in plain.state_dict())
    q = "encoder.layers.0.attn.q_proj"
    folded = trained[f"{q}.weight"] + trained[f"{q}.lora_B.weight"] @ trained[f"{q}.lora_A.weight"] * (adapter["lora_alpha"] / 4)
    assert torch.allclose(plain.state_dict()[f"{q}.weight"], folded, atol=1e-6)
    assert merged_weights(plain).keys() == plain.state_dict().keys()
