"""--loss-chunk on the command line: `tformer train` trains the same losses and weights with the logits chunked; `tformer
count` sets the chunked training memory beside the plain one; bad values are one line and exit 2."""

import json

import pytest
from forked_cli import run_tformer
from safetensors.torch import load_file

TINY = ["--preset", "char-small", "--set", "n_layers=1", "--set", "d_model=32", "--set", "n_heads=2", "--set", "d_ff=64",
        "--set", "dropout=0.0", "--seq-len", "32", "--batch-size", "4", "--max-steps", "3", "--log-interval", "1",
        "--eval-interval", "3", "--eval-batches", "1", "--ckpt-interval", "3", "--no-progress"]


def _losses(run) -> list[float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["train_loss"] for r in rows] + [r["val_loss"] for r in rows if "val_loss" in r]


def test_train_with_chunked_loss_gives_the_plain_runs_losses_and_weights(tmp_path):
    for chunk in ("0", "16"):
        result = run_tformer(["train", *TINY, "--loss-chunk", chunk, "--out", tmp_path / chunk])
        assert result.returncode == 0, result.stderr[-2000:]
    plain, chunked = _losses(tmp_path / "0"), _losses(tmp_path / "16")
    assert len(plain) == 4 and all(abs(a - b) < 1e-5 for a, b in zip(plain, chunked))
    a, b = load_file(tmp_path / "0" / "model.safetensors"), load_file(tmp_path / "16" / "model.safetensors")
    assert all((a[k] - b[k]).abs().max() < 1e-5 for k in a)


@pytest.mark.parametrize("args, message", [
    (["--loss-chunk", "-1"], "--loss-chunk must be 0 or more"),
    (["--task", "image-classification", "--loss-chunk", "8"], "--loss-chunk applies to a decoder-only language model"),
])
def test_train_refuses_bad_values_in_one_line(tmp_path, args, message):
    result = run_tformer(["train", "--out", tmp_path / "run", "--max-steps", "1", *args])
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0


def test_count_sets_the_chunked_memory_beside_the_plain():
    args = ["count", "--preset", "gpt2", "--phase", "train", "--batch", "4", "--seq", "512", "--json"]
    plain = json.loads(run_tformer(args).stdout)["memory"]
    result = run_tformer([*args, "--loss-chunk", "256"])
    assert result.returncode == 0, result.stderr
    chunked = json.loads(result.stdout)["memory"]
    assert plain["logits"] == 4 * 512 * 50257 * 4 and chunked["logits"] == 256 * 50257 * 4
    assert chunked["without_loss_chunk"] == {k: plain[k] for k in chunked["without_loss_chunk"]}
    assert plain["logits_and_loss"] == 2 * plain["logits"] and 0.1 < plain["logits_share"] < 1
    assert chunked["logits_share"] < plain["logits_share"] / 10
    table = run_tformer(args[:-1] + ["--loss-chunk", "256"]).stdout
    assert "logits (256 rows at a time)" in table and "the same without --loss-chunk" in table


@pytest.mark.parametrize("args, message", [
    (["--loss-chunk", "64"], "add --phase train"),
    (["--phase", "train", "--loss-chunk", "-2"], "--loss-chunk must be a whole number in [0"),
    (["--preset", "bert-base", "--phase", "train", "--loss-chunk", "64"], "decoder-only"),
])
def test_count_refuses_bad_values_in_one_line(args, message):
    result = run_tformer(["count", *args])
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and result.stderr.strip().count("\n") == 0
