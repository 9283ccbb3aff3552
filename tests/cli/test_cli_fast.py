"""The cost commands are arithmetic: they never import torch or numpy (process start is their budget),
and the machine layer underneath them says how a measured peak can exceed the formula's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tformer.core.errors import TformerError
from tformer.machine import above_peak_note, implied_clock_hz, vs_theoretical

ROOT = Path(__file__).resolve().parents[2]


def imported_modules(*args: str) -> set[str]:
    """Every module a fresh `python -X importtime -m tformer ARGS` process imports (the trace is on stderr)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "tformer", *args], capture_output=True,
                          text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return {m.group(1) for m in re.finditer(r"^import time:.*\|\s*(\S+)\s*$", done.stderr, re.M)}


@pytest.mark.parametrize("args", [
    ("count", "--preset", "llama-70b", "--phase", "train", "--json"),
    ("count", "--preset", "gpt2", "--hardware", "h100-sxm", "--ops"),
    ("count", "--preset", "clip-vit-b-32", "--sweep", "--fusion", "--batch", "4"),
    ("scale", "--preset", "gpt2", "--hardware", "a100", "--json"),
    ("presets", "--json"),
])
def test_cost_commands_never_import_torch_or_numpy(args):
    modules = imported_modules(*args)
    assert "tformer.cost.ledger" in modules or args[0] == "presets"  # the trace is real
    heavy = sorted(m for m in modules if m.split(".")[0] in ("torch", "numpy"))
    assert heavy == [], f"{args[0]} imported {heavy[:5]}"


def test_implied_clock_is_the_formula_run_backwards():
    # 2 cores x 16 fp32 lanes (AVX-512) x 2 x 2 FMA units at 2.445 GHz is the formula's peak ...
    peak = 2 * 16 * 2 * 2 * 2.445e9
    assert implied_clock_hz(peak, 2, 16, 2) == pytest.approx(2.445e9)
    # ... and 115% of it means the cores ran at 115% of that clock.
    assert implied_clock_hz(1.15 * peak, cores=2, lanes=16, fma_units=2) == pytest.approx(1.15 * 2.445e9)
    with pytest.raises(TformerError, match="lanes"):
        implied_clock_hz(peak, 2, 0, 2)


def test_above_the_peak_is_said_on_the_same_line_with_the_implied_clock():
    per_cycle = 2 * 16 * 2 * 2
    theo = per_cycle * 2.445e9
    text = vs_theoretical(1.15 * theo, theo, per_cycle)
    assert text.startswith("115.0% (measured above the theoretical peak")
    assert "2.812 GHz clock" in text and "formula used 2.445 GHz" in text
    assert vs_theoretical(0.8 * theo, theo, per_cycle) == "80.0%"  # below the peak: the ratio alone
    assert above_peak_note(0.8 * theo, theo, per_cycle) is None
    # No formula (a spec-table GPU): still never a bare ratio above 100%.
    assert "above the theoretical peak" in vs_theoretical(1.1, 1.0)
    assert vs_theoretical(None, 1.0) == "unknown"
