"""Numbers with their units: the one place tformer formats them (report, commands, sources of peaks).
Exact integers keep their digits (FLOPs, bytes, parameters); rates and times get three significant
figures and an SI prefix (the cost commands ask for four). Bytes say which unit they use: GB = 1e9,
GiB = 2^30 (DESIGN.md)."""

from __future__ import annotations

import math

_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_SCALE = {"k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


def known(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def si(value, unit: str, digits: int = 3, decimals: int | None = None) -> str:
    """'56.1 GFLOP': ``digits`` significant figures, or with ``decimals`` a fixed count of decimals
    after the prefix ('2,048.0 GFLOP/s' stays below the next prefix only under 1000)."""
    if not known(value):
        return "unknown"
    spec = f",.{decimals}f" if decimals is not None else f".{digits}g"
    for factor, prefix in _PREFIXES:
        if abs(value) >= factor:
            return f"{value / factor:{spec}} {prefix}{unit}"
    return f"{value:{spec}} {unit}"


def in_unit(value, unit: str, decimals: int = 1, grouped: bool = False) -> str:
    """``value`` in one fixed prefixed unit: in_unit(3.2e10, "GB/s") -> '32.0 GB/s', in_unit(2**33, "GiB")
    -> '8.0 GiB' (binary prefixes Ki, Mi, Gi, Ti are powers of 2)."""
    if not known(value):
        return "unknown"
    prefix = unit[:2] if unit[:2] in _SCALE else unit[:1]
    return f"{value / _SCALE[prefix]:{',' if grouped else ''}.{decimals}f} {unit}"


def hz(x) -> str:
    """'2.445 GHz': clocks to the MHz, the precision the peak formula is quoted with."""
    return in_unit(x, "GHz", 3) if known(x) and x else "unknown"


def count(n) -> str:
    return f"{n:,}" if known(n) else "unknown"


def flops(n) -> str:
    """'56,107,204,608 FLOPs (56.1 GFLOP)'."""
    return f"{n:,} FLOPs ({si(n, 'FLOP')})" if known(n) else "unknown"


def params(n, word: bool = False) -> str:
    """'124,439,808 (124 M)'; with ``word`` (the cost commands): '124,439,808 params (124 M)', also below 1000."""
    if not known(n):
        return "unknown"
    if n >= 1000 or word:
        return f"{n:,}{' params' if word else ''} ({si(n, '').strip()})"
    return f"{n:,}"


def nbytes(n) -> str:
    """'25,165,824 B (25.2 MB, 24 MiB)': exact bytes, then both decimal and binary units."""
    if not known(n):
        return "unknown"
    if abs(n) < 1000:
        return f"{n:,} B"
    return f"{int(n):,} B ({si(n, 'B')}, {_binary(n)})"


def nbytes_gb(n) -> str:
    """'25,165,824 B (0.02517 GB, 0.02344 GiB)': exact bytes, then GB and GiB to four figures, so sizes
    of one table compare in the same units (the cost commands)."""
    if not known(n):
        return "unknown"
    if n < 1000:
        return f"{n:,} B"
    return f"{n:,} B ({n / 1e9:.4g} GB, {n / 2**30:.4g} GiB)"


def gib(n) -> str:
    return _binary(n) if known(n) else "unknown"


def _binary(n) -> str:
    for power, unit in ((40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")):
        if abs(n) >= 2**power:
            return f"{n / 2**power:.3g} {unit}"
    return f"{n:g} B"


def rate(value, unit: str = "FLOP/s") -> str:
    """SI rate; a text (an 'unknown: why' source) passes through as it is."""
    return value if isinstance(value, str) else si(value, unit)


def bandwidth(value) -> str:
    return si(value, "B/s") if known(value) else "unknown"


def seconds(t, digits: int = 3, long_units: bool = True) -> str:
    """'1.5 days (129,600 s)', '12.3 ms'. ``long_units`` False keeps seconds above a minute (the cost
    commands' tables, four figures)."""
    if not known(t):
        return str(t) if t is not None else "unknown"
    for size, unit in ((86400 * 365, "years"), (86400, "days"), (3600, "h"), (60, "min")):
        if long_units and t >= size * 1.5:
            return f"{t / size:.{digits}g} {unit} ({t:,.0f} s)"
    for size, unit in ((1, "s"), (1e-3, "ms"), (1e-6, "µs")):
        if t >= size:
            return f"{t / size:.{digits}g} {unit}"
    return f"{t * 1e9:.{digits}g} ns"


def duration(t) -> str:
    """Seconds to four figures, never in minutes or days: the cost commands' tables compare op times."""
    return seconds(t, 4, long_units=False)


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


__all__ = ["bandwidth", "count", "duration", "flops", "gib", "hz", "in_unit", "known", "nbytes", "nbytes_gb", "num", "params",
           "pct", "rate", "ratio", "seconds", "si"]
