"""Fuzzing (hypothesis): the config loader, `--set`, and the numeric arguments of count, scale and generate.

Every input ends in a valid result (exit 0), a TformerError (exit 2, one line on stderr), or argparse's own
exit 2 for a value of the wrong type; never another exception. Examples per property are kept moderate so
the suite stays fast on two cores; the total is FUZZ_EXAMPLES."""

from __future__ import annotations

import dataclasses
import io
import json
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.torch import save_model

from tformer.cli import main
from tformer.core.config import ModelConfig
from tformer.core.errors import TformerError
from tformer.interop import load_config
from tformer.model import build

FIELDS = [f.name for f in dataclasses.fields(ModelConfig)]
TINY = dict(n_layers=1, d_model=8, n_heads=2, d_ff=16, vocab_size=16, max_positions=16)
EXAMPLES = {"config": 200, "json_text": 100, "overrides": 200, "count": 200, "scale": 150, "generate": 150}
FUZZ_EXAMPLES = sum(EXAMPLES.values())


def fuzz(name: str):
    return settings(max_examples=EXAMPLES[name], deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# Values a user (or a hand-edited file) may put anywhere: the edges of each JSON type.
NUMBERS = st.one_of(st.integers(-3, 70), st.integers(-(10 ** 30), 10 ** 30),
                    st.floats(allow_nan=True, allow_infinity=True))
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=12),
                    st.sampled_from(["decoder", "encoder", "encoder-decoder", "rope", "alibi", "relative", "rmsnorm",
                                     "post", "silu", "swiglu", "reference", "none"]))
JSON_VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                            st.dictionaries(st.text(max_size=5), inner, max_size=3)),
                           max_leaves=6)
KEYS = st.one_of(st.sampled_from(FIELDS + ["mlp"]), st.text(max_size=10))
# A command-line value: numbers as a user types them (ints, floats, exponents, inf, nan) and any text.
ARG_VALUES = st.one_of(st.integers(-5, 5000).map(str), st.integers(-(10 ** 40), 10 ** 40).map(str),
                       st.floats(allow_nan=True, allow_infinity=True).map(repr),
                       st.sampled_from(["0", "1", "-1", "1e3", "1e400", "-inf", "nan", "0.5", "", " ", "0x10"]),
                       st.text(max_size=8))


