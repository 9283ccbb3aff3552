"""The machinery of the hostile-input campaign (tests/cli/test_campaign_*.py): a case folder with
helpers that build hostile inputs in it, the run of the real CLI in a process of its own (forked from the
test process, tests/forked_cli.py), and the checks every case must pass. Not a test module itself."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
from forked_cli import run_tformer

from tformer.core.config import ModelConfig
from tformer.core.files import MAX_JSON_BYTES
from tformer.interop.checkpoint import save_model
from tformer.interop.hf import save_hf
from tformer.model import build

REPO = Path(__file__).resolve().parents[2]
TINY = dict(n_layers=1, d_model=8, n_heads=2, d_ff=16, vocab_size=16, max_positions=16)
# The checkpoints Kit.ckpt copies: the tiny decoder, and variants for the cases that need another kind.
KINDS = {"decoder": TINY, "encoder": {**TINY, "arch": "encoder"}, "alibi": {**TINY, "position": "alibi"},
         "wide": {**TINY, "d_ff": 32}, "seq2seq": {**TINY, "arch": "encoder-decoder"}}
TIMEOUT_S = 120


class Case(NamedTuple):
    """One hostile input: ``build(kit)`` makes its files in kit.dir and returns the argv after
    `tformer`, or (argv, bytes on standard input); ``needle`` is a piece of the one-line error that names
    the problem."""

    id: str
    build: Callable[[Kit], list[str]]
    needle: str


def case(id_: str, needle: str, marks=()):
    """Decorator: the function becomes a case of the table it is collected into."""
    def wrap(fn):
        return pytest.param(Case(id_, fn, needle), id=id_, marks=marks)
    return wrap


class Kit:
    """A case's folder (everything the case creates lives here) and builders of hostile inputs."""

    def __init__(self, root: Path, templates: Templates):
        self.dir = root
        self.templates = templates

    def path(self, name: str) -> Path:
        p = self.dir / name
        p.parent.mkdir(parents=True, exist_ok=True)
        return p

    def text(self, name: str, text: str) -> str:
        p = self.path(name)
        p.write_text(text)
        return str(p)

    def bytes(self, name: str, data: bytes) -> str:
        p = self.path(name)
        p.write_bytes(data)
        return str(p)

    def json(self, name: str, obj) -> str:
        return self.text(name, json.dumps(obj))

    def nested(self, name: str, depth: int = 100_000) -> str:
        """A JSON file nested ``depth`` lists deep: Python's parser recurses once per level."""
        return self.text(name, "[" * depth + "]" * depth)

    def huge(self, name: str, size: int = MAX_JSON_BYTES + 1) -> str:
        """A sparse file larger than the bounded readers' limit: cheap to create, nothing to read."""
        p = self.path(name)
        with open(p, "wb") as fh:
            fh.truncate(size)
        return str(p)

    def folder(self, name: str) -> str:
        p = self.dir / name
        p.mkdir(parents=True, exist_ok=True)
        return str(p)

    def ckpt(self, name: str = "ckpt", kind: str = "decoder") -> Path:
        """A copy of a valid tiny checkpoint (config.json + model.safetensors), to be damaged."""
        return Path(shutil.copytree(self.templates.get(kind), self.dir / name))

    def hf(self, name: str = "hf", **config_changes) -> Path:
        """A copy of a valid tiny Hugging Face GPT-2 folder, its config.json changed by ``config_changes``
        (a value None removes the key)."""
        folder = Path(shutil.copytree(self.templates.get("hf"), self.dir / name))
        cfg = json.loads((folder / "config.json").read_text())
        for key, value in config_changes.items():
            if value is None:
                cfg.pop(key, None)
            else:
                cfg[key] = value
        (folder / "config.json").write_text(json.dumps(cfg))
        return folder


class Templates:
    """Valid tiny models, built once per session and copied into the cases that damage them."""

    def __init__(self, root: Path):
        self.root = root
        self.made: dict[str, Path] = {}

    def get(self, kind: str) -> Path:
        if kind not in self.made:
            folder = self.root / kind
            if kind == "hf":
                save_hf(build(ModelConfig(**TINY)), folder)
            else:
                save_model(build(ModelConfig(**KINDS[kind])), folder)
            self.made[kind] = folder
        return self.made[kind]


def snapshot(root: Path) -> dict[str, str]:
    """{relative path: sha256 of a file, or 'dir'} of everything under ``root``."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            out[os.path.relpath(os.path.join(dirpath, name), root)] = "dir"
        for name in filenames:
            p = os.path.join(dirpath, name)
            h = hashlib.sha256()
            with open(p, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
            out[os.path.relpath(p, root)] = h.hexdigest()
    return out


def run_case(c: Case, tmp_path: Path, templates: Templates) -> None:
    """Build the case, run `tformer ARGV` in a process of its own as a user would, and hold it to the campaign's
    rules."""
    work = tmp_path / "case"
    work.mkdir()
    kit = Kit(work, templates)
    argv, stdin = c.build(kit), None
    if isinstance(argv, tuple):
        argv, stdin = argv
    before = snapshot(work)
    # Caches and measured profiles go to a folder of their own, outside the one compared.
    env = {**os.environ, "PYTHONPATH": str(REPO), "TFORMER_CACHE": str(tmp_path / "cache"),
           "XDG_CACHE_HOME": str(tmp_path / "xdg"), "PYTHONDONTWRITEBYTECODE": "1"}
    try:
        proc = run_tformer(argv, cwd=work, env=env, timeout=TIMEOUT_S, stdin=stdin)
    finally:
        os.chmod(work, 0o700)
        for dirpath, dirnames, _ in os.walk(work):
            for name in dirnames:
                os.chmod(os.path.join(dirpath, name), 0o700)
    both = proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    report = f"argv={argv}\nexit={proc.returncode}\nstderr tail:\n{proc.stderr[-3000:]}"
    assert "Traceback" not in both, report
    assert proc.returncode == 2, report
    # TformerError: "tformer CMD: error: ..."; argparse: "tformer CMD: error: ..." or "tformer: error: ...".
    assert re.match(rf"tformer( {re.escape(argv[0])})?: error: \S", last), report
    assert c.needle.lower() in last.lower(), f"expected {c.needle!r} in the last line\n{report}"
    after = snapshot(work)
    assert after == before, f"the case folder changed: {sorted(set(after.items()) ^ set(before.items()))}\n{report}"
