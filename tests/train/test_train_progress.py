"""The live progress bar: it runs on a (forced) terminal, and plain mode prints the same lines as before."""

import io
import re

import numpy as np
import torch

from tformer.core.config import ModelConfig
from tformer.model import build
from tformer.train.loop import TrainArgs, Trainer
from tformer.train.progress import TrainProgress, eta
from tformer.train.sources import CausalLMSource


def _trainer(tmp_path, progress, log):
    stream = (np.arange(3000) % 32).astype(np.uint16)
    torch.manual_seed(0)
    model = build(ModelConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab_size=32, max_positions=8))
    args = TrainArgs(out=str(tmp_path), max_steps=4, batch_size=4, warmup=1, eval_interval=2, eval_batches=1,
                     log_interval=1, ckpt_interval=100)
    return Trainer(model, CausalLMSource(stream[:2500], stream[2500:], 8, seed=1), args,
                   flops_per_step=1e6, peak_flops=1e9, log=log, progress=progress)


LINE = re.compile(r"step +\d+/4 \| loss \d+\.\d{4}( \| val \d+\.\d{4} \(ppl \d+\.\d\d\))? \| [\d,]+ tok/s "
                  r"\| MFU \d+\.\d% \| lr \d\.\d\de[-+]\d\d \| \d+s elapsed, ETA \d+s")


def test_plain_mode_prints_one_line_per_interval(tmp_path):
    lines = []
    _trainer(tmp_path, TrainProgress(enabled=False), lines.append).run()
    assert len(lines) == 4 and all(LINE.fullmatch(line) for line in lines), lines


def test_no_terminal_means_no_bar():
    assert not TrainProgress(file=io.StringIO()).enabled  # pipes and files keep the plain lines


def test_forced_terminal_draws_the_bar_and_prints_evals_above_it(tmp_path):
    screen = io.StringIO()
    bar = TrainProgress(file=screen, force_terminal=True)
    lines = []

    def log(message):
        lines.append(message)
        bar.print(message)

    result = _trainer(tmp_path, bar, log).run()
    assert result["step"] == 4 and not bar.live
    assert [LINE.fullmatch(line) is not None for line in lines] == [True, True]  # evals at steps 2 and 4 only
    text = screen.getvalue()
    assert "4/4" in text and "tok/s" in text and "MFU" in text and "ETA" in text


def test_eta_respects_the_time_budget():
    assert eta(10, 100, 10.0, None) == 90.0
    assert eta(10, 100, 10.0, 15.0) == 5.0
    assert eta(10, 100, 20.0, 15.0) == 0.0
