"""Inputs are read-only, by construction: every command that reads a model (or run, or file) and writes an output
refuses, before any work, an output that is the input, lies inside it, holds it, or is the training run a
checkpoint belongs to, however it is spelled (a symlink, ``..``). Each refusal is one line and exit status 2,
and every input file is byte-identical afterwards.

The table of commands x layouts is printed with ``pytest -v``."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from tiny_checkpoint import write_checkpoint

from tformer.cli import main
from tformer.core.apart import check_apart, guarded, run_of
from tformer.core.errors import TformerError

# Each command as it reads SRC (a model folder) and writes OUT.
COMMANDS = {
    "export hf": ["export", "--ckpt", "{src}", "--out", "{out}"],
    "export onnx": ["export", "--format", "onnx", "--ckpt", "{src}", "--out", "{out}"],
    "quantize": ["quantize", "--ckpt", "{src}", "--to", "int8", "--out", "{out}"],
    "prune": ["prune", "--ckpt", "{src}", "--heads", "1", "--out", "{out}"],
    "export --hf": ["export", "--hf", "{src}", "--out", "{out}"],
    "train --hf": ["train", "--hf", "{src}", "--max-steps", "1", "--out", "{out}"],
    "train --data": ["train", "--data", "{src}", "--max-steps", "1", "--out", "{out}"],
    "finetune --from": ["finetune", "--from", "{src}", "--out", "{out}"],
    "report --data": ["report", "--data", "{src}", "--out", "{out}"],
    "export --gguf": ["export", "--format", "gguf", "--gguf", "{src}", "--out", "{out}"],
}


def _layouts(run: Path):
    """(name, the model folder given, the output given): the model lives in run/checkpoint."""
    ckpt = run / "checkpoint"
    link = run.parent / "link-to-checkpoint"
    if not link.exists():
        link.symlink_to(ckpt, target_is_directory=True)
    return {
        "out is the input": (ckpt, ckpt),
        "out inside the input": (ckpt, ckpt / "export"),
        "out holds the input": (ckpt, run.parent),
        "out is the input's run": (ckpt, run),
        "out inside the input's run": (ckpt, run / "final"),
        "out is a symlink to the input": (ckpt, link),
        "out spelled with ..": (ckpt, ckpt / ".." / "checkpoint" / "sub"),
        "input given through a symlink": (link, ckpt / "x"),
    }


def _digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory) -> Path:
    run = tmp_path_factory.mktemp("layouts") / "run"
    write_checkpoint(run / "checkpoint", "decoder", True, "abcdefgh ", 16)
    (run / "metrics.jsonl").write_text('{"step": 1, "loss": 3.0}\n')
    return run


def test_every_writer_refuses_every_layout(run_folder, capsys, request):
    layouts = _layouts(run_folder)
    before = _digest(run_folder.parent)
    rows = []
    for cmd, argv in COMMANDS.items():
        for layout, (src, out) in layouts.items():
            args = [a.format(src=src, out=out) for a in argv]
            rc = main(args)
            err = capsys.readouterr().err.strip()
            assert rc == 2, (cmd, layout, err)
            assert len(err.splitlines()) == 1 and "Traceback" not in err, (cmd, layout, err)
            assert any(w in err for w in ("itself", "lies inside", "contains")), (cmd, layout, err)
            rows.append((cmd, layout, err.split("error: ", 1)[-1].replace(str(run_folder.parent), "T")[:80]))
            assert _digest(run_folder.parent) == before, (cmd, layout)
    assert not (run_folder / "final").exists() and not (run_folder / "checkpoint" / "export").exists()
    if request.config.getoption("verbose") < 1:
        return
    with capsys.disabled():
        print(f"\n{'command':18} {'layout':32} refusal")
        for cmd, layout, why in rows:
            print(f"{cmd:18} {layout:32} {why}")


def test_an_output_beside_the_input_is_allowed(run_folder, tmp_path):
    """The guard is not a blanket refusal: a sibling folder, or one whose name merely starts alike, is fine."""
    ckpt = run_folder / "checkpoint"
    check_apart(run_folder.parent / "elsewhere", guarded("--ckpt", ckpt))
    check_apart(Path(str(run_folder) + "-int8"), guarded("--ckpt", ckpt))  # a prefix of the name, not a parent
    with pytest.raises(TformerError, match="training run"):
        check_apart(run_folder / "sibling", guarded("--ckpt", ckpt))


def test_run_of_needs_a_run(tmp_path):
    """A folder named checkpoint/ outside a training run stands only for itself."""
    lone = tmp_path / "models" / "checkpoint"
    lone.mkdir(parents=True)
    assert run_of(lone) is None
    (tmp_path / "models" / "train_args.json").write_text("{}")
    assert run_of(lone) == (tmp_path / "models").resolve()


def test_relative_spellings_resolve(run_folder, monkeypatch):
    monkeypatch.chdir(run_folder)
    with pytest.raises(TformerError, match="contains the --ckpt folder"):
        check_apart(".", guarded("--ckpt", "checkpoint"))
    with pytest.raises(TformerError, match="lies inside the training run"):
        check_apart("final", guarded("--ckpt", "checkpoint"))
    with pytest.raises(TformerError, match="lies inside"):
        check_apart(os.path.join("checkpoint", "..", "checkpoint", "a"), guarded("--ckpt", "checkpoint"))
