"""Everything the sections read: the options, the config, the machine's three roofs (theoretical,
measured, and the --hardware target), the workloads and their ledgers, and the measurements.

The sections never compute a number of their own from constants: they read the ledger, the
bench profile or a measurement stored here, so the report cannot drift from the ledger.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace

import torch

from tformer.core.errors import TformerError
from tformer.cost.ledger import Workload, ledger
from tformer.machine import resolve_hardware, usable_cpus
from tformer.machine.profile_store import load_profile, profile_path, save_profile
from tformer.measure.bench import run_bench, torch_device
from tformer.measure.optime import call_overhead
from tformer.measure.probe import detect_machine
from tformer.train.setup import base_config

DEFAULT_SENTENCE = "To be, or not to be, that is the question:"


@dataclass
class ReportOptions:
    preset: str | None = None
    config: str | None = None
    hf: str | None = None
    overrides: list[str] = field(default_factory=list)
    hardware: str | None = None  # predictions for another device (table name, JSON file): roofline, scaling
    out: str = "tformer-report"
    quick: bool = False
    train: bool = True
    batch: int = 16
    seq: int | None = None  # default: min(max_positions, 128)
    train_seconds: float | None = None  # default 60 (quick: 15)
    data: str = "shakespeare"
    sentence: str = DEFAULT_SENTENCE
    seed: int = 1337
    device: str | None = None  # torch device; default the first GPU, else the CPU
    threads: int | None = None  # CPU threads for every measurement (default: PyTorch's setting)
    distributed: bool = True  # measure a 2-process run (DDP, FSDP2) for "Beyond one device"
    long_context: bool = True  # time the attention kinds against n for "Attention at long context"
    # "A real model": a packaged GGUF model (section_real_model.MODELS: smollm2-135m-instruct, gemma3-270m); "" skips
    real_model: str = "smollm2-135m-instruct"

    @property
    def train_budget(self) -> float:
        return self.train_seconds if self.train_seconds is not None else (15.0 if self.quick else 60.0)

    def validate(self) -> None:
        if self.batch < 1:
            raise TformerError(f"--batch must be at least 1, got {self.batch}")
        if self.seq is not None and self.seq < 2:
            raise TformerError(f"--seq must be at least 2, got {self.seq}")
        if self.train_seconds is not None and self.train_seconds <= 0:
            raise TformerError("--train-seconds must be a positive number of seconds")
        if self.threads is not None and self.threads < 1:
            raise TformerError(f"--threads must be at least 1, got {self.threads}")
        if not self.sentence.strip():
            raise TformerError("--sentence is empty; give a sentence for the attention maps")


@dataclass
class Context:
    options: ReportOptions
    config: object
    torch_device: str
    specs: object  # tformer.machine.specs.MachineSpecs
    bench: object  # tformer.measure.bench.BenchResult (the saved measured profile)
    bench_note: str
    measured: object  # Device: this machine's measured roofs (+ curve, STREAM, per-call overhead)
    theoretical: object  # Device: this machine's theoretical roofs
    target: object  # Device the roofline and scaling predict for (--hardware, else `measured`)
    workloads: dict  # name -> Workload: forward, train, prefill, decode
    ledgers: dict  # name -> Ledger
    started: float
    load_before: float | None
    progress: object
    results: dict = field(default_factory=dict)  # measurements: train_run, profiles, decode_curve, generation, maps
    data: dict = field(default_factory=dict)  # the JSON sidecar, filled by the sections
    notes: list[str] = field(default_factory=list)

    @property
    def is_gpu(self) -> bool:
        return self.torch_device.startswith("cuda")

    @property
    def dtype(self) -> str:
        return "fp32"

    @property
    def target_memory(self) -> int | None:
        """Bytes of memory of the device predicted for: --hardware's, else this machine's RAM."""
        return self.target.memory_bytes or (self.specs.memory.total_bytes if self.target is self.measured else None)

    def say(self, message: str) -> None:
        if self.progress:
            self.progress(f"[{self.elapsed():5.1f} s] {message}")

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


def oversubscription_note(load: float | None) -> tuple[str, str] | None:
    """A sentence when other processes already kept every usable CPU busy: timings of small ops then
    include waits for a CPU (a BLAS/OpenMP thread descheduled mid-barrier stalls its partner)."""
    cpus = usable_cpus()
    if load is None or load < cpus:
        return None
    long = (f"shared machine: the 1-minute load average was {load:.2f} on {cpus} usable CPUs before the report started "
            f"and PyTorch ran {torch.get_num_threads()} threads, so measured times include waiting for a CPU; small "
            "ops (batch-1 decoding) suffer most. Rerun on an idle machine, or with `--threads 1`, for cleaner figures.")
    short = f"busy machine (load {load:.2f} on {cpus} CPUs): measured times include waiting for a CPU"
    return long, short


def load_average() -> float | None:
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def resolve_config(opts: ReportOptions):
    return base_config(opts.preset, opts.config, opts.hf, opts.overrides)


def pick_device(opts: ReportOptions) -> str:
    return torch_device(opts.device or None)


def machine_profile(torch_device: str, specs, say) -> tuple[object, str]:
    """The saved bench profile of this machine, or a fresh quick bench (saved) when there is none or
    it lacks the device analysed. Never the full bench: that is `tformer bench`'s job."""

    bench = load_profile()
    if bench is not None and any(d.device == torch_device for d in bench.devices):
        mode = "quick" if bench.quick else "full"
        return bench, (f"measured roofs: the saved `tformer bench` profile ({mode}, {bench.created}, "
                       f"{profile_path()}), not re-measured")
    say("no measured profile saved for this device: running `tformer bench --quick` first")
    started = time.perf_counter()
    devices = ["cpu"] + ([torch_device] if torch_device != "cpu" else [])
    bench = run_bench(quick=True, devices=devices, specs=specs, progress=None)
    path = save_profile(bench)
    return bench, (f"measured roofs: no profile was saved, so a quick bench ran now "
                   f"({time.perf_counter() - started:.1f} s) and was saved to {path}")


