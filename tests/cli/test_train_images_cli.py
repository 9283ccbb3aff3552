"""`tformer train --task image-classification | contrastive` end to end on digits (short runs): checkpoints, held-out
accuracy in the metrics, CLIP's zero-shot and recall file, bit-exact --resume, and bad input as one line, exit 2."""

import json
import os

import pytest
from forked_cli import run_tformer
from PIL import Image
from safetensors.torch import load_file

SHORT = ["--max-steps", "6", "--eval-interval", "3", "--ckpt-interval", "3", "--log-interval", "3", "--batch-size",
         "16", "--warmup", "2", "--no-progress"]


def _train(tmp_path, *args):
    env = {**os.environ, "TFORMER_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    return run_tformer(["train", *args], env=env)


def _records(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_vit_on_digits_checkpoints_and_reports_accuracy(tmp_path):
    out = tmp_path / "vit"
    result = _train(tmp_path, "--task", "image-classification", "--out", out, *SHORT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "training vit-digits" in result.stdout and "on digits" in result.stdout
    assert "held-out accuracy" in result.stdout and "acc " in result.stdout
    assert (out / "checkpoint").is_dir() and (out / "model.safetensors").is_file()
    evals = [r for r in _records(out) if "val_loss" in r]
    assert [r["step"] for r in evals] == [3, 6] and all(0 <= r["val_accuracy"] <= 1 for r in evals)
    saved = json.loads((out / "train_args.json").read_text())
    assert saved["objective"] == "image-classification" and saved["batch_size"] == 16 and saved["lr"] == 3e-3


def test_vit_resume_is_bit_exact(tmp_path):
    # A constant learning rate: the cosine's shape depends on --max-steps, which the broken run changes.
    straight, broken = tmp_path / "straight", tmp_path / "broken"
    flags = ["--task", "image-classification", "--schedule", "constant", *SHORT[2:]]
    assert _train(tmp_path, *flags, "--out", straight, "--max-steps", "6").returncode == 0
    first = _train(tmp_path, *flags, "--out", broken, "--max-steps", "3")
    assert first.returncode == 0, first.stderr[-2000:]
    again = _train(tmp_path, "--resume", "--out", broken, "--max-steps", "6")
    assert again.returncode == 0, again.stderr[-2000:]
    a, b = load_file(straight / "model.safetensors"), load_file(broken / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    assert [r["train_loss"] for r in _records(straight)] == [r["train_loss"] for r in _records(broken)]


def test_clip_on_digits_saves_zero_shot_and_recall(tmp_path):
    out = tmp_path / "clip"
    result = _train(tmp_path, "--task", "contrastive", "--out", out, *SHORT)
    assert result.returncode == 0, result.stderr[-2000:]
    scores = json.loads((out / "contrastive_eval.json").read_text())
    assert scores["pairs"] == 359 and scores["classes"] == 10
    assert 0 <= scores["zero_shot_accuracy"] <= 1 and set(scores["image_to_text_recall"]) == {"1", "5"}
    assert scores["text_to_image_recall"]["1"] <= scores["text_to_image_recall"]["5"]
    assert "zero-shot accuracy" in result.stdout and (out / "tokenizer").is_dir()


def _folder(tmp_path, kind):
    root = tmp_path / kind
    (root / "a").mkdir(parents=True)
    if kind == "non-image":
        (root / "a" / "readme.txt").write_text("not an image")
    elif kind == "one-class":
        Image.new("L", (8, 8)).save(root / "a" / "0.png")
    return root


@pytest.mark.parametrize("args, message", [
    (["--data", "FOLDER:empty"], "holds no images"),
    (["--data", "FOLDER:non-image"], "not a PNG or JPEG"),
    (["--data", "FOLDER:one-class"], "at least 2 class"),
    (["--set", "image_size=16"], "8x8 pixels but the model reads 16x16"),
    (["--set", "num_channels=2"], "cannot become 2"),
    (["--set", "patch_size=3"], "does not divide"),
    (["--seq-len", "16"], "--seq-len does not apply to images"),
    (["--preset", "char-small"], "does not fit a decoder-only model"),
    (["--preset", "vit-digits", "--task", "contrastive"], "contrastive does not fit a vision Transformer"),
    (["--preset", "vit-digits", "--task", "mlm"], "use --task image-classification"),
])
def test_bad_image_input_is_one_line_exit_2(tmp_path, args, message):
    args = [str(_folder(tmp_path, a.split(":")[1])) if a.startswith("FOLDER:") else a for a in args]
    task = [] if "--task" in args else ["--task", "image-classification"]
    result = _train(tmp_path, *task, *args, "--out", tmp_path / "run", "--max-steps", "1")
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0