def cli(argv: list[str]) -> str:
    """Run ``tformer ARGV`` in-process: "ok" (exit 0), "error" (TformerError: exit 2, one stderr line) or
    "usage" (argparse's exit 2). Any other exception propagates, and hypothesis reports the input."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = main(argv)
    except SystemExit as exc:
        assert exc.code == 2, (argv, exc.code)
        return "usage"
    if code == 0:
        return "ok"
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1, (argv, code, err.getvalue()[-2000:])
    assert lines[0].startswith(f"tformer {argv[0]}: error: "), lines[0]
    return "error"


def options(names: list[str]):
    """A few of ``names`` (no repeats), each with a fuzzed value, as `--name=value` (so a value starting
    with '-' is a value, not an option)."""
    return st.lists(st.tuples(st.sampled_from(names), ARG_VALUES), max_size=4, unique_by=lambda nv: nv[0]).map(
        lambda pairs: [f"--{n}={v}" for n, v in pairs])


# The config loader -------------------------------------------------------------------------
@fuzz("config")
@given(changes=st.dictionaries(KEYS, JSON_VALUES, max_size=4), arch=st.sampled_from(["decoder", "encoder",
                                                                                    "encoder-decoder"]))
def test_config_dict_and_file_load_or_refuse(changes, arch):
    data = {**TINY, "arch": arch, **changes}
    try:
        config = ModelConfig.from_dict(data)
    except TformerError:
        config = None
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(json.dumps(data))  # NaN/Infinity as Python's json writes them
        try:
            loaded = load_config(path)
        except TformerError:
            assert config is None, data  # the file refuses exactly what the dict refuses
        else:
            assert loaded == config
    if config is not None:
        assert ModelConfig.from_dict(config.to_dict()) == config  # a valid config round-trips


@fuzz("json_text")
@given(text=st.one_of(st.text(max_size=60), st.binary(max_size=60).map(lambda b: b.decode("latin-1")),
                      JSON_VALUES.map(json.dumps)))
def test_any_config_file_text_loads_or_refuses(text):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.json"
        path.write_text(text, encoding="utf-8", errors="surrogateescape")
        try:
            load_config(path)
        except TformerError:
            pass


@fuzz("overrides")
@given(items=st.lists(st.one_of(st.tuples(KEYS, ARG_VALUES).map("=".join),
                                st.tuples(KEYS, JSON_VALUES.map(json.dumps)).map("=".join),
                                st.text(max_size=16)), max_size=3))
def test_set_overrides_apply_or_refuse(items):
    base = ModelConfig(**TINY)
    try:
        config = base.with_overrides(items)
    except TformerError:
        return
    assert isinstance(config, ModelConfig)


# Numeric arguments of the commands ---------------------------------------------------------------
COUNT_OPTIONS = ["batch", "seq", "context", "seq-decoder", "efficiency"]


@fuzz("count")
@given(preset=st.sampled_from(["char-small", "vaswani-base", "bert-base"]),
       phase=st.sampled_from(["forward", "train", "prefill", "decode"]),
       extra=st.sampled_from([[], ["--json"], ["--hardware", "a100"], ["--hardware", "a100", "--json", "--ops"]]),
       opts=options(COUNT_OPTIONS))
def test_count_numbers_give_a_result_or_one_line(preset, phase, extra, opts):
    cli(["count", "--preset", preset, "--phase", phase, *extra, *opts])


SCALE_OPTIONS = ["factor", "batch", "seq", "train-tokens", "devices", "utilization", "price", "budget", "efficiency"]


@fuzz("scale")
@given(preset=st.sampled_from(["char-small", "vaswani-base"]),
       extra=st.sampled_from([[], ["--json"], ["--hardware", "a100"], ["--hardware", "a100", "--json"]]),
       opts=options(SCALE_OPTIONS))
def test_scale_numbers_give_a_result_or_one_line(preset, extra, opts):
    cli(["scale", "--preset", preset, *extra, *opts])


@pytest.fixture(scope="module")
def tiny_ckpt(tmp_path_factory):
    """A 1-layer decoder with d_model 8 and a 16-token context: loading it per example costs milliseconds."""
    path = tmp_path_factory.mktemp("fuzz") / "tiny"
    path.mkdir()
    config = ModelConfig(**TINY, eos_token_id=3)
    torch.manual_seed(0)
    save_model(build(config), str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config.to_dict()))
    return path


GENERATE_OPTIONS = ["max-new-tokens", "temperature", "top-k", "top-p", "min-p", "repetition-penalty", "num-beams",
                    "length-penalty", "seed", "batch", "prompt-ids"]


@fuzz("generate")
@given(extra=st.sampled_from([[], ["--greedy"], ["--json"], ["--no-cache"], ["--growing-cache", "--truncate"]]),
       opts=options(GENERATE_OPTIONS))
def test_generate_numbers_give_a_result_or_one_line(tiny_ckpt, extra, opts):
    prompt = [] if any(o.startswith("--prompt-ids=") for o in opts) else ["--prompt-ids", "1,2,3"]
    cli(["generate", "--ckpt", str(tiny_ckpt), *prompt, "--stop-ids", "", *extra, *opts])


# What the fuzzing found, kept as plain cases --------------------------------------------------------
@pytest.mark.parametrize("argv", [
    ["scale", "--factor=1e400"],  # inf reached int() in scaled_config: OverflowError
    ["scale", "--factor=nan"],
    ["scale", "--preset", "char-small", "--factor=1e30", "--knobs", "n_layers"],  # a ledger of 4e30 layers
    ["count", "--set", "n_layers=1000000000"],
    ["count", "--set", "rope_theta=NaN", "--set", "position=rope"],
    ["count", "--set", "norm_eps=Infinity"],
    ["count", "--set", "n_heads=2", "--set", "d_model=1000000000001"],  # the hint's divisor search was O(n)
    ["count", "--set", "n_layers=" + "1" * 5000],
    ["count", "--set", "mlp=[]"],  # an unhashable shorthand: TypeError in the dict lookup  # past int()'s digit limit: ValueError, not JSONDecodeError
])
def test_found_inputs_end_in_one_line(argv):
    assert cli(argv) == "error"


@pytest.mark.parametrize("option", ["--batch=100000000000000000000", "--seed=100000000000000000000000"])
def test_found_generate_inputs_end_in_one_line(tiny_ckpt, option):  # were OverflowError / ValueError tracebacks
    assert cli(["generate", "--ckpt", str(tiny_ckpt), "--prompt-ids", "1,2,3", option]) == "error"
