"""Values a hand-edited or foreign file may hold where tformer expects something else (issue 37, wrong-content
files): hypothesis strategies shared by the parsers' property tests, and the checks every refusal must pass.
Not a test module itself."""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from tformer.core.errors import TformerError

# The edges of every JSON type: null, both booleans, small / huge / negative whole numbers, floats with NaN and the
# infinities, empty and long strings, strings that spell a missing value, and short nestings of them.
HUGE_INT = 10 ** 400  # past a float's range; json still reads and writes it
LONG_TEXT = "x" * 200_000
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 70), st.integers(-(10 ** 30), 10 ** 30), st.just(HUGE_INT),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), st.just(LONG_TEXT),
    st.sampled_from(["", " ", "nan", "NaN", "None", "null", "true", "8", "8.5", "-1", "\ud800", "a\u2028b"]),
)
HOSTILE = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                        st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                       max_leaves=5)
DELETE = object()  # a key removed instead of set


def examples(n: int):
    """hypothesis settings for a property of ``n`` examples: derandomized (the same inputs on every run), no deadline
    (two busy cores)."""
    return settings(max_examples=n, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def one_line(exc: BaseException, *needles: str) -> str:
    """The message of a refusal: exactly a TformerError, one line, naming each of ``needles``."""
    assert isinstance(exc, TformerError), f"{type(exc).__name__} escaped: {exc!r}"[:2000]
    message = str(exc)
    assert message and len(message.splitlines()) == 1 and message == message.strip(), message[:2000]
    assert len(message) < 2000, f"the error quotes too much of the file: {message[:300]}..."
    for needle in needles:
        assert needle in message, f"{needle!r} not in {message!r}"
    return message
