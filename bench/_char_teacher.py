"""What bench/distill.py and bench/prune.py share: a small char-level Shakespeare model trained here with the project's
training loop (tformer.train.loop.Trainer), kept in the cache so the second bench reuses the first one's teacher, and
the validation loss both benches report (the same held-out windows for every model)."""

from __future__ import annotations

import tempfile
import time

import torch

from tformer.core.config import preset
from tformer.data.packages import cache_dir
from tformer.interop.checkpoint import load_model
from tformer.model import runner_for
from tformer.train import build_run
from tformer.train.loop import TrainArgs, Trainer

DATA, SEQ, BATCH, SEED, EVAL_BATCHES = "shakespeare", 64, 32, 1337, 10
# char-small narrowed to d_model 128 (d_ff 512): four layers that learn in minutes on two cores.
CONFIG = preset("char-small", d_model=128, d_ff=512, max_positions=SEQ)


def train(model, source, steps: int, lr: float = 2e-3, runner=None, out: str | None = None) -> float:
    """``steps`` AdamW steps (cosine, 5% warm-up) of ``model`` on ``source``; seconds taken. ``runner``: another
    training loss (tformer.adapt.distill.DistillRunner). ``out``: keep the run folder (its model/ export) there."""
    with tempfile.TemporaryDirectory(prefix="bench-char-") as tmp:
        args = TrainArgs(out=out or tmp, max_steps=steps, batch_size=BATCH, lr=lr, warmup=max(1, steps // 20),
                         eval_interval=steps, ckpt_interval=steps, log_interval=steps, eval_batches=EVAL_BATCHES,
                         seed=SEED)
        start = time.perf_counter()
        Trainer(model, source, args, log=lambda *_: None, runner=runner).run()
        return time.perf_counter() - start


def source_and_model(config=CONFIG):
    """The corpus as training windows of SEQ characters, and a seeded fresh model of ``config`` sized to it."""
    run = build_run(DATA, config, seq_len=SEQ, seed=SEED)
    return run.source, run.model


@torch.no_grad()
def val_loss(model, source) -> float:
    """Mean cross-entropy (nats per character) over EVAL_BATCHES held-out batches, the same windows every call."""
    model.eval()
    runner = runner_for(model)
    total = count = 0
    for batch in source.eval_batches(EVAL_BATCHES, BATCH):
        n = int((batch.targets != -100).sum())
        total += runner.loss(batch).item() * n
        count += n
    return total / count


def teacher(steps: int, fresh: bool = False):
    """(teacher, source, seconds spent training it here; 0 when the cached one was reused)."""
    folder = cache_dir() / "bench" / f"char-teacher-{CONFIG.n_layers}x{CONFIG.d_model}-{steps}-{SEED}"
    source, model = source_and_model()
    if (folder / "model.safetensors").is_file() and not fresh:
        return load_model(folder).eval(), source, 0.0
    seconds = train(model, source, steps, out=str(folder))
    return model.eval(), source, seconds


def description(config) -> str:
    return f"{config.n_layers} layers, d_model {config.d_model}, {config.n_heads} heads, d_ff {config.d_ff}"


