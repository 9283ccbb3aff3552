"""A resumed run's state, read and checked as a whole before any of it is restored.

A resume used to trust its checkpoint field by field: a negative step gave a negative learning rate and
rewrote the run's metrics, and a damaged RNG state ended in a traceback after the weights were already
loaded. Here every field of the checkpoint folder (layout in tformer.train.checkpoint) is checked for its
type and range, and against the rest of the run: the model and optimizer being resumed, the data sampler,
the metrics log. The first damage found is one RunStateError naming the file, the field and the fix.
Nothing is restored and nothing written before validate_run_state returns, so a refused resume leaves
the run folder byte-identical.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from tformer.core.atomic import complete_lines
from tformer.core.files import read_json, read_text
from tformer.interop import checkpoint as model_files
from tformer.train import fsdp
from tformer.train.field_check import RNG_FILE, STATE_FILE, Check, describe, first_line, kind, load_tensors, show
from tformer.train.metrics import _record
from tformer.train.optimizer_check import optimizer_state

METRICS_FILE = "metrics.jsonl"
MT_WORDS = 624  # the Mersenne Twister's table: Python's random and numpy's RandomState
MAX_STATE_BYTES = 64 << 20  # the numpy RNG state is a list of 624 numbers: large but flat
MAX_METRICS_BYTES = 1 << 30  # a log line per step of a long run is tens of MB


@dataclass
class RunState:
    """What a resume restores, every field checked."""

    state: dict  # state.json less its RNG fields: step, elapsed_s, best_val_loss, train_args
    rng: dict[str, torch.Tensor]  # "torch" and "cuda.N" (devices this machine has) generator states
    python_rng: tuple
    numpy_rng: tuple
    data: dict[str, torch.Tensor]  # the data sampler's state, without rng.safetensors' "data." prefix
    optimizer: dict | None  # an Optimizer.state_dict() (parameters by number), None when not asked for


def validate_run_state(folder: Path, model, optimizer=None, *, sampler: dict | None = None,
                       run_dir: Path | None = None, max_lr: float | None = None) -> RunState:
    """Read and check the checkpoint in ``folder`` for resuming ``model`` (and ``optimizer``); restore nothing.

    sampler: the data source's own state_dict(), the form its saved state must have. run_dir: the run folder,
    whose metrics log the step must agree with. max_lr: the run's --lr, the most any schedule gives.
    """
    check = Check(folder)
    model = model_files.unwrap(model)
    _check_model(check, folder, model)
    raw = read_json(folder / STATE_FILE, "checkpoint file", max_bytes=MAX_STATE_BYTES, fix=check.fix)
    state = _run_fields(check, raw)
    python_rng = _python_rng(check, raw["python_rng"])
    numpy_rng = _numpy_rng(check, raw["numpy_rng"])
    rng, data = _rng_tensors(check, folder, sampler)
    optim = None
    if optimizer is not None:
        optim = optimizer_state(check, optimizer, state["step"], max_lr)
    if run_dir is not None:
        _against_metrics(check, Path(run_dir), state)
    return RunState(state, rng, python_rng, numpy_rng, data, optim)


# The model --------------------------------------------------------------------------------------
def _check_model(check: Check, folder: Path, model) -> None:
    saved = model_files.read_config(folder)
    if saved != model.config:
        mine, theirs = model.config.to_dict(), saved.to_dict()
        diff = [k for k, v in theirs.items() if mine.get(k) != v and k != "name"]
        if diff:
            check.fail(model_files.CONFIG_FILE, diff[0],
                       f"is {show(theirs[diff[0]])} there but {show(mine.get(diff[0]))} in the model this run builds"
                       f"{' (' + ', '.join(diff[1:4]) + ' differ too)' if diff[1:] else ''}; the checkpoint was "
                       "trained with a different model",
                       fix="resume with the same --preset/--set options or start a new --out directory")
    weights = folder / model_files.WEIGHTS_FILE
    if not fsdp.is_sharded(model):  # a sharded model holds its tied tensors apart: fsdp.load_full matches those names
        model_files.check_weights_header(model, weights)
    # A NaN weight would only show as a diverged loss after the metrics were cut back to this step.
    params = {name for name, _ in model.named_parameters(remove_duplicate=False)}
    with safe_open(str(weights), framework="pt") as f:
        for name in sorted(params.intersection(f.keys())):
            tensor = f.get_tensor(name)
            if tensor.is_floating_point() and not torch.isfinite(tensor).all():
                check.fail(model_files.WEIGHTS_FILE, name, "holds NaN or infinite values")


# state.json -------------------------------------------------------------------------------------
REQUIRED = ("step", "elapsed_s", "train_args", "python_rng", "numpy_rng")
# The flags a saved state is checked against: how far the run went and how often it logged.
COUNTED_ARGS = ("max_steps", "log_interval", "eval_interval")


def _run_fields(check: Check, raw: dict) -> dict:
    for key in REQUIRED:
        if key not in raw:
            check.fail(STATE_FILE, key, "is missing")
    step = check.count(STATE_FILE, "step", raw["step"])
    check.number(STATE_FILE, "elapsed_s", raw["elapsed_s"])
    if "best_val_loss" in raw:  # inf until the first evaluation; a distillation's KL may round below 0
        check.number(STATE_FILE, "best_val_loss", raw["best_val_loss"], -math.inf, infinite=True)
    args = raw["train_args"]
    if not isinstance(args, dict):
        check.fail(STATE_FILE, "train_args", f"is {kind(args)}, not a JSON object")
    for key in COUNTED_ARGS:
        if key not in args:
            check.fail(STATE_FILE, f"train_args.{key}", "is missing")
        check.count(STATE_FILE, f"train_args.{key}", args[key], least=1)
    for key, value in args.items():  # the rest are recorded, not restored: numbers must still be numbers
        if isinstance(value, float) and not math.isfinite(value):
            check.fail(STATE_FILE, f"train_args.{key}", f"is {show(value)}, not a finite number")
    if "lr" in args:
        check.number(STATE_FILE, "train_args.lr", args["lr"], above=True)
    if step > args["max_steps"]:  # the loop stops at max_steps: no run saves a step beyond its own
        check.fail(STATE_FILE, "step", f"is {step}, past the run's max_steps ({args['max_steps']}) it was saved with")
    return {k: v for k, v in raw.items() if k not in ("python_rng", "numpy_rng")}


def _python_rng(check: Check, value) -> tuple:
    field = "python_rng"
    if not (isinstance(value, list) and len(value) == 3):
        check.fail(STATE_FILE, field, f"is {kind(value)}, not [version, {MT_WORDS + 1} numbers, gauss]")
    version, words, gauss = value
    if not (isinstance(words, list) and len(words) == MT_WORDS + 1 and all(type(w) is int for w in words)):
        check.fail(STATE_FILE, f"{field}[1]", f"is not a list of {MT_WORDS + 1} whole numbers")
    if not all(0 <= w < 1 << 32 for w in words[:-1]):
        check.fail(STATE_FILE, f"{field}[1]", "holds a number outside 0..2**32-1")
    if not 0 <= words[-1] <= MT_WORDS:
        check.fail(STATE_FILE, f"{field}[1][{MT_WORDS}]", f"(the position) is {words[-1]}, outside 0..{MT_WORDS}")
    if gauss is not None:
        check.number(STATE_FILE, f"{field}[2]", gauss, least=-math.inf)
    state = (version, tuple(words), gauss)
    try:  # a scratch generator: the process's own is set only once everything passed
        random.Random().setstate(state)
    except (TypeError, ValueError, OverflowError) as exc:
        check.fail(STATE_FILE, field, f"is not a state Python's random accepts ({first_line(exc)})")
    return state


def _numpy_rng(check: Check, value) -> tuple:
    field = "numpy_rng"
    if not (isinstance(value, list) and len(value) == 5):
        check.fail(STATE_FILE, field, f"is {kind(value)}, not [\"MT19937\", {MT_WORDS} numbers, position, 0|1, gauss]")
    name, key, pos, has_gauss, cached = value
    if name != "MT19937":
        check.fail(STATE_FILE, f"{field}[0]", f"is {show(name)}, not \"MT19937\"")
    if not (isinstance(key, list) and len(key) == MT_WORDS and all(type(w) is int and 0 <= w < 1 << 32 for w in key)):
        check.fail(STATE_FILE, f"{field}[1]", f"is not a list of {MT_WORDS} numbers in 0..2**32-1")
    # numpy takes any position and reads past its table with it
    check.count(STATE_FILE, f"{field}[2]", pos)
    if pos > MT_WORDS:
        check.fail(STATE_FILE, f"{field}[2]", f"(the position) is {pos}, past the table's {MT_WORDS} words")
    if has_gauss not in (0, 1) or type(has_gauss) is not int:
        check.fail(STATE_FILE, f"{field}[3]", f"is {show(has_gauss)}, not 0 or 1")
    check.number(STATE_FILE, f"{field}[4]", cached, least=-math.inf)
    state = (name, np.array(key, dtype=np.uint32), pos, has_gauss, float(cached))
    try:
        np.random.RandomState().set_state(state)
    except (TypeError, ValueError) as exc:
        check.fail(STATE_FILE, field, f"is not a state numpy accepts ({first_line(exc)})")
    return state


# rng.safetensors: torch's generators and the data sampler's -----------------------------------
def _rng_tensors(check: Check, folder: Path, sampler: dict | None):
    tensors = load_tensors(check, RNG_FILE)
    if "torch" not in tensors:
        check.fail(RNG_FILE, "torch", "is missing (the CPU generator's state)")
    generator_state(check, RNG_FILE, "torch", tensors["torch"], torch.get_rng_state())
    rng, data = {"torch": tensors["torch"]}, {}
    for key, value in tensors.items():
        if key.startswith("cuda.") and key[5:].isdigit():
            if value.dtype != torch.uint8 or value.dim() != 1:
                check.fail(RNG_FILE, key, f"is a {describe(value)} tensor, not a generator state (uint8, 1-D)")
            index = int(key[5:])
            # A run moved to a machine with fewer GPUs keeps going; the states of GPUs it lacks are not used.
            if torch.cuda.is_available() and index < torch.cuda.device_count():
                want = torch.cuda.get_rng_state(index)
                if value.shape != want.shape:
                    check.fail(RNG_FILE, key, f"has {value.numel()} bytes, this GPU's generator state {want.numel()}")
                rng[key] = value
        elif key.startswith("data."):
            data[key[5:]] = value
        elif key != "torch":
            check.fail(RNG_FILE, key, "is not a tensor tformer saves there")
    if sampler is not None:
        _sampler_state(check, data, sampler)
    return rng, data


def _sampler_state(check: Check, data: dict, template: dict) -> None:
    """The data sampler's saved state against the form the run's own source gives it."""
    for key, want in template.items():
        field = f"data.{key}"
        if key not in data:
            check.fail(RNG_FILE, field, "is missing (the data sampler's place in its stream)")
        if torch.is_tensor(want):
            generator_state(check, RNG_FILE, field, data[key], want)
    extra = sorted(set(data) - set(template))
    if extra:
        check.fail(RNG_FILE, f"data.{extra[0]}", "is no part of this run's data sampler")


def generator_state(check: Check, file: str, field: str, value: torch.Tensor, want: torch.Tensor) -> None:
    """``value`` in the form of ``want``; a CPU generator's state is also tried on a scratch generator, which
    refuses a position outside its table."""
    if value.dtype != want.dtype or value.shape != want.shape:
        check.fail(file, field, f"is a {describe(value)} tensor, not {describe(want)}")
    if want.dtype == torch.uint8 and want.shape == torch.get_rng_state().shape:
        try:
            torch.Generator().set_state(value)
        except (RuntimeError, TypeError) as exc:
            check.fail(file, field, f"is not a generator state torch accepts ({first_line(exc)})")


# metrics.jsonl ----------------------------------------------------------------------------------
def _against_metrics(check: Check, run_dir: Path, state: dict) -> None:
    """The step against the run's metrics log, which has a line at every multiple of the log and eval intervals.

    A run resumed with another --log-interval can leave a longer stretch unlogged, so the slack is the
    widest gap in the log plus the saved intervals. A log that is missing or holds no record says nothing.
    """
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return
    text = read_text(path, "metrics log", max_bytes=MAX_METRICS_BYTES, fix=check.fix)
    steps = sorted({r["step"] for r in map(_record, complete_lines(text)) if r is not None and r["step"] >= 0})
    step = state["step"]
    if not steps or step <= steps[-1]:
        return
    args = state["train_args"]
    slack = max(b - a for a, b in zip([0, *steps], steps)) + max(args["log_interval"], args["eval_interval"])
    if step - steps[-1] >= slack:
        check.fail(STATE_FILE, "step", f"is {step}, ahead of {path}, whose last record is step {steps[-1]}",
                   fix=f"{check.fix} (if {METRICS_FILE} was cut short by hand, move it aside to resume)")
