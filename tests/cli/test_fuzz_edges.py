"""Fuzzing at the edges (issue 37, hypothesis): float64's edges and 400-digit integers into the numeric flags of
count, scale, generate and the attention walkthrough's matrices, and arbitrary bytes into generate's prompt (on
the command line and on standard input), all through `tformer.cli.main` in-process.

Every input ends in a result whose every number is finite (exit 0; --json parsed refusing NaN and Infinity),
a TformerError (exit 2, one line), or argparse's own exit 2 for a value of the wrong type; text is refused
exactly when it is not UTF-8, at the first bad byte's offset. The total is EDGE_FUZZ_EXAMPLES."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_checkpoint import write_checkpoint

from tformer.cli import main

EXAMPLES = {"count": 60, "scale": 50, "generate": 30, "walkthrough": 40, "prompt": 25, "stdin": 20}
EDGE_FUZZ_EXAMPLES = sum(EXAMPLES.values())
TEXT = "to be or not to be, héllo wörld\n"


def fuzz(name: str):
    return settings(max_examples=EXAMPLES[name], deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


# A number as a user types one at float64's edges: repr() keeps every digit of a subnormal.
EDGE_VALUES = st.one_of(
    st.sampled_from(["inf", "-inf", "nan", "1e308", "-1e308", "1e-320", "-1e-320", "5e-324", "-0.0", "0", "0.0",
                     "1e400", str(10 ** 400), str(-(10 ** 400)), str(2 ** 64), "1", "2", "0.5"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr), st.floats(-1e-300, 1e-300).map(repr),
    st.integers(-(10 ** 500), 10 ** 500).map(str))


def _finite(text: str) -> None:
    def refuse(name):
        raise AssertionError(f"{name} in the output")

    json.loads(text, parse_constant=refuse)


def cli(argv: list[str], stdin: bytes | None = None) -> tuple[str, str, str]:
    """("ok" | "error" | "usage", stdout, the error line) of `tformer ARGV` run in-process. Any other exception
    propagates, and hypothesis reports the input."""
    out, err = io.StringIO(), io.StringIO()
    old = sys.stdin
    if stdin is not None:
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = main(argv)
    except SystemExit as exc:
        assert exc.code == 2, (argv, exc.code)
        return "usage", "", err.getvalue().strip().splitlines()[-1]
    finally:
        sys.stdin = old
    lines = err.getvalue().strip().splitlines()
    if code == 0:
        return "ok", out.getvalue(), ""
    assert code == 2 and len(lines) == 1, (argv, code, err.getvalue()[-2000:])
    assert lines[0].startswith(f"tformer {argv[0]}: error: "), lines[0]
    return "error", "", lines[0]


def options(names: list[str]):
    return st.lists(st.tuples(st.sampled_from(names), EDGE_VALUES), min_size=1, max_size=3,
                    unique_by=lambda nv: nv[0]).map(lambda pairs: [f"--{n}={v}" for n, v in pairs])


@fuzz("count")
@given(opts=options(["batch", "seq", "context", "efficiency", "devices", "tp", "link-bandwidth", "link-latency"]),
       phase=st.sampled_from(["forward", "train", "decode"]))
def test_count_edges_give_finite_numbers_or_one_line(opts, phase):
    outcome, out, _ = cli(["count", "--preset", "char-small", "--hardware", "a100", "--phase", phase, "--json", *opts])
    if outcome == "ok":
        _finite(out)


@fuzz("scale")
@given(opts=options(["factor", "train-tokens", "utilization", "price", "budget", "devices", "efficiency"]))
def test_scale_edges_give_finite_numbers_or_one_line(opts):
    outcome, out, _ = cli(["scale", "--preset", "char-small", "--hardware", "a100", "--json", *opts])
    if outcome == "ok":
        _finite(out)


@pytest.fixture(scope="module")
def text_ckpt(tmp_path_factory):
    """A tiny decoder with a character tokenizer over TEXT."""
    return write_checkpoint(tmp_path_factory.mktemp("edges") / "dec", "decoder", True, TEXT, 32)


@fuzz("generate")
@given(opts=options(["temperature", "top-p", "min-p", "repetition-penalty", "max-new-tokens", "top-k"]),
       length_penalty=st.none() | EDGE_VALUES)
def test_generate_edges_give_finite_settings_or_one_line(text_ckpt, opts, length_penalty):
    if length_penalty is not None:  # beam search, which takes no sampling flag
        opts = ["--num-beams=2", f"--length-penalty={length_penalty}",
                *(o for o in opts if o.startswith(("--repetition-penalty", "--max-new-tokens")))]
    outcome, out, _ = cli(["generate", "--ckpt", str(text_ckpt), "--prompt-ids", "1,2", "--max-new-tokens", "2",
                           "--json", *opts])
    if outcome == "ok":
        _finite(out)


@fuzz("walkthrough")
@given(entries=st.lists(st.one_of(st.floats(allow_nan=False), st.sampled_from([1e308, 1e-320, -0.0, 1e6, -1e6]),
                                  st.integers(-(10 ** 400), 10 ** 400)), min_size=4, max_size=4))
def test_walkthrough_entries_give_finite_steps_or_one_line(entries):
    x, q, k, v = entries
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "m.json"
        path.write_text(json.dumps({"X": [[x], [1]], "W_Q": [[q]], "W_K": [[k]], "W_V": [[v]]}))
        outcome, out, line = cli(["attention", "--walkthrough", "--input", str(path), "--json"])
    if outcome == "ok":
        _finite(out)
        assert all(abs(e) <= 1e6 for e in entries)
    else:
        assert "must be a finite number in [-1e6, 1e6]" in line


def _utf8_outcome(data: bytes, outcome: str, line: str, where: str) -> None:
    """Refused as not UTF-8 exactly when ``data`` is not, at its first bad byte."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        assert outcome == "error" and f"{where} is not valid UTF-8 (byte 0x{data[exc.start]:02x} at byte {exc.start})" \
            in line, line
    else:
        assert "UTF-8" not in line, line


