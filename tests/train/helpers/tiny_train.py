"""A tiny training run on a synthetic token stream, for the resume and DDP tests (run as a script)."""

import argparse
import json
import os
import signal
from pathlib import Path

import numpy as np
import torch
from torch._dynamo.utils import counters

from tformer.core.config import ModelConfig
from tformer.generate import generate
from tformer.model import build
from tformer.train import checkpoint, distributed
from tformer.train.loop import TrainArgs, Trainer
from tformer.train.run_lock import run_lock
from tformer.train.sources import CausalLMSource


def synthetic_stream(n: int) -> np.ndarray:
    """Counting sequences mod 32 with random restarts: learnable, not trivial."""
    rng = np.random.default_rng(0)
    out, value = np.empty(n, dtype=np.uint16), 0
    for i in range(n):
        value = rng.integers(0, 32) if rng.random() < 0.1 else (value + 1) % 32
        out[i] = value
    return out


def count_compiles(trainer, path: str) -> None:
    """After each step, record how many frames torch._dynamo has compiled so far (a recompile adds one)."""
    real_step, counts = trainer.train_step, []

    def train_step():
        loss = real_step()
        counts.append(counters["frames"]["ok"])
        Path(path).write_text(json.dumps(counts))
        return loss

    trainer.train_step = train_step


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--kill-at", type=int, default=0)
    p.add_argument("--kill-in-save", type=int, default=0, help="SIGKILL halfway through writing this step's checkpoint")
    p.add_argument("--fsdp", action="store_true")
    p.add_argument("--device", default="cpu", help="the test session's device (tests/conftest.py)")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--precision", default="fp32")
    p.add_argument("--d-model", type=int, default=32)
    p.add_argument("--vocab", type=int, default=32)
    p.add_argument("--sample-interval", type=int, default=0, help="generate a few tokens every N steps (eager model)")
    p.add_argument("--compiles", help="write torch._dynamo's count of compiled frames after each step here (JSON)")
    a = p.parse_args()
    torch.set_num_threads(1)
    distributed.init_from_env("cpu")
    stream = synthetic_stream(6000)
    config = ModelConfig(n_layers=2, d_model=a.d_model, n_heads=4, d_ff=2 * a.d_model, vocab_size=a.vocab,
                         max_positions=16, dropout=a.dropout)
    torch.manual_seed(42)
    model = build(config)
    args = TrainArgs(out=a.out, max_steps=a.steps, batch_size=8, grad_accum=a.accum, lr=3e-3, warmup=5,
                     eval_interval=5, eval_batches=2, log_interval=1, ckpt_interval=5, seed=7,
                     fsdp=a.fsdp, device=a.device, compile=a.compile, precision=a.precision,
                     sample_interval=a.sample_interval)

    def sample(m) -> str:
        return str(generate(m, [[1, 2, 3]], max_new_tokens=4, do_sample=True, seed=0).sequences[0])

    trainer = Trainer(model, CausalLMSource(stream[:5000], stream[5000:], 16, seed=7), args, log=lambda s: None,
                      sampler=sample)
    if a.compiles:
        count_compiles(trainer, a.compiles)
    if a.kill_at:
        real_save = trainer.save

        def save_then_die(**kwargs):
            real_save(**kwargs)
            if trainer.step == a.kill_at:
                if trainer.world.size > 1:
                    # Rank 0 writes while the others return at once: without the barrier rank 1's death
                    # can make torchrun kill rank 0 before its checkpoint is complete.
                    torch.distributed.barrier()
                os.kill(os.getpid(), signal.SIGKILL)

        trainer.save = save_then_die
    if a.kill_in_save:
        real_save_file = checkpoint.save_file

        def save_file_then_die(tensors, filename, *rest, **kwargs):
            real_save_file(tensors, filename, *rest, **kwargs)
            # After the weights and the optimizer state, before the RNG state: a checkpoint folder half-written.
            if trainer.step == a.kill_in_save and filename.endswith("optimizer.safetensors"):
                os.kill(os.getpid(), signal.SIGKILL)

        checkpoint.save_file = save_file_then_die
    # As `tformer train` does: rank 0 holds the run's lock, and taking it clears what a killed run left half-made.
    with run_lock(a.out, note=lambda s: None, enabled=trainer.world.rank == 0):
        if a.resume:
            trainer.resume()
        trainer.run()
    distributed.shutdown()


if __name__ == "__main__":
    main()
