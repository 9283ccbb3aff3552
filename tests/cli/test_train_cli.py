"""`tformer train` end to end: seq2seq learns the copy task exactly; bad input is one line and exit 2."""

import json
import subprocess
import sys

import pytest

TINY_SEQ2SEQ = ["--preset", "vaswani-base", "--set", "n_layers=2", "--set", "n_decoder_layers=2", "--set", "d_model=64",
                "--set", "n_heads=4", "--set", "d_ff=128", "--set", "dropout=0.0", "--set", "max_positions=16"]


def _train(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "tformer", "train", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_copy_task_reaches_exact_match(tmp_path):
    result = _train(*TINY_SEQ2SEQ, "--data", "copy", "--out", str(tmp_path), "--max-steps", "400",
                    "--batch-size", "64", "--seq-len", "16", "--lr", "3e-3", "--warmup", "50",
                    "--eval-interval", "200", "--eval-batches", "4", "--log-interval", "100")
    assert result.returncode == 0, result.stderr[-2000:]
    scores = json.loads((tmp_path / "decode_eval.json").read_text())
    assert scores["pairs"] == 200
    assert scores["exact_match"] == 1.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--data", "no-such-corpus"], "unknown dataset"),
        (["--seq-len", "500"], "longer than the model's context"),
        (["--preset", "gtp2"], "unknown preset"),
        (["--batch-size", "0"], "--batch-size must be at least 1"),
        (["--lr", "-1"], "--lr must be positive"),
        (["--resume"], "no checkpoint"),
        (["--device", "cuda"], "no CUDA device"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path, args, message):
    result = _train("--out", str(tmp_path / "run"), "--max-steps", "1", *args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.strip().count("\n") == 0


def test_empty_and_binary_corpus_are_rejected(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    binary = tmp_path / "blob.bin"
    binary.write_bytes(bytes(range(256)) * 10)
    for corpus in (empty, binary):
        result = _train("--data", str(corpus), "--out", str(tmp_path / corpus.stem), "--max-steps", "1")
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