PROMPT_BYTES = st.one_of(st.binary(min_size=1, max_size=24), st.text(TEXT, min_size=1, max_size=12).map(str.encode),
                         st.tuples(st.text(TEXT, max_size=6), st.binary(max_size=3)).map(
                             lambda t: t[0].encode() + t[1]))


@fuzz("prompt")
@given(data=PROMPT_BYTES)
def test_prompt_bytes_on_the_command_line(text_ckpt, data):
    prompt = data.decode("utf-8", "surrogateescape")  # what Python makes of argv bytes
    outcome, _, line = cli(["generate", "--ckpt", str(text_ckpt), "--prompt", prompt, "--max-new-tokens", "1",
                            "--json"])
    _utf8_outcome(data, outcome, line, "--prompt")


@fuzz("stdin")
@given(data=PROMPT_BYTES)
def test_prompt_bytes_on_standard_input(text_ckpt, data):
    outcome, _, line = cli(["generate", "--ckpt", str(text_ckpt), "--max-new-tokens", "1", "--json"], stdin=data)
    _utf8_outcome(data, outcome, line, "standard input")


def test_argv_bytes_reach_the_check_in_a_real_process():
    """The real path: bytes in argv, decoded by the interpreter with surrogateescape (no torch is loaded
    before the check refuses them)."""
    proc = subprocess.run([sys.executable, "-m", "tformer", "count", "--preset", b"gpt\xff2"], capture_output=True,
                          cwd=Path(__file__).resolve().parents[2], timeout=120, check=False)
    err = proc.stderr.decode()
    assert proc.returncode == 2 and "Traceback" not in err, err
    assert err.strip() == ("tformer count: error: --preset is not valid UTF-8 (byte 0xff at byte 3); give UTF-8 "
                           "text (convert it with e.g. `iconv -f latin1 -t utf-8`)")