def build_context(opts: ReportOptions, progress=None) -> Context:

    opts.validate()
    started = time.perf_counter()
    load = load_average()
    say = progress or (lambda _m: None)
    config = resolve_config(opts)
    torch_device = pick_device(opts)
    target_override = resolve_hardware(opts.hardware) if opts.hardware else None  # bad names fail before any run
    seq = opts.seq or min(config.max_positions, 128)
    if config.position in ("learned", "sinusoidal") and seq > config.max_positions:
        raise TformerError(f"--seq {seq} exceeds the model's max_positions={config.max_positions}; lower --seq")
    workloads = {
        "forward": Workload(phase="forward", batch=opts.batch, seq=seq),
        "train": Workload(phase="train", batch=opts.batch, seq=seq),
    }
    if "prefill" in config.traits.phases:
        workloads["prefill"] = Workload(phase="prefill", batch=1, seq=seq)
        workloads["decode"] = Workload(phase="decode", batch=1, seq=seq, context=seq - 1)
    ledgers = {name: ledger(config, w) for name, w in workloads.items()}  # bad sizes fail here, before any run

    say("detecting the machine")
    specs = detect_machine()
    bench, bench_note = machine_profile(torch_device, specs, say)
    measured = bench.to_device(torch_device)
    if measured.call_overhead_s is None and torch_device == "cpu":
        # The same per-call cost `tformer profile` adds to every predicted op (Python + dispatch).
        measured = replace(measured, call_overhead_s=call_overhead())
    if torch_device == "cpu":
        theoretical = specs.cpu_device()
    else:
        theoretical = specs.gpu_device(int(torch_device.split(":")[1]))
    return Context(options=opts, config=config, torch_device=torch_device, specs=specs, bench=bench,
                   bench_note=bench_note, measured=measured, theoretical=theoretical,
                   target=target_override or measured, workloads=workloads, ledgers=ledgers, started=started,
                   load_before=load, progress=say)


__all__ = ["Context", "DEFAULT_SENTENCE", "ReportOptions", "build_context", "load_average", "machine_profile"]
