"""tformer.core.inputs, the checks every user number, text and name passes where it enters (issue 37).

Properties (hypothesis): a number drawn from float64's edges (inf, nan, subnormals, 1e308, -0.0) or a
400-digit integer is accepted as a finite value inside its range, or refused with one line naming the flag
and the range; any byte string is text exactly when it is UTF-8, and a refusal names the first bad byte's
offset, the same one whether the bytes came on standard input or on the command line (surrogateescape).
The Bounds drawn are the ones the commands use."""

from __future__ import annotations

import io
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tformer.cli import attention, count, generate, scale, serve, specs
from tformer.core.errors import TformerError
from tformer.core.inputs import Bounds, check_name, check_text, decode_text, read_stream
from tformer.machine.describe import HARDWARE_NUMBER
from tformer.machine.links import LINK_GBPS
from tformer.teach.examples import ENTRY

EXAMPLES = {"numbers": 300, "bytes": 300, "surrogates": 100, "names": 100}
INPUT_EXAMPLES = sum(EXAMPLES.values())


def fuzz(name: str):
    return settings(max_examples=EXAMPLES[name], deadline=None, derandomize=True)


ALL_BOUNDS = sorted({b for module in (count, scale, generate, serve, specs, attention) for b in module.NUMBERS.values()}
                    | {LINK_GBPS, HARDWARE_NUMBER, ENTRY}, key=repr)
EDGES = [math.inf, -math.inf, math.nan, 1e308, -1e308, 1.7976931348623157e308, 1e-320, -1e-320, 5e-324, -0.0, 0.0,
         1.0, 10 ** 400, -(10 ** 400), 2 ** 64, 0, 1]
NUMBERS = st.one_of(st.sampled_from(EDGES), st.floats(), st.floats(-1e-300, 1e-300),
                    st.integers(), st.integers(10 ** 15, 10 ** 500), st.integers(-(10 ** 500), -(10 ** 15)))


@fuzz("numbers")
@given(bounds=st.sampled_from(ALL_BOUNDS), value=NUMBERS)
def test_a_number_is_finite_in_range_or_one_line(bounds, value):
    try:
        out = bounds.check(value, "--flag")
    except TformerError as exc:
        message = str(exc)
        assert "\n" not in message and len(message) < 300, message
        assert message.startswith("--flag must be a ") and bounds.interval() in message, message
        return
    assert math.isfinite(out) and (out != 0 or math.copysign(1, out) == 1)  # -0.0 comes back as 0.0
    assert (out > bounds.lo if bounds.lo_open else out >= bounds.lo)
    assert (out < bounds.hi if bounds.hi_open else out <= bounds.hi)
    assert not bounds.integer or isinstance(out, int)


@pytest.mark.parametrize("value", [True, "1", None, [1]])
def test_only_numbers_are_numbers(value):
    with pytest.raises(TformerError, match="must be a finite number"):
        Bounds(0, 1).check(value, "--flag")


@fuzz("bytes")
@given(data=st.one_of(st.binary(max_size=40), st.text(max_size=20).map(str.encode),
                      st.tuples(st.text(max_size=8), st.binary(max_size=4)).map(lambda t: t[0].encode() + t[1])))
def test_bytes_are_text_exactly_when_utf8(data):
    try:
        expected = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        where = f"byte 0x{data[exc.start]:02x} at byte {exc.start}"
        for refuse in (lambda: decode_text(data, "standard input"),
                       lambda: read_stream(io.TextIOWrapper(io.BytesIO(data)), "standard input"),
                       lambda: check_text(data.decode("utf-8", "surrogateescape"), "--prompt")):  # as argv
            with pytest.raises(TformerError) as err:
                refuse()
            assert where in str(err.value) and "\n" not in str(err.value), str(err.value)
        return
    assert decode_text(data, "standard input") == expected
    as_python_reads_it = io.TextIOWrapper(io.BytesIO(data), encoding="utf-8").read()  # "\r\n" -> "\n"
    assert read_stream(io.TextIOWrapper(io.BytesIO(data)), "standard input") == as_python_reads_it
    assert check_text(expected, "--prompt") == expected


# Text as a JSON string may spell it: mostly plain, with lone surrogates and control characters mixed in.
JSON_TEXT = st.text(st.one_of(st.characters(max_codepoint=0x2FF), st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF),
                              st.sampled_from("\x00\n\t é€😀")), max_size=12)


@fuzz("surrogates")
@given(text=JSON_TEXT)
def test_a_lone_surrogate_is_refused_at_its_offset(text):
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        with pytest.raises(TformerError) as err:
            check_text(text, "prompt", escaped=False)
        offset = len(text[:exc.start].encode("utf-8"))
        assert f"lone surrogate U+{ord(text[exc.start]):04X} at byte {offset}" in str(err.value)
    else:
        assert check_text(text, "prompt", escaped=False) == text


@fuzz("names")
@given(name=st.one_of(JSON_TEXT, st.sampled_from(["", " ", "\t", ".", "..", "a\x00b", "gpt2\n", "gpt2", "./x"])))
def test_a_name_is_printable_or_one_line(name):
    try:
        out = check_name(name, "--preset", folder_ok=False, expected="a preset name")
    except TformerError as exc:
        assert str(exc).startswith("--preset ") and "\n" not in str(exc)
        return
    assert out == name and name.strip() not in ("", ".", "..")
    assert all(ord(ch) >= 0x20 and ord(ch) != 0x7F for ch in name)
    name.encode("utf-8")
