"""A run that knows itself: --resume's flag merge, JSON-only train_args.json, and the stop-on-signal handler."""

import json
import os
import signal
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.model import build
from tformer.train.interrupt import exit_code, stop_on_signals
from tformer.train.loop import TrainArgs, Trainer
from tformer.train.setup import Run, resume_args, save_run_files, saved_run_args
from tformer.train.sources import CausalLMSource

SAVED = {"preset": "char-small", "set": ["n_layers=1"], "lr": 0.003, "max_steps": 100, "seed": 7, "out": "a"}


def test_resume_keeps_saved_flags_and_takes_the_ones_that_may_change():
    merged = resume_args(SAVED, {"max_steps": 500, "log_interval": 3}, Path("r/train_args.json"))
    assert merged == {**SAVED, "max_steps": 500, "log_interval": 3}
    # Repeating the original command line is fine; so is a different spelling of where the run is.
    assert resume_args(SAVED, {"lr": 0.003, "set": ["n_layers=1"], "out": "b"}, Path("x"))["lr"] == 0.003


@pytest.mark.parametrize("given, flag", [({"lr": 0.01}, "--lr 0.01"), ({"set": ["n_layers=2"]}, "--set n_layers=2"),
                                         ({"seed": 8, "max_steps": 5}, "--seed 8")])
def test_resume_refuses_a_flag_that_contradicts_the_run_naming_it(given, flag):
    with pytest.raises(TformerError, match=f"--resume: {flag} contradicts the saved run") as err:
        resume_args(SAVED, given, Path("r/train_args.json"))
    assert "\n" not in str(err.value) and "r/train_args.json" in str(err.value)


def test_train_args_json_holds_json_values_only(tmp_path):
    save_run_files(tmp_path, Run(None, None, None, "causal"), {"lr": 0.1, "_run": print, "set": [], "x": object()})
    text = (tmp_path / "train_args.json").read_text()
    assert json.loads(text) == {"lr": 0.1, "set": []} and "<" not in text
    assert saved_run_args(tmp_path) == {"lr": 0.1, "set": []}
    assert saved_run_args(tmp_path / "none") is None


@pytest.mark.parametrize("content", ["[1, 2]", "{not json", "[" * 100_000])
def test_unreadable_train_args_is_one_line(tmp_path, content):
    (tmp_path / "train_args.json").write_text(content)
    with pytest.raises(TformerError, match="train_args.json"):
        saved_run_args(tmp_path)


def test_first_signal_asks_to_stop_second_ctrl_c_interrupts_at_once():
    trainer = SimpleNamespace(stop_signal=None)
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with stop_on_signals(trainer):
        os.kill(os.getpid(), signal.SIGTERM)
        assert trainer.stop_signal == signal.SIGTERM  # recorded, the process goes on
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    assert exit_code(signal.SIGINT) == 130 and exit_code(signal.SIGTERM) == 143


def test_trainer_asked_to_stop_finishes_the_step_and_checkpoints(tmp_path):
    stream = (np.arange(3000) % 32).astype(np.uint16)
    model = build(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=32, max_positions=8))
    args = TrainArgs(out=str(tmp_path), max_steps=50, batch_size=4, warmup=1, eval_interval=100, eval_batches=1,
                     log_interval=100, ckpt_interval=100)
    trainer = Trainer(model, CausalLMSource(stream[:2500], stream[2500:], 8, seed=1), args, log=lambda _: None)
    trainer.stop_signal = signal.SIGINT
    result = trainer.run()
    assert result["step"] == 1 and result["stopped_by"] == signal.SIGINT
    assert json.loads((tmp_path / "checkpoint" / "state.json").read_text())["step"] == 1
    assert (tmp_path / "model.safetensors").exists()
