"""Three kinds of bad input that used to end badly: an error line quoting a long finding (cut to 300 characters in
its middle, so the problem and the fix both stay), a command that reads standard input started with it closed (one
line, exit 2, not a traceback), and a seed outside what the generators take (one line, like every other integer)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tformer.cli import main
from tformer.core.errors import FULL_ERRORS, LINE_LIMIT, error_line


def test_a_long_error_line_is_cut_in_its_middle_and_whole_on_request(monkeypatch):
    found = ", ".join(f"blk.{i}.attn_q.weight" for i in range(400))
    text = f"tformer x: error: the file holds {found}; load it with --gguf-weights dequantize"
    line = error_line(text)
    assert len(line) <= LINE_LIMIT and "\n" not in line
    assert line.startswith("tformer x: error: the file holds blk.0.attn_q.weight")
    assert line.endswith("] blk.399.attn_q.weight; load it with --gguf-weights dequantize")  # whole words kept
    note = line[line.index(" [... "):line.index("shows all] ") + len("shows all] ")]
    cut = int(note.split("[... ")[1].split(" characters cut")[0].replace(",", ""))
    assert len(line) - len(note) + cut == len(text)  # the note counts what it took out
    assert error_line("short; fix it") == "short; fix it"
    assert error_line("two\nlines") == "two lines"
    monkeypatch.setenv(FULL_ERRORS, "1")
    assert error_line(text) == text


def test_a_long_path_loses_its_middle_first():
    path = "/tmp/" + "a" * 150 + "/run/checkpoint/state.json:"
    text = (f"tformer train: error: cannot resume from {path} 'step' is -3, not a whole number 0 or more; delete the "
            f"checkpoint folder {path[:-12]} to start afresh, or restore it from a backup")
    line = error_line(text)
    assert len(line) <= LINE_LIMIT and "characters cut" not in line  # the paths alone made it long
    assert "a...a" in line and "/run/checkpoint/state.json: 'step' is -3, not a whole number 0 or more; delete" in line
    assert line.endswith("to start afresh, or restore it from a backup")


def test_the_cli_prints_a_long_error_in_one_cut_line(tmp_path, capsys):
    missing = tmp_path / ("d" * 200) / ("e" * 200) / "model.gguf"
    assert main(["generate", "--gguf", str(missing), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and len(err) <= LINE_LIMIT + 1, err
    assert err.startswith("tformer generate: error:") and "eee/model.gguf" in err


def _closed_stdin(*argv) -> subprocess.CompletedProcess:
    """tformer started as a shell's `0<&-` starts it: no file descriptor 0 at all (sys.stdin is None)."""
    return subprocess.run([sys.executable, "-m", "tformer", *argv], capture_output=True, text=True, timeout=300,
                          preexec_fn=lambda: os.close(0))


@pytest.mark.parametrize("argv,words", [
    (["chat", "--preset", "char-small"], "standard input is closed, so there is nothing to read; chat reads your "),
    (["generate", "--preset", "char-small"], "give --prompt TEXT (or --prompt-ids), or pipe the prompt in"),
    (["translate", "--preset", "vaswani-base"], "give the sentences as arguments, or pipe them in one a line"),
])
def test_a_command_that_reads_a_closed_stdin_says_so_in_one_line(argv, words):
    done = _closed_stdin(*argv)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and words in done.stderr, done.stderr


@pytest.mark.parametrize("argv,flag,value", [
    (["finetune", "--out", "never", "--data-seed", "-1"], "--data-seed", "-1"),
    (["generate", "--preset", "char-small", "--prompt-ids", "1", "--seed", str(2 ** 64)], "--seed",
     "a whole number of 20 digits"),
    (["train", "--out", "never", "--seed", "-5"], "--seed", "-5"),
])
def test_every_seed_is_checked_like_the_other_integers(argv, flag, value, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert f"{flag} must be a whole number in [0, 18446744073709551615] (a seed), got {value}" in err
    assert not (tmp_path / "never").exists()
