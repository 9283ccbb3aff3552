"""`tformer train` end to end: seq2seq learns the copy task exactly; bad input is one line and exit 2; a run
resumes from its own flags, has one writer, and stops cleanly on SIGINT/SIGTERM."""

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from forked_cli import run_tformer
from safetensors.torch import load_file

from tformer.train.run_lock import run_lock

TINY_SEQ2SEQ = ["--preset", "vaswani-base", "--set", "n_layers=2", "--set", "n_decoder_layers=2", "--set", "d_model=64",
                "--set", "n_heads=4", "--set", "d_ff=128", "--set", "dropout=0.0", "--set", "max_positions=16"]


def _train(*args, timeout=300, env=None):
    return run_tformer(["train", *args], timeout=timeout, env=env)


@pytest.mark.slow
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


# A run that knows itself, one writer per run, signals: a tiny causal model on a small text file, as a user runs it.
TINY_CAUSAL = ["--set", "n_layers=1", "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32",
               "--set", "max_positions=16", "--batch-size", "4", "--warmup", "2", "--eval-batches", "1",
               "--log-interval", "1", "--no-progress"]


def _corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog; " * 300)
    return path


def _env(tmp_path) -> dict:
    return {**os.environ, "TFORMER_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}


def _start(tmp_path, *args) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tformer", "train", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(tmp_path))


def _interrupt_after_first_step(proc: subprocess.Popen, signum) -> tuple[str, str]:
    for line in proc.stdout:
        if line.startswith("step"):
            proc.send_signal(signum)
            break
    out, err = proc.communicate(timeout=120)
    return out, err


def _snapshot(folder: Path) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_sigterm_checkpoints_and_the_printed_resume_command_continues_bit_exact(tmp_path):
    data, straight, stopped = _corpus(tmp_path), tmp_path / "straight", tmp_path / "stopped"
    # Enough steps that the signal, sent after step 1's line, lands mid-run; both runs at once to save time.
    common = [*TINY_CAUSAL, "--data", str(data), "--max-steps", "150", "--eval-interval", "50",
              "--ckpt-interval", "50"]
    first = _start(tmp_path, *common, "--out", str(straight))
    proc = _start(tmp_path, *common, "--out", str(stopped))
    out, err = _interrupt_after_first_step(proc, signal.SIGTERM)
    assert proc.returncode == 143, err[-2000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("stopped by SIGTERM after step ") and f"checkpoint in {stopped / 'checkpoint'}" in last
    step = int(last.split("after step ")[1].split(";")[0])
    assert 1 <= step < 150
    assert json.loads((stopped / "checkpoint" / "state.json").read_text())["step"] == step
    command = last.split("resume with: ")[1]
    assert command == f"tformer train --resume --out {stopped}"
    saved = json.loads((stopped / "train_args.json").read_text())
    assert saved["max_steps"] == 150 and "_run" not in saved and "<function" not in json.dumps(saved)
    assert not (stopped / ".lock").exists()
    first.communicate(timeout=300)
    assert first.returncode == 0
    resumed = _train(*shlex.split(command)[2:], env=_env(tmp_path))  # the printed command, no other flag
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resumed from step {step}" in resumed.stdout
    a, b = load_file(str(straight / "model.safetensors")), load_file(str(stopped / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    losses = [[json.loads(line)["train_loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]
              for run in (straight, stopped)]
    assert losses[0] == losses[1]


def test_ctrl_c_checkpoints_and_a_contradicting_resume_changes_nothing(tmp_path):
    run = tmp_path / "run"
    proc = _start(tmp_path, *TINY_CAUSAL, "--data", str(_corpus(tmp_path)), "--max-steps", "100000",
                  "--eval-interval", "1000", "--ckpt-interval", "1000", "--out", str(run))
    out, err = _interrupt_after_first_step(proc, signal.SIGINT)
    assert proc.returncode == 130, err[-2000:]
    assert "stopped by SIGINT" in out and (run / "checkpoint" / "state.json").exists()
    before = _snapshot(run)
    refused = _train("--resume", "--out", str(run), "--max-steps", "5", "--lr", "0.5", env=_env(tmp_path))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "--lr 0.5 contradicts the saved run" in refused.stderr and refused.stderr.count("\n") == 1
    assert _snapshot(run) == before  # byte-identical: not even train_args.json was rewritten


def test_second_trainer_on_a_locked_run_is_refused_naming_the_owner(tmp_path):
    run = tmp_path / "run"
    with run_lock(run):
        before = _snapshot(run)
        result = _train(*TINY_CAUSAL, "--data", str(_corpus(tmp_path)), "--max-steps", "2", "--out", str(run),
                        env=_env(tmp_path))
        assert result.returncode == 2 and "Traceback" not in result.stderr
        assert f"is being trained by pid {os.getpid()}" in result.stderr and result.stderr.count("\n") == 1
        assert _snapshot(run) == before


def test_stale_lock_is_taken_over_and_released(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").write_text(f"pid=999999999 host={socket.gethostname()}\n")
    result = _train(*TINY_CAUSAL, "--data", str(_corpus(tmp_path)), "--max-steps", "2", "--out", str(run),
                    env=_env(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "taking over a stale lock" in result.stdout and "999999999" in result.stdout
    assert not (run / ".lock").exists() and (run / "model.safetensors").exists()
