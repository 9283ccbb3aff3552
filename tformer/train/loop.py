"""The training loop: one optimizer step = gradient accumulation over micro-batches, clip, step.

The loop is the same for one process and for many (torchrun): every rank draws the same global
micro-batch from an identically seeded sampler and keeps its own slice of rows, so N processes
see exactly the data one process would, and their loss curves agree.
"""

from __future__ import annotations

import contextlib
import math
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from tformer.core.atomic import existing_dir
from tformer.core.errors import TformerError
from tformer.model.base import IGNORE_INDEX
from tformer.model.blocks import Block
from tformer.model.runners import Scored, runner_for
from tformer.train import distributed as dist_util
from tformer.train import fsdp
from tformer.train.checkpoint import load_checkpoint, save_checkpoint, save_weights
from tformer.train.metrics import MetricsLog
from tformer.train.optim import make_optimizer
from tformer.train.schedule import make_schedule


@dataclass
class TrainArgs:
    out: str = "runs/default"
    max_steps: int = 1000
    time_budget: float | None = None  # seconds of wall time, across resumes
    batch_size: int = 32  # sequences per optimizer step, summed over ranks and micro-batches
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr: float | None = None  # default lr / 10
    warmup: int = 100
    schedule: str = "cosine"
    optimizer: str = "adamw"
    weight_decay: float = 0.1
    beta2: float = 0.99
    grad_clip: float = 1.0
    label_smoothing: float = 0.0
    loss_chunk: int = 0  # rows of logits the LM loss forms at a time (forward and backward); 0: all at once
    eval_interval: int = 250
    eval_batches: int = 20
    log_interval: int = 10
    ckpt_interval: int = 250
    sample_interval: int = 0
    seed: int = 1337
    device: str = "cpu"
    precision: str = "fp32"  # fp32 | bf16 | fp16 (autocast; fp16 adds a GradScaler)
    compile: bool = False
    activation_checkpointing: bool = False
    fsdp: bool = False  # shard weights/grads/optimizer over processes (FSDP2) instead of replicating (DDP)

    def validate(self) -> None:
        for name in ("max_steps", "batch_size", "grad_accum", "eval_batches", "log_interval", "eval_interval",
                     "ckpt_interval"):
            if getattr(self, name) < 1:
                raise TformerError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        # Every real-valued flag must be a finite number first: NaN passes every comparison below.
        for name in ("lr", "min_lr", "weight_decay", "beta2", "grad_clip", "label_smoothing", "time_budget"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise TformerError(f"--{name.replace('_', '-')} must be a finite number, got {value}")
        for name in ("warmup", "sample_interval", "loss_chunk"):
            if getattr(self, name) < 0:
                raise TformerError(f"--{name.replace('_', '-')} must be 0 or more, got {getattr(self, name)}")
        if self.lr <= 0:
            raise TformerError(f"--lr must be positive, got {self.lr}")
        if self.min_lr is not None and not 0 <= self.min_lr <= self.lr:
            raise TformerError(f"--min-lr must be between 0 and --lr ({self.lr}), got {self.min_lr}")
        if self.weight_decay < 0 or self.grad_clip < 0:
            raise TformerError("--weight-decay and --grad-clip must be 0 or more (0 turns them off)")
        if not 0 <= self.beta2 < 1:
            raise TformerError(f"--beta2 must be in [0, 1), got {self.beta2}")
        if not 0 <= self.label_smoothing < 1:
            raise TformerError(f"--label-smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.precision not in ("fp32", "bf16", "fp16"):
            raise TformerError(f"--precision must be fp32, bf16 or fp16, got {self.precision}")
        if self.time_budget is not None and self.time_budget <= 0:
            raise TformerError("--time-budget must be a positive number of seconds")


class Trainer:
    """Trains ``model`` on batches from ``source`` (see tformer.train.sources for the protocol)."""

    def __init__(self, model, source, args: TrainArgs, flops_per_step: float | None = None,
                 peak_flops: float | None = None, sampler: Callable | None = None, log: Callable = print,
                 progress=None, runner=None):
        args.validate()
        # progress: a tformer.train.progress.TrainProgress (rank 0 draws it); None = plain lines only.
        # runner: the model's runner with another training loss (tformer.adapt.distill.DistillRunner); None = its own.
        self.args, self.source, self.log, self.progress = args, source, log, progress
        self.world = dist_util.world()
        if args.batch_size % (args.grad_accum * self.world.size):
            raise TformerError(
                f"--batch-size {args.batch_size} must be divisible by grad_accum x processes "
                f"= {args.grad_accum} x {self.world.size}"
            )
        self.micro_rows = args.batch_size // args.grad_accum  # rows of one global micro-batch
        self.device = torch.device(args.device)
        self.model = model.to(self.device)
        self.runner = runner if runner is not None else runner_for(self.model)
        if args.loss_chunk and args.fsdp and self.world.size > 1:
            # The chunked loss reads the head's whole weight outside the forward; FSDP holds only a shard of it there.
            raise TformerError("--loss-chunk reads the LM head's whole weight, which --fsdp shards; use one or the other")
        self.runner.check_chunk(args.loss_chunk)  # a loss that cannot take it is refused before the first step
        self.precision = _resolve_precision(args.precision, self.device, log)
        if args.activation_checkpointing:
            enable_activation_checkpointing(self.model)
        self.fsdp = args.fsdp and self.world.size > 1
        if self.world.size > 1:
            dist_util.freeze_unreached(self.model, self.runner.loss_skips)
        if self.fsdp:
            # Before the optimizer: sharding swaps the parameters for DTensor shards.
            fsdp.shard(self.model)
            if sampler is not None and args.sample_interval:
                log("note: no samples during --fsdp training (generation on rank 0 alone would need every rank)")
                sampler = None
        self.optimizer = make_optimizer(model, args.optimizer, args.lr, args.weight_decay, betas=(0.9, args.beta2))
        min_lr = args.min_lr if args.min_lr is not None else args.lr / 10
        self.lr_at = make_schedule(args.schedule, args.lr, args.warmup, args.max_steps, model.config.d_model, min_lr)
        self.scaler = torch.amp.GradScaler(self.device.type) if self.precision == torch.float16 else None
        ddp = self.world.size > 1 and not self.fsdp
        self.train_model = dist_util.wrap_ddp(self.model, self.device) if ddp else self.model
        if args.compile:
            self.train_model = torch.compile(self.train_model)
        self.flops_per_step, self.peak_flops, self.sampler = flops_per_step, peak_flops, sampler
        self.out = Path(args.out)
        self.step, self.elapsed, self.best_val = 0, 0.0, math.inf
        # Set by evaluate() where the runner counts right answers (a pair head, an image classifier): the share right,
        # logged as "val_" + runner.accuracy_metric.
        self.val_accuracy: float | None = None
        # A signal number, set by tformer.train.interrupt's handler: checkpoint after this step and stop.
        self.stop_signal: int | None = None

    # -- one step ------------------------------------------------------------------------
    def _scored(self, module, batch, count: bool = False) -> tuple[Scored, int]:
        """(the runner's score, scored tokens) of ``batch``, run through ``module`` (the model, or its DDP or
        compiled wrapper); with ``count`` the score holds the right answers (Runner.scored)."""
        batch = batch.to(self.device)
        autocast = torch.autocast(self.device.type, dtype=self.precision, enabled=self.precision != torch.float32)
        how = dict(module=module, label_smoothing=self.args.label_smoothing, autocast=autocast,
                   chunk=self.args.loss_chunk)
        scored = self.runner.scored(batch, **how) if count else Scored(self.runner.loss(batch, **how))
        return scored, int((batch.targets != IGNORE_INDEX).sum())

    def train_step(self) -> float:
        self.train_model.train()
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(self.step + 1)
        total_loss = torch.zeros((), device=self.device)
        for micro in range(self.args.grad_accum):
            batch = self.source.next_batch(self.micro_rows).shard(self.world.rank, self.world.size)
            last = micro == self.args.grad_accum - 1
            if self.fsdp:
                sync = fsdp.grad_sync(self.model, last)
            else:
                sync = contextlib.nullcontext() if last or self.world.size == 1 else self.train_model.no_sync()
            with sync:
                loss = self._scored(self.train_model, batch)[0].loss
                scaled = loss / self.args.grad_accum
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            total_loss += loss.detach() / self.args.grad_accum
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.args.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.args.grad_clip)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return dist_util.mean(total_loss).item()

    @torch.no_grad()
    def evaluate(self) -> float:
        self.model.eval()
        total, count, right, rows = 0.0, 0, 0, 0
        for batch in self.source.eval_batches(self.args.eval_batches, self.micro_rows):
            batch = batch.shard(self.world.rank, self.world.size)
            scored, n = self._scored(self.model, batch, count=True)
            total += scored.loss.item() * n
            count += n
            right, rows = right + scored.right, rows + scored.rows
        total, count = dist_util.sum_pair(total, count, self.device)
        # The share of right answers over the validation rows, beside the loss (None where the runner counts none)
        self.val_accuracy = None
        right, rows = dist_util.sum_pair(right, rows, self.device)
        if rows:
            self.val_accuracy = right / rows
        return total / max(count, 1)

    # -- the run ---------------------------------------------------------------------------
    def resume(self) -> None:
        # Checked whole before anything is restored: the sampler's form, the metrics log and the --lr bound it.
        state, data = load_checkpoint(find_checkpoint(self.out), self.model, self.optimizer,
                                      sampler=self.source.state_dict(), run_dir=self.out, max_lr=self.args.lr)
        self.step, self.elapsed = int(state["step"]), float(state["elapsed_s"])
        self.best_val = float(state.get("best_val_loss", math.inf))
        self.source.load_state_dict(data)
        if self.world.rank == 0:
            MetricsLog(self.out).truncate_after(self.step)
        self.log(f"resumed from step {self.step} ({self.elapsed:.1f} s trained so far)")

    def save(self, final: bool = False) -> None:
        """Checkpoint (and with ``final``, the weights export) from rank 0; under FSDP every rank must call it."""
        full = fsdp.full_state(self.model, self.optimizer) if self.fsdp else None  # collective gather
        if self.world.rank != 0:
            return
        state = {"step": self.step, "elapsed_s": self.elapsed, "best_val_loss": self.best_val,
                 "train_args": asdict(self.args)}
        save_checkpoint(self.out / "checkpoint", self.model, self.optimizer, state, self.source.state_dict(),
                        full_state=full)
        if final:
            save_weights(self.model, self.out, weights=full[0] if full else None)

    def run(self) -> dict:
        bar = self.progress if self.world.rank == 0 and self.progress is not None and self.progress.enabled else None
        if bar is not None:
            bar.start(self.args.max_steps, self.step)
        try:
            return self._run(bar)
        finally:
            if bar is not None:
                bar.stop()  # also on errors, so the terminal is left clean

    def _run(self, bar) -> dict:
        args, rank0 = self.args, self.world.rank == 0
        metrics = MetricsLog(self.out) if rank0 else None
        start = time.perf_counter() - self.elapsed
        window_start, window_tokens = time.perf_counter(), 0
        tokens_per_step = self.source.tokens_per_row * args.batch_size
        last = {}
        while self.step < args.max_steps:
            step_start = time.perf_counter()
            loss = self.train_step()
            if not math.isfinite(loss):
                raise TformerError(f"training diverged at step {self.step} (loss {loss}); lower --lr or raise --warmup")
            window_tokens += tokens_per_step
            self.elapsed = time.perf_counter() - start
            out_of_time = args.time_budget is not None and self.elapsed >= args.time_budget
            done = self.step >= args.max_steps or out_of_time
            if bar is not None:
                step_s = max(time.perf_counter() - step_start, 1e-9)
                step_tps = tokens_per_step / step_s
                mfu = self.flops_per_step / step_s / self.peak_flops if self.flops_per_step and self.peak_flops else None
                bar.update(self.step, args.max_steps, loss, step_tps, self.elapsed, args.time_budget, mfu)
            record = None
            if self.step % args.log_interval == 0 or done:
                now = time.perf_counter()
                tps = window_tokens / max(now - window_start, 1e-9)
                window_start, window_tokens = now, 0
                record = {"step": self.step, "train_loss": loss, "lr": self.lr_at(self.step),
                          "tokens_per_s": tps, "elapsed_s": self.elapsed}
                if self.flops_per_step and self.peak_flops:
                    record["mfu"] = self.flops_per_step / tokens_per_step * tps / self.peak_flops
            if self.step % args.eval_interval == 0 or done:
                val = self.evaluate()
                self.best_val = min(self.best_val, val)
                record = record or {"step": self.step, "train_loss": loss, "lr": self.lr_at(self.step),
                                    "elapsed_s": self.elapsed}
                record["val_loss"] = val
                record["val_ppl"] = math.exp(min(val, 50))
                if self.val_accuracy is not None:
                    record["val_" + self.runner.accuracy_metric] = self.val_accuracy
            if record is not None and rank0:
                metrics.write(record)
                # With a live bar, train-only lines would repeat what the bar shows; eval results still print.
                if bar is None or "val_loss" in record:
                    self.log(_format(record, args.max_steps, args.time_budget))
                last = record
            if self.sampler and args.sample_interval and self.step % args.sample_interval == 0 and rank0:
                self.log("sample: " + self.sampler(self.model))
            saved = self.step % args.ckpt_interval == 0 or done
            if saved:
                self.save(final=True)
            if out_of_time:
                self.log(f"time budget of {args.time_budget:.0f} s reached at step {self.step}")
                break
            if not done and self._stop_requested():
                if not saved:
                    self.save(final=True)
                # Ranks that saw no signal themselves (torchrun forwards it to all, but not at once) say SIGTERM.
                return {**last, "step": self.step, "best_val_loss": self.best_val,
                        "stopped_by": int(self.stop_signal or signal.SIGTERM)}
        return {**last, "step": self.step, "best_val_loss": self.best_val}

    def _stop_requested(self) -> bool:
        """Whether any rank was asked to stop: all ranks must stop at the same step (collectives, FSDP's save)."""
        asked = self.stop_signal is not None
        return dist_util.any_rank(asked, self.device)


def find_checkpoint(out: str | Path) -> Path:
    """The checkpoint folder of the run in ``out`` (or its previous version, after a crash between renames)."""
    found = existing_dir(Path(out) / "checkpoint")
    if found is None:
        raise TformerError(f"--resume: no checkpoint in {out}; run once without --resume first")
    return found


def _format(record: dict, max_steps: int, budget: float | None) -> str:
    parts = [f"step {record['step']:>6}/{max_steps}", f"loss {record['train_loss']:.4f}"]
    if "val_loss" in record:
        parts.append(f"val {record['val_loss']:.4f} (ppl {record['val_ppl']:.2f})")
    if "val_pair_accuracy" in record:
        parts.append(f"pair acc {record['val_pair_accuracy']:.1%}")
    if "val_accuracy" in record:
        parts.append(f"acc {record['val_accuracy']:.1%}")
    if "tokens_per_s" in record:
        parts.append(f"{record['tokens_per_s']:,.0f} tok/s")
    if "mfu" in record:
        parts.append(f"MFU {100 * record['mfu']:.1f}%")
    parts.append(f"lr {record['lr']:.2e}")
    elapsed = record["elapsed_s"]
    eta = (max_steps - record["step"]) * elapsed / max(record["step"], 1)
    if budget is not None:
        eta = min(eta, max(budget - elapsed, 0))
    parts.append(f"{elapsed:.0f}s elapsed, ETA {eta:.0f}s")
    return " | ".join(parts)


def _resolve_precision(name: str, device: torch.device, log) -> torch.dtype:
    if name == "fp32":
        return torch.float32
    if name == "bf16" and device.type == "cpu" and not _cpu_has_native_bf16():
        log("warning: this CPU has no native bf16 (matmuls would be ~100x slower); training in fp32")
        return torch.float32
    if name == "fp16" and device.type == "cpu":
        log("warning: fp16 autocast is not useful on CPU; training in fp32")
        return torch.float32
    return torch.bfloat16 if name == "bf16" else torch.float16


def _cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def enable_activation_checkpointing(model) -> None:
    """Recompute each block's activations in the backward pass instead of storing them.

    Wraps the blocks from outside (their forward is replaced on the instance), so the model's
    code and parameter names are unchanged.
    """

    for module in model.modules():
        if isinstance(module, Block):
            inner = module.forward

            def forward(*a, _inner=inner, **kw):
                return checkpoint(_inner, *a, use_reentrant=False, **kw)

            module.forward = forward


