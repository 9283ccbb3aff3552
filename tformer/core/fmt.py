"""Numbers with their units, for the report's text. Exact integers keep their digits (FLOPs,
bytes, parameters); rates and times get three significant figures and an SI prefix. Bytes say
which unit they use: GB = 1e9, GiB = 2^30 (DESIGN.md)."""

from __future__ import annotations

import math

_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def known(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def si(value, unit: str, digits: int = 3) -> str:
    if not known(value):
        return "unknown"
    for factor, prefix in _PREFIXES:
        if abs(value) >= factor:
            return f"{value / factor:.{digits}g} {prefix}{unit}"
    return f"{value:.{digits}g} {unit}"


def count(n) -> str:
    return f"{n:,}" if known(n) else "unknown"


def flops(n) -> str:
    """'56,107,204,608 FLOPs (56.1 GFLOP)'."""
    return f"{n:,} FLOPs ({si(n, 'FLOP')})" if known(n) else "unknown"


def params(n) -> str:
    return f"{n:,} ({si(n, '').strip()})" if n >= 1000 else f"{n:,}"


def nbytes(n) -> str:
    """'25,165,824 B (25.2 MB, 24 MiB)': exact bytes, then both decimal and binary units."""
    if not known(n):
        return "unknown"
    if abs(n) < 1000:
        return f"{n:,} B"
    return f"{int(n):,} B ({si(n, 'B')}, {_binary(n)})"


def gib(n) -> str:
    return _binary(n) if known(n) else "unknown"


def _binary(n) -> str:
    for power, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if abs(n) >= 2**power:
            return f"{n / 2**power:.3g} {unit}"
    return f"{n:g} B"


def rate(value, unit: str = "FLOP/s") -> str:
    return si(value, unit)


def bandwidth(value) -> str:
    return si(value, "B/s") if known(value) else "unknown"


def seconds(t) -> str:
    if not known(t):
        return str(t) if t is not None else "unknown"
    for size, unit in ((86400 * 365, "years"), (86400, "days"), (3600, "h"), (60, "min")):
        if t >= size * 1.5:
            return f"{t / size:.3g} {unit} ({t:,.0f} s)"
    if t >= 1:
        return f"{t:.3g} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3g} ms"
    if t >= 1e-6:
        return f"{t * 1e6:.3g} µs"
    return f"{t * 1e9:.3g} ns"


def pct(x, digits: int = 1) -> str:
    return f"{100 * x:.{digits}f}%" if known(x) else "unknown"


def ratio(x) -> str:
    return f"{x:.2f}x" if known(x) else "unknown"


def num(x, digits: int = 3) -> str:
    """Short decimal; numbers of 1000 and more keep all their integer digits (no 1.87e+04)."""
    if not known(x):
        return "unknown"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


__all__ = ["bandwidth", "count", "flops", "gib", "known", "nbytes", "num", "params", "pct", "rate", "ratio",
           "seconds", "si"]
