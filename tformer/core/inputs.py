"""Text, names and numbers as they arrive from a user: checked once where they enter, so that a bad one is one
line naming where it came from (a flag, standard input, a JSON field) and what would be accepted, never a
traceback from deep inside. No torch: the cost commands use these too.

Text must be valid UTF-8. Python hands a command line's undecodable bytes over as lone surrogates (U+DC80 to
U+DCFF, its "surrogateescape" convention) and a JSON string may hold a lone surrogate of its own ("\\ud800");
neither can be encoded, tokenized or printed, so both are refused here instead of failing later.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tformer.core.errors import TformerError

__all__ = ["Bounds", "check_name", "check_text", "decode_text", "first_bad_text", "number", "open_stream",
           "read_stream", "shown", "whole"]

TEXT_FIX = "give UTF-8 text (convert it with e.g. `iconv -f latin1 -t utf-8`)"
_ESCAPED = range(0xDC80, 0xDD00)  # surrogateescape's stand-ins for the bytes 0x80-0xff


def first_bad_text(text: str, *, escaped: bool = True) -> str | None:
    """What makes ``text`` not UTF-8 ("byte 0xff at byte 3", "lone surrogate U+D800 at byte 0"), or None.

    ``escaped``: the text came from bytes decoded with surrogateescape (argv, a surrogateescape stream), so
    U+DC80..U+DCFF stand for the undecodable bytes themselves."""
    for i, ch in enumerate(text):
        code = ord(ch)
        if 0xD800 <= code <= 0xDFFF:
            offset = len(text[:i].encode("utf-8"))  # nothing before i is a surrogate
            what = f"byte 0x{code - 0xDC00:02x}" if escaped and code in _ESCAPED else f"lone surrogate U+{code:04X}"
            return f"{what} at byte {offset}"
    return None


def check_text(text: str, where: str, *, escaped: bool = True, fix: str = TEXT_FIX) -> str:
    """``text`` if it is valid UTF-8 text; else one TformerError naming ``where``, the bad byte and its offset."""
    bad = first_bad_text(text, escaped=escaped)
    if bad is not None:
        raise TformerError(f"{where} is not valid UTF-8 ({bad}); {fix}")
    return text


def decode_text(data: bytes, where: str, *, fix: str = TEXT_FIX) -> str:
    """``data`` decoded as UTF-8 (strictly: no replacement characters slipped into a prompt); else one
    TformerError naming ``where``, the first bad byte and its offset."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TformerError(f"{where} is not valid UTF-8 (byte 0x{data[exc.start]:02x} at byte {exc.start}); "
                           f"{fix}") from None


def read_stream(stream, where: str = "standard input", instead: str = "") -> str:
    """All of ``stream`` as checked text: its bytes when it has them (a real stdin), else its text (a test's
    StringIO), which is checked the same way. Line ends come as a text stream gives them ("\\r\\n" and "\\r"
    read as "\\n"), so a file saved on Windows prompts the same as one saved here. A closed stream (a shell's
    ``0<&-`` leaves sys.stdin None) is one TformerError naming ``instead``, what to give in its place."""
    open_stream(stream, where, instead)
    raw = getattr(stream, "buffer", None)
    if raw is None:
        return check_text(stream.read(), where)
    return decode_text(raw.read(), where).replace("\r\n", "\n").replace("\r", "\n")


def open_stream(stream, where: str = "standard input", instead: str = ""):
    """``stream`` if it can be read, else one TformerError: a process started with its standard input closed
    gets None for sys.stdin, a stream closed under us raises on every call."""
    if stream is None or getattr(stream, "closed", False):
        raise TformerError(f"{where} is closed, so there is nothing to read; " + (instead or f"give {where} a file "
                           "or a pipe"))
    return stream


def check_name(value: str, where: str, *, folder_ok: bool = True, expected: str = "a name or a path") -> str:
    """``value`` if it can name a preset, a corpus, a device or a file; else one TformerError naming ``where``.

    Refused: empty or blank names (a shell variable that was never set), control characters (NUL cannot be in
    a path at all; a newline would split the error line), text that is not UTF-8, and "." or ".." where a
    folder is no answer (``folder_ok`` False: a preset or a config file)."""
    check_text(value, where, fix=f"give {expected} in UTF-8")
    if not value.strip():
        raise TformerError(f"{where} is {'empty' if not value else 'blank'}; give {expected}")
    control = next((ch for ch in value if ord(ch) < 0x20 or ord(ch) == 0x7F), None)
    if control is not None:
        raise TformerError(f"{where} holds the control character {control!r} at character {value.index(control)}; "
                           f"give {expected} without it")
    if not folder_ok and value.strip() in (".", ".."):
        raise TformerError(f"{where} is {value.strip()!r}, a folder; give {expected}")
    return value


def shown(value) -> str:
    """A value as an error message shows it: a 400-digit integer by its length, not its digits."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10 ** 18:
        return f"{'-' if value < 0 else ''}a whole number of {len(str(abs(value)))} digits"
    return repr(value)


def _bound(x) -> str:
    """1e15, not 1000000000000000 or 1e+15; a whole bound that is no round power, exactly (a seed's
    18446744073709551615)."""
    if isinstance(x, int) and abs(x) < 10 ** 6:
        return str(x)
    if isinstance(x, int) and str(abs(x)).rstrip("0") != "1":
        return str(x)
    text = f"{float(x):g}"
    return text.replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")


@dataclass(frozen=True)
class Bounds:
    """A finite number in [lo, hi] (either end open), or a whole number in [lo, hi]; ``note`` says what the
    ends mean ("1 turns it off")."""

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False
    integer: bool = False
    note: str = ""

    def interval(self) -> str:
        return f"{'(' if self.lo_open else '['}{_bound(self.lo)}, {_bound(self.hi)}{')' if self.hi_open else ']'}"

    def fail(self, value, where: str) -> TformerError:
        kind = "a whole number" if self.integer else "a finite number"
        note = f" ({self.note})" if self.note else ""
        return TformerError(f"{where} must be {kind} in {self.interval()}{note}, got {shown(value)}")

    def check(self, value, where: str):
        """``value`` (a -0.0 made 0.0) if it is in bounds, else one TformerError naming ``where`` and the range."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(value, where)
        if self.integer and not isinstance(value, int):
            raise self.fail(value, where)
        # An int compares exactly with a float bound; only a float can be nan or infinite.
        if isinstance(value, float) and not math.isfinite(value):
            raise self.fail(value, where)
        above = value > self.lo if self.lo_open else value >= self.lo
        below = value < self.hi if self.hi_open else value <= self.hi
        if not (above and below):
            raise self.fail(value, where)
        return value + 0 if isinstance(value, int) else value + 0.0


def number(value, where: str, lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False,
           note: str = "") -> float:
    """``value`` as a float if it is a finite number in the interval; else one TformerError naming ``where``."""
    return float(Bounds(lo, hi, lo_open, hi_open, note=note).check(value, where))


def whole(value, where: str, lo: int, hi: int, *, note: str = "") -> int:
    """``value`` if it is a whole number (not a bool) in [lo, hi]; else one TformerError naming ``where``."""
    return Bounds(lo, hi, integer=True, note=note).check(value, where)
