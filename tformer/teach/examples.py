"""The walkthrough's inputs: the built-in examples, reading a user's JSON/CSV, checking shapes.

The built-in numbers are small integers chosen so that every step can be redone by hand and so
that the tokens disagree about whom to attend to (no ties in any row, with or without the causal
mask), which is what makes the "who attends to whom" sentences worth reading.

One head (``--heads 1``), d_model = 4, d_k = d_v = 2::

    X      x1 x2 x3 x4      W_Q  q1 q2    W_K  k1 k2    W_V  v1 v2
    I       1  0  0  1      x1    0  0    x1    0  1    x1    1  0
    love    0  1  2  0      x2    0  1    x2    0  0    x2    0  1
    tea     0  0  1  0      x3    1  0    x3    1  0    x3    1  1
                            x4    0  1    x4    0  0    x4    0  0

Two heads (``--heads 2``): the same X; W_Q, W_K, W_V are 4x4, their first two columns are the
one-head matrices above (so head 1 repeats the one-head walkthrough) and their last two columns
are head 2's; W_O (4x4) maps the concatenated heads back to d_model.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

from tformer.core.errors import TformerError
from tformer.core.files import parse_json, read_text
from tformer.core.inputs import Bounds, check_text

MAX_EXAMPLE_BYTES = 4 << 20  # a hand-sized example is a few KB; the walkthrough prints every number
_FIX = "pass a JSON object with keys X, W_Q, W_K, W_V (optional W_O, tokens), or a CSV of X"
MATRICES = ("X", "W_Q", "W_K", "W_V", "W_O")
# An entry a student can redo by hand. The bound keeps every product and sum the walkthrough forms (Q Kᵀ of
# rows as wide as a 4 MB file allows) far inside float64, so the scores stay finite and the softmax exact.
ENTRY = Bounds(-1e6, 1e6)


@dataclass
class Example:
    tokens: list[str]
    X: list[list[float]]  # (T, d_model): one row per token
    W_Q: list[list[float]]  # (d_model, heads * d_k)
    W_K: list[list[float]]  # (d_model, heads * d_k)
    W_V: list[list[float]]  # (d_model, heads * d_v)
    W_O: list[list[float]] | None = None  # (heads * d_v, d_out); None: the output is the concatenation
    source: str = "built-in example"


_X = [[1, 0, 0, 1],
      [0, 1, 2, 0],
      [0, 0, 1, 0]]
_TOKENS = ["I", "love", "tea"]

# Head 1: "I" attends to itself, "love" to itself, "tea" to "love".
_H1_Q = [[0, 0], [0, 1], [1, 0], [0, 1]]
_H1_K = [[0, 1], [0, 0], [1, 0], [0, 0]]
_H1_V = [[1, 0], [0, 1], [1, 1], [0, 0]]
# Head 2 looks elsewhere: "I" attends to "love", "love" and "tea" to "I".
_H2_Q = [[0, 0], [0, 0], [0, 1], [1, 0]]
_H2_K = [[0, 0], [0, 0], [1, 0], [0, 1]]
_H2_V = [[0, 1], [1, 0], [1, 0], [0, 1]]
# Rows are the concatenated head features (h1.v1, h1.v2, h2.v1, h2.v2): output feature 1 adds the
# two heads' first features, feature 2 their second ones, features 3 and 4 pass head 2 through.
_W_O = [[1, 0, 0, 0],
        [0, 1, 0, 0],
        [1, 0, 1, 0],
        [0, 1, 0, 1]]


def _side_by_side(a, b):
    return [ra + rb for ra, rb in zip(a, b)]


def default_example(heads: int) -> Example:
    """The built-in example for 1 or 2 heads (copies: callers may not change the module's numbers)."""
    if heads == 1:
        return Example(list(_TOKENS), _floats(_X), _floats(_H1_Q), _floats(_H1_K), _floats(_H1_V))
    if heads == 2:
        return Example(list(_TOKENS), _floats(_X), _floats(_side_by_side(_H1_Q, _H2_Q)),
                       _floats(_side_by_side(_H1_K, _H2_K)), _floats(_side_by_side(_H1_V, _H2_V)),
                       _floats(_W_O), source="built-in two-head example")
    raise TformerError(f"the built-in example has 1 or 2 heads, not {heads}; "
                       "give your own matrices with --input FILE.json for other head counts")


def _floats(m):
    return [[float(x) for x in row] for row in m]


# ---------------------------------------------------------------------------------------------
# Reading a user's file


def load_example(path, heads: int) -> Example:
    """JSON with X, W_Q, W_K, W_V (optional W_O, tokens), or a CSV holding X only."""
    path = Path(path)
    text = read_text(path, "input file", max_bytes=MAX_EXAMPLE_BYTES, fix=_FIX)
    # The extension decides; without a telling one, a JSON object starts with '{'.
    is_json = path.suffix.lower() == ".json" or (path.suffix.lower() != ".csv" and text.lstrip().startswith("{"))
    return _from_json(text, path) if is_json else _from_csv(text, path, heads)


def _from_json(text: str, path: Path) -> Example:
    data = parse_json(text, path, "input file", fix=_FIX)
    missing = [k for k in ("X", "W_Q", "W_K", "W_V") if k not in data]
    if missing:
        raise TformerError(f"{path} lacks {', '.join(missing)}; it needs X, W_Q, W_K, W_V (optional W_O, tokens)")
    unknown = sorted(set(data) - set(MATRICES) - {"tokens"})
    if unknown:  # a misspelt "W_o" would otherwise be silently ignored
        raise TformerError(f"{path} has unknown key(s) {', '.join(unknown)}; "
                           "allowed: X, W_Q, W_K, W_V, W_O, tokens")
    m = {name: _matrix(data[name], name) for name in MATRICES if data.get(name) is not None}
    tokens = data.get("tokens")
    if tokens is not None and (not isinstance(tokens, list) or not all(isinstance(t, str) for t in tokens)):
        raise TformerError(f"tokens in {path} must be a list of strings, one per row of X")
    for i, token in enumerate(tokens or [], start=1):  # JSON may spell a lone surrogate, which no terminal prints
        check_text(token, f"token {i} in {path}", escaped=False, fix="give each token as UTF-8 text")
    return Example(tokens or _numbered(len(m["X"])), m["X"], m["W_Q"], m["W_K"], m["W_V"], m.get("W_O"),
                   source=str(path))


def _from_csv(text: str, path: Path, heads: int) -> Example:
    """One token per row; a non-numeric first cell is the token's label; '#' lines are comments."""
    tokens, rows = [], []
    for lineno, cells in enumerate(csv.reader(io.StringIO(text)), start=1):
        cells = [c.strip() for c in cells]
        if not cells or not any(cells) or cells[0].startswith("#"):
            continue
        label = None
        if not _is_number(cells[0]):
            label, cells = cells[0], cells[1:]
        bad = [c for c in cells if not _is_number(c)]
        if bad or not cells:
            raise TformerError(f"{path} line {lineno}: expected numbers after an optional token label, "
                               f"got {bad[0] if bad else 'nothing'!r}")
        tokens.append(label)
        rows.append([float(c) for c in cells])
    if not rows:
        raise TformerError(f"{path} holds no rows of numbers; write one token per line, e.g. 'I,1,0,0,1'")
    X = _matrix(rows, "X")
    if all(t is None for t in tokens):
        tokens = _numbered(len(rows))
    else:
        tokens = [t if t is not None else f"t{i + 1}" for i, t in enumerate(tokens)]
    ex = default_example(heads)  # a CSV gives X only; the weights are the built-in ones
    if len(X[0]) != len(ex.W_Q):
        raise TformerError(f"{path} gives X as {shape(X)}, but the built-in weights expect {len(ex.W_Q)} features "
                           "per token; give the weights too in a JSON file (see --help)")
    return Example(tokens, X, ex.W_Q, ex.W_K, ex.W_V, ex.W_O, source=f"{path} (X) with the built-in weights")


def _is_number(s: str) -> bool:
    try:
        return math.isfinite(float(s))
    except ValueError:
        return False


def _numbered(n: int) -> list[str]:
    return [f"t{i + 1}" for i in range(n)]


def _matrix(value, name: str) -> list[list[float]]:
    """A non-empty rectangular list of lists of finite numbers, as floats."""
    if not isinstance(value, list) or not value or not all(isinstance(r, list) for r in value):
        raise TformerError(f"{name} must be a non-empty list of rows (a list of lists of numbers)")
    width = len(value[0])
    for i, row in enumerate(value, start=1):
        if len(row) != width or not row:
            raise TformerError(f"{name} row {i} has {len(row)} numbers but row 1 has {width}; "
                               "every row needs the same length")
        for x in row:
            # bool is an int in Python; true/false in a matrix is a mistake, not 1/0
            if isinstance(x, bool) or not isinstance(x, (int, float)):
                raise TformerError(f"{name} row {i} holds {x!r}; entries must be finite numbers")
            ENTRY.check(x, f"{name} row {i}: an entry")
    return [[float(x) for x in row] for row in value]


# ---------------------------------------------------------------------------------------------
# Shapes


def shape(m) -> str:
    return f"{len(m)}×{len(m[0])}"


def validate(ex: Example, heads: int) -> tuple[int, int]:
    """Check every product is defined and the heads divide the projections; returns (d_k, d_v)."""
    if heads < 1:
        raise TformerError(f"--heads must be at least 1, got {heads}")
    T, d = len(ex.X), len(ex.X[0])
    for name in ("W_Q", "W_K", "W_V"):
        w = getattr(ex, name)
        if len(w) != d:
            raise TformerError(f"X is {shape(ex.X)} but {name} is {shape(w)}: X {name} needs "
                               f"{name} to have {d} rows, one per feature of X")
    if len(ex.W_K[0]) != len(ex.W_Q[0]):
        raise TformerError(f"W_Q is {shape(ex.W_Q)} but W_K is {shape(ex.W_K)}: queries and keys must have the "
                           "same width for Q Kᵀ to be defined")
    for name in ("W_Q", "W_V"):
        width = len(getattr(ex, name)[0])
        if width % heads:
            raise TformerError(f"{name} is {shape(getattr(ex, name))}: its {width} columns do not split into "
                               f"{heads} heads of equal width")
    d_k, d_v = len(ex.W_Q[0]) // heads, len(ex.W_V[0]) // heads
    if ex.W_O is not None and len(ex.W_O) != heads * d_v:
        raise TformerError(f"W_V is {shape(ex.W_V)} but W_O is {shape(ex.W_O)}: W_O needs {heads * d_v} rows, "
                           "one per column of the concatenated heads")
    if len(ex.tokens) != T:
        raise TformerError(f"there are {len(ex.tokens)} tokens but X is {shape(ex.X)}; give one token per row of X")
    return d_k, d_v
