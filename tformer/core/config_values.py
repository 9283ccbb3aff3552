"""The checks a config value passes on its way in: its JSON type against the field's declared type, one of
a field's named choices, a whole number in range. Each failure is one line naming the field (TformerError)."""

from __future__ import annotations

import difflib
import math
from typing import Any

from tformer.core.errors import TformerError
from tformer.core.files import described

_SPELLED = {"int": "a whole number", "float": "a number", "bool": "true or false", "str": "a string",
            "list[int]": "a list of whole numbers", "list[str]": "a list of strings", "None": "null"}


def coerce(name: str, type_name: Any, value: Any) -> Any:
    """Check a value against its field's type (given as a string under PEP 563, e.g. "int | None"); a value of
    another JSON type is refused here, naming the key, rather than failing later in arithmetic."""
    kinds = [k.strip() for k in str(type_name).split("|")]
    expected = " or ".join(_SPELLED.get(k, k) for k in kinds)
    if value is None:
        if "None" in kinds:
            return None
        raise TformerError(f"{name} cannot be null; give {expected}")
    if "list[int]" in kinds and isinstance(value, list):
        for item in value:
            if isinstance(item, bool) or not isinstance(item, int):
                raise TformerError(f"{name} must hold whole numbers, got {described(item)} in its list")
        return list(value)
    if "list[str]" in kinds and isinstance(value, list):
        for item in value:
            if not isinstance(item, str):
                raise TformerError(f"{name} must hold strings, got {described(item)} in its list")
        return list(value)
    if "bool" in kinds and isinstance(value, bool):
        return value
    if "int" in kinds and not isinstance(value, bool):
        # 4.0 is the whole number 4 (JSON writers differ on this); 4.5, NaN and Infinity are not
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, int):
            return value
    if "float" in kinds and isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise TformerError(f"{name} is {described(value)}, beyond the range of a number; give a smaller "
                               "value") from None
    if "str" in kinds and isinstance(value, str):
        return value
    raise TformerError(f"{name} must be {expected}, got {described(value)}")


def quoted(value: Any) -> str:
    """'value' for a short printable name, else how its file spells it (a 1 MB string stays out of the message)."""
    if isinstance(value, str) and len(value) <= 40 and value.isprintable():
        return f"'{value}'"
    return described(value)


def choice(name: str, value: Any, options: tuple[str, ...]) -> None:
    if not isinstance(value, str) or value not in options:
        hint = difflib.get_close_matches(value, [o for o in options if o], n=1) if isinstance(value, str) else []
        extra = f" (did you mean '{hint[0]}'?)" if hint else ""
        raise TformerError(f"{name}={quoted(value)} is unknown{extra}; choose one of: "
                           f"{', '.join(repr(o) if not o else o for o in options)}")


def whole(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TformerError(f"{name} must be a whole number, got {value!r}")
    if value < low:
        raise TformerError(f"{name} must be at least {low}, got {value}")


def divisor_near(n: int, k: int) -> int:
    # Divisors come in pairs (d, n // d) with d <= sqrt(n): O(sqrt n), so a huge d_model does not hang the error.
    small = [d for d in range(1, min(math.isqrt(n), 10 ** 6) + 1) if n % d == 0]
    return min(small + [n // d for d in small], key=lambda d: abs(d - k))


__all__ = ["choice", "coerce", "divisor_near", "quoted", "whole"]
