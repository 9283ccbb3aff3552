"""`tformer train --resume` checks the whole run state before restoring any of it.

One real tiny run is made per module; each case copies it, damages one field of its checkpoint (or the
metrics log the step is checked against) and resumes it through the CLI's own entry point. Every damage
must end in exit 2 with exactly one stderr line naming the file and the field, no traceback, and every
file of the run folder byte-identical afterwards. Hypothesis draws wrong-typed and edge values for the
numeric fields.

The command runs in this process (tformer.cli.main, as tests/cli/test_fuzz.py does), not in a forked
child: building the optimizer imports torch._dynamo, seconds a child, once here.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import math
import shutil
import struct
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from safetensors.torch import load_file, save_file

from tformer.cli import main

MAX_STEPS, LR, BETA2 = 8, 1e-3, 0.99
TINY = ["--set", "n_layers=1", "--set", "d_model=16", "--set", "n_heads=2", "--set", "d_ff=32",
        "--set", "max_positions=16", "--batch-size", "4", "--warmup", "2", "--eval-batches", "1",
        "--log-interval", "1", "--eval-interval", "4", "--ckpt-interval", "4", "--lr", str(LR),
        "--beta2", str(BETA2), "--no-progress"]


def tformer(*argv) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of `tformer ARGV`; any exception but TformerError propagates."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = main([str(a) for a in argv])
    finally:
        # `tformer train` flushes denormals for its process; hypothesis, between examples, needs them back.
        torch.set_flush_denormal(False)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """A finished run of MAX_STEPS steps with its checkpoint (never damaged: each case copies it)."""
    tmp = tmp_path_factory.mktemp("resume-validation")
    corpus = tmp / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog; " * 300)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TFORMER_CACHE", str(tmp / "cache"))
        code, _, err = tformer("train", *TINY, "--data", corpus, "--max-steps", MAX_STEPS, "--out", tmp / "run")
        assert code == 0, err[-2000:]
        yield tmp / "run"


_copies = itertools.count()


def _copy(template: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(template, tmp_path / f"run{next(_copies)}"))


def _hashes(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _refused(run: Path, file: str, field: str) -> str:
    """Resume ``run``: exit 2, one stderr line naming ``file`` and ``field``, nothing in the run changed."""
    before = _hashes(run)
    code, out, err = tformer("train", "--resume", "--out", run, "--max-steps", MAX_STEPS + 4)
    lines = err.splitlines()
    assert code == 2, err[-2000:]
    assert "Traceback" not in out + err
    assert len(lines) == 1 and lines[0].startswith("tformer train: error: "), err
    assert file in lines[0] and f"'{field}" in lines[0], lines[0]
    assert _hashes(run) == before
    return lines[0]


# Damage, file by file ---------------------------------------------------------------------------
def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _edit_tensors(path: Path, change) -> None:
    tensors = load_file(str(path))
    change(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))


def state(change):
    return lambda run: _edit_json(run / "checkpoint" / "state.json", change)


def optim(change):
    return lambda run: _edit_json(run / "checkpoint" / "optimizer.json", change)


def moments(change):
    return lambda run: _edit_tensors(run / "checkpoint" / "optimizer.safetensors", change)


def rng(change):
    return lambda run: _edit_tensors(run / "checkpoint" / "rng.safetensors", change)


def weights(change):
    return lambda run: _edit_tensors(run / "checkpoint" / "model.safetensors", change)


def setter(key, value):
    return lambda d: d.__setitem__(key, value)


def group(g, key, value):
    return lambda d: d["param_groups"][g].__setitem__(key, value)


def _cut_metrics(run: Path) -> None:
    """Keep only the first line of the log: the checkpoint's step is then far ahead of it."""
    for name in ("metrics.jsonl", "metrics.csv"):
        path = run / name
        path.write_text("".join(path.read_text().splitlines(keepends=True)[: 2 if name.endswith("csv") else 1]))


def _position(offset: int, value: int):
    """Overwrite one int of a CPU generator's state: bytes 8..12 count the words left in its table, 16..20
    the next word to read; either past the 624-word table is a position beyond the end."""
    def change(t: torch.Tensor) -> torch.Tensor:
        raw = bytearray(t.numpy().tobytes())
        raw[offset:offset + 4] = struct.pack("<i", value)
        return torch.frombuffer(raw, dtype=torch.uint8).clone()
    return change


def _moment(key, change):
    return moments(lambda d: d.__setitem__(key, change(d[key])))


