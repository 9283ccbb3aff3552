"""Tables piped into a file or a pager keep every cell whole: `tformer presets > presets.txt` is readable
(rich fits a table to the console width by eliding cells to "pres…" unless the console is wide enough),
and a pipe never receives colour or cursor codes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tformer.cli._cost_common import PIPE_WIDTH, console
from tformer.core.config import preset_names

ROOT = Path(__file__).resolve().parents[2]


def piped(*args: str, columns: str | None) -> str:
    """stdout of `python -m tformer ARGS` into a pipe (not a terminal), with COLUMNS unset or as given."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    if columns is not None:
        env["COLUMNS"] = columns
    done = subprocess.run([sys.executable, "-m", "tformer", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


@pytest.mark.parametrize("columns", [None, "20"])
@pytest.mark.parametrize("args", [("presets",), ("count", "--ops"), ("scale",), ("specs",)])
def test_piped_tables_are_never_elided_and_carry_no_escape_codes(args, columns):
    out = piped(*args, columns=columns)
    assert "┃" in out or "│" in out, out[:500]  # a table was printed
    assert "…" not in out, next(line for line in out.splitlines() if "…" in line)
    assert "\x1b" not in out


@pytest.mark.parametrize("columns", [None, "20"])
def test_piped_presets_name_every_preset_whole_on_one_row(columns):
    rows = piped("presets", columns=columns).splitlines()
    for name in preset_names():
        assert any(line.startswith(f"│ {name} ") for line in rows), name


def test_console_is_wide_and_plain_when_stdout_is_not_a_terminal(monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")  # even a forced-colour environment must not colour a pipe
    monkeypatch.setattr(sys.stdout, "isatty", lambda: False, raising=False)
    con = console()
    assert con.width == PIPE_WIDTH
    assert not con.is_terminal and con.color_system is None
