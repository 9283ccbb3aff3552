"""One line for a damaged field of a training checkpoint: the file, the field, what is wrong and the fix.

Shared by the checks a resume runs before restoring anything (tformer.train.run_state_check,
tformer.train.optimizer_check).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NoReturn

import torch
from safetensors.torch import load_file

from tformer.core.errors import TformerError
from tformer.core.files import read_safetensors_header

STATE_FILE, RNG_FILE = "state.json", "rng.safetensors"
OPTIM_TENSORS, OPTIM_META = "optimizer.safetensors", "optimizer.json"


class RunStateError(TformerError):
    """A field of a checkpoint that cannot be resumed from; ``path`` and ``field`` name it."""

    def __init__(self, message: str, path: Path, field: str):
        super().__init__(message)
        self.path, self.field = path, field


class Check:
    """Says what is wrong with a field of the checkpoint in ``folder``, in one line with the fix."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.fix = f"delete the checkpoint folder {folder} to start afresh, or restore it from a backup"

    def fail(self, file: str | Path, field: str, problem: str, fix: str | None = None) -> NoReturn:
        path = file if isinstance(file, Path) else self.folder / file
        raise RunStateError(f"cannot resume from {path}: {field!r} {problem}; {fix or self.fix}", path, field)

    def count(self, file: str, field: str, value, least: int = 0) -> int:
        if type(value) is not int or value < least:  # bool is an int to Python, never to a step count
            self.fail(file, field, f"is {show(value)}, not a whole number {least} or more")
        return value

    def number(self, file: str, field: str, value, least: float = 0.0, most: float = math.inf, *,
               above: bool = False, below: bool = False, infinite: bool = False) -> float:
        """``value`` as a float from ``least`` to ``most``, either end left out with ``above`` / ``below``;
        +inf only with ``infinite`` (a JSON number may be any size, NaN and Infinity included)."""
        if not is_number(value):
            self.fail(file, field, f"is {kind(value)}, not a number")
        x = as_float(value)
        if math.isnan(x) or (math.isinf(x) and not (infinite and x > 0)):
            self.fail(file, field, f"is {show(value)}, not a finite number")
        low_ok = least < x if above else least <= x
        high_ok = x < most if below else x <= most
        if not (low_ok and high_ok):
            if math.isinf(most):
                wanted = f"above {least:g}" if above else f"{least:g} or more"
            else:
                wanted = f"in {'(' if above else '['}{least:g}, {most:g}{')' if below else ']'}"
            self.fail(file, field, f"is {show(value)}, not {wanted}")
        return x


def load_tensors(check: Check, name: str) -> dict[str, torch.Tensor]:
    """A checkpoint's tensors, its header checked first: a damaged file (or a pickle put in its place) is named
    before any of it is read."""
    path = check.folder / name
    read_safetensors_header(path, "checkpoint file", fix=check.fix)
    return load_file(str(path))


# Wording ----------------------------------------------------------------------------------------
def is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def as_float(value) -> float:
    try:
        return float(value)
    except OverflowError:  # an int beyond a float's range
        return math.copysign(math.inf, value)


def show(value) -> str:
    if is_number(value) and isinstance(value, int) and value.bit_length() > 128:
        return f"a whole number of {value.bit_length()} bits"  # printing one past 4300 digits raises
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def kind(value) -> str:
    if is_number(value):
        return show(value)
    return {dict: "a JSON object", list: "a list", str: f"the string {show(value)}", bool: show(value),
            type(None): "null"}.get(type(value), type(value).__name__)


def describe(t: torch.Tensor) -> str:
    return f"{str(t.dtype).removeprefix('torch.')} {list(t.shape)}"


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:120] if text else type(exc).__name__