CASES = {
    # state.json
    "step negative": (state(setter("step", -1)), "state.json", "step"),
    "step a float": (state(setter("step", 4.0)), "state.json", "step"),
    "step a string": (state(setter("step", "8")), "state.json", "step"),
    "step a bool": (state(setter("step", True)), "state.json", "step"),
    "step past the run's max_steps": (state(setter("step", 10 ** 6)), "state.json", "step"),
    "step ahead of the metrics": (_cut_metrics, "metrics.jsonl", "step"),
    "step missing": (state(lambda d: d.pop("step")), "state.json", "step"),
    "elapsed_s NaN": (state(setter("elapsed_s", math.nan)), "state.json", "elapsed_s"),
    "best_val_loss NaN": (state(setter("best_val_loss", math.nan)), "state.json", "best_val_loss"),
    "best_val_loss a string": (state(setter("best_val_loss", "low")), "state.json", "best_val_loss"),
    "train_args a list": (state(setter("train_args", [])), "state.json", "train_args"),
    "train_args.max_steps zero": (state(lambda d: d["train_args"].__setitem__("max_steps", 0)), "state.json",
                                  "train_args.max_steps"),
    "train_args.lr NaN": (state(lambda d: d["train_args"].__setitem__("lr", math.nan)), "state.json",
                          "train_args.lr"),
    "python_rng missing": (state(lambda d: d.pop("python_rng")), "state.json", "python_rng"),
    "python_rng a string": (state(setter("python_rng", "seed")), "state.json", "python_rng"),
    "python_rng too short": (state(lambda d: d["python_rng"].__setitem__(1, d["python_rng"][1][:100])),
                             "state.json", "python_rng[1]"),
    "python_rng position past the end": (state(lambda d: d["python_rng"][1].__setitem__(-1, 625)), "state.json",
                                         "python_rng[1][624]"),
    "numpy_rng words as floats": (state(lambda d: d["numpy_rng"].__setitem__(1, [0.5] * 624)), "state.json",
                                  "numpy_rng[1]"),
    "numpy_rng not MT19937": (state(lambda d: d["numpy_rng"].__setitem__(0, "PCG64")), "state.json",
                              "numpy_rng[0]"),
    # rng.safetensors
    "torch RNG float32": (rng(lambda d: d.__setitem__("torch", d["torch"].float())), "rng.safetensors", "torch"),
    "torch RNG too short": (rng(lambda d: d.__setitem__("torch", d["torch"][:100].clone())), "rng.safetensors",
                            "torch"),
    "torch RNG missing": (rng(lambda d: d.pop("torch")), "rng.safetensors", "torch"),
    "sampler state missing": (rng(lambda d: d.pop("data.generator")), "rng.safetensors", "data.generator"),
    "sampler state int64": (rng(lambda d: d.__setitem__("data.generator", d["data.generator"].long())),
                            "rng.safetensors", "data.generator"),
    "sampler position past the end": (rng(lambda d: d.__setitem__("data.generator",
                                                                  _position(16, 10 ** 6)(d["data.generator"]))),
                                      "rng.safetensors", "data.generator"),
    "sampler words left zero": (rng(lambda d: d.__setitem__("data.generator", _position(8, 0)(d["data.generator"]))),
                                "rng.safetensors", "data.generator"),
    "an unknown RNG tensor": (rng(lambda d: d.__setitem__("mystery", torch.zeros(3))), "rng.safetensors", "mystery"),
    # optimizer.json
    "a third parameter group": (optim(lambda d: d["param_groups"].append(d["param_groups"][1])), "optimizer.json",
                                "param_groups"),
    "param_groups an object": (optim(setter("param_groups", {})), "optimizer.json", "param_groups"),
    "a parameter short": (optim(lambda d: d["param_groups"][1]["params"].pop()), "optimizer.json",
                          "param_groups[1].params"),
    "lr missing": (optim(lambda d: d["param_groups"][0].pop("lr")), "optimizer.json", "param_groups[0].lr"),
    "beta2 above 1": (optim(group(0, "betas", [0.9, 1.5])), "optimizer.json", "param_groups[0].betas[1]"),
    "betas a number": (optim(group(0, "betas", 0.9)), "optimizer.json", "param_groups[0].betas"),
    "eps negative": (optim(group(1, "eps", -1e-8)), "optimizer.json", "param_groups[1].eps"),
    "weight decay not the run's": (optim(group(0, "weight_decay", 0.5)), "optimizer.json",
                                   "param_groups[0].weight_decay"),
    "maximize": (optim(group(0, "maximize", True)), "optimizer.json", "param_groups[0].maximize"),
    # optimizer.safetensors
    "a moment of the wrong shape": (_moment("0.exp_avg", lambda t: t[:1].clone()), "optimizer.safetensors",
                                    "0.exp_avg"),
    "a moment NaN": (_moment("2.exp_avg", lambda t: t.fill_(math.nan)), "optimizer.safetensors", "2.exp_avg"),
    "a negative second moment": (_moment("3.exp_avg_sq", lambda t: t - 1), "optimizer.safetensors",
                                 "3.exp_avg_sq"),
    "a moment missing": (moments(lambda d: d.pop("4.exp_avg_sq")), "optimizer.safetensors", "4.exp_avg_sq"),
    "more updates than steps": (_moment("1.step", lambda t: t + 100), "optimizer.safetensors", "1.step"),
    "state of a parameter no group holds": (moments(lambda d: d.__setitem__("99.exp_avg", torch.zeros(2))),
                                            "optimizer.safetensors", "99.exp_avg"),
    "int moments": (_moment("0.exp_avg", lambda t: t.long()), "optimizer.safetensors", "0.exp_avg"),
    # the model
    "a NaN weight": (weights(lambda d: d["decoder.layers.0.mlp.up.weight"].__setitem__((0, 0), math.nan)), "model.safetensors",
                     "decoder.layers.0.mlp.up.weight"),
    "config not the run's model": (lambda run: _edit_json(run / "checkpoint" / "config.json",
                                                          setter("d_ff", 64)), "config.json", "d_ff"),
}


@pytest.mark.parametrize("name", CASES)
def test_damaged_field_is_one_line_and_the_run_is_untouched(template, tmp_path, name):
    damage, file, field = CASES[name]
    run = _copy(template, tmp_path)
    damage(run)
    _refused(run, file, field)


def test_a_sound_checkpoint_resumes(template, tmp_path):
    run = _copy(template, tmp_path)
    code, out, err = tformer("train", "--resume", "--out", run, "--max-steps", MAX_STEPS + 1)
    assert code == 0, err[-2000:]
    assert f"resumed from step {MAX_STEPS}" in out


def test_the_line_names_the_fix(template, tmp_path):
    run = _copy(template, tmp_path)
    state(setter("step", -1))(run)
    line = _refused(run, "state.json", "step")
    assert "delete the checkpoint folder" in line and "restore it from a backup" in line


# Hypothesis: wrong types and edge values for the numeric fields ---------------------------------
WRONG_TYPES = st.one_of(st.none(), st.booleans(), st.text(max_size=4), st.lists(st.integers(), max_size=2),
                        st.dictionaries(st.text(max_size=2), st.integers(), max_size=1))
NOT_FINITE = st.sampled_from([math.nan, math.inf, -math.inf])


def fuzz(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _hypothesis_case(template, tmp_path, damage, file, field):
    run = _copy(template, tmp_path)
    damage(run)
    _refused(run, file, field)
    shutil.rmtree(run)


@fuzz(6)
@given(value=st.one_of(st.integers(max_value=-1), st.integers(min_value=MAX_STEPS + 1), WRONG_TYPES, NOT_FINITE,
                       st.floats(allow_nan=False, min_value=0, max_value=MAX_STEPS)))
@example(value=-(10 ** 30))
def test_step(template, tmp_path, value):
    _hypothesis_case(template, tmp_path, state(setter("step", value)), "state.json", "step")


@fuzz(6)
@given(value=st.one_of(st.floats(max_value=-1e-12), st.floats(min_value=LR * 1.01, allow_infinity=False),
                       NOT_FINITE, WRONG_TYPES, st.integers(min_value=1)))
@example(value=-LR).via("a negative learning rate")
@example(value=1e30).via("a huge learning rate")
def test_learning_rate(template, tmp_path, value):
    _hypothesis_case(template, tmp_path, optim(group(1, "lr", value)), "optimizer.json", "param_groups[1].lr")


@fuzz(4)
@given(value=st.one_of(st.floats(max_value=-1e-12), NOT_FINITE, WRONG_TYPES))
def test_elapsed_time(template, tmp_path, value):
    _hypothesis_case(template, tmp_path, state(setter("elapsed_s", value)), "state.json", "elapsed_s")


@fuzz(4)
@given(value=st.one_of(st.floats(allow_nan=True).filter(lambda x: not 0 <= x < 1), WRONG_TYPES,
                       st.floats(0.0, 0.98)))
def test_beta2(template, tmp_path, value):
    _hypothesis_case(template, tmp_path, optim(group(0, "betas", [0.9, value])), "optimizer.json", "param_groups[0].betas")


@fuzz(4)
@given(value=st.one_of(st.integers(max_value=-1), st.integers(min_value=625), WRONG_TYPES, NOT_FINITE))
def test_numpy_position(template, tmp_path, value):
    _hypothesis_case(template, tmp_path, state(lambda d: d["numpy_rng"].__setitem__(2, value)), "state.json",
                     "numpy_rng[2]")


@fuzz(4)
@given(value=st.one_of(st.integers(min_value=MAX_STEPS + 1, max_value=2 ** 24), st.floats(max_value=-0.5),
                       st.integers(0, MAX_STEPS - 1).map(lambda i: i + 0.5), NOT_FINITE))
def test_optimizer_update_count(template, tmp_path, value):
    _hypothesis_case(template, tmp_path, _moment("5.step", lambda t: torch.full_like(t, value)), "optimizer.safetensors",
                     "5.step")
