"""Print a Walkthrough for a student: each matrix as a labelled table, one worked entry per step.

The worked entries follow the last token, which sees every key even under the causal mask, so a
reader can redo one full path, input to output, with pencil and paper.
"""

from __future__ import annotations

import math

from rich import box
from rich.columns import Columns
from rich.console import Console
from rich.table import Table
from rich.text import Text

from tformer.teach.walkthrough import Walkthrough

MAX_TERMS = 8  # longer dot products are shown elided; a student will not redo a 64-term sum


def fmt(x: float, decimals: int) -> str:
    """Integers print as integers (the inputs and Q K V often are), the rest with `decimals` places."""
    if math.isinf(x):
        return "-inf" if x < 0 else "inf"
    if x == round(x) and abs(x) < 1e15:
        return str(int(x)) if x != 0 else "0"  # no "-0"
    return f"{x:.{decimals}f}"


def _labels(tokens: list[str]) -> list[str]:
    """Token labels, with the position added where a token occurs twice, so sentences stay unambiguous."""
    return [f"{t}({i + 1})" if tokens.count(t) > 1 else t for i, t in enumerate(tokens)]


def _table(title: str, rows, row_labels, col_labels, decimals: int, extra=None) -> Table:
    # Text(), not str: a token such as "[b]" must print as itself, not as rich markup.
    t = Table(title=Text(title), box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False, show_edge=False)
    t.add_column("")
    for c in col_labels:
        t.add_column(Text(c), justify="right")
    if extra:
        t.add_column(extra[0], justify="right", style="dim")
    for i, (label, row) in enumerate(zip(row_labels, rows)):
        cells = [fmt(x, decimals) for x in row]
        if extra:
            cells.append(extra[1][i])
        t.add_row(Text(label), *cells)
    return t


def _side(tables) -> Columns:
    return Columns(tables, padding=(0, 4))


def _dot(a, b, decimals: int) -> str:
    terms = [f"{fmt(x, decimals)}·{fmt(y, decimals)}" for x, y in zip(a, b)]
    if len(terms) > MAX_TERMS:
        terms = terms[:3] + ["…"] + terms[-1:]
    return " + ".join(terms)


def _shape(m) -> str:
    return f"{m.shape[0]}×{m.shape[1]}"


def render(w: Walkthrough, decimals: int = 3, console: Console | None = None) -> None:
    console = console or Console()

    def p(line="", bold: str = ""):
        """A line of text (never parsed as markup: it holds [brackets] and user tokens); `bold` leads it."""
        if isinstance(line, str):
            line = Text.assemble((bold, "bold"), line) if bold else Text(line)
        console.print(line)
    ex, H, dk, dv = w.example, w.heads, w.d_k, w.d_v
    tok = _labels(ex.tokens)
    T, d = w.X.shape
    last = T - 1
    feat = [f"x{i + 1}" for i in range(d)]
    qcols = [f"q{i + 1}" for i in range(H * dk)]
    kcols = [f"k{i + 1}" for i in range(H * dk)]
    vcols = [f"v{i + 1}" for i in range(H * dv)]

    p(bold="Scaled dot-product attention, step by step")
    p("  Attention(Q, K, V) = softmax(Q Kᵀ / √d_k) V, computed by tformer.model.attention.reference")
    p(f"  {ex.source}: {T} tokens ({', '.join(tok)}), d_model = {d}, {H} head{'s' if H > 1 else ''}, "
      f"d_k = {dk}, d_v = {dv}, {'causal mask' if w.causal else 'no mask'}")

    p(bold=f"\nStep 1. The input X ({_shape(w.X)})", line=": one row per token, one column per feature.")
    p(_table("X", w.X.tolist(), tok, feat, decimals))

    p(bold="\nStep 2. The learned projections", line=": each maps a token's features to a query, a key and a value.")
    mats = [("W_Q", ex.W_Q, qcols), ("W_K", ex.W_K, kcols), ("W_V", ex.W_V, vcols)]
    p(_side([_table(f"{n} ({len(m)}×{len(m[0])})", m, feat, cols, decimals) for n, m, cols in mats]))

    p(bold="\nStep 3. Q = X W_Q, K = X W_K, V = X W_V", line=": row i of Q is token i's features times W_Q.")
    p(f"  e.g. Q[{tok[last]}, q1] = {_dot(w.X[last].tolist(), [r[0] for r in ex.W_Q], decimals)} "
      f"= {fmt(w.Q[last, 0].item(), decimals)}")
    p(_side([_table(f"{n} ({_shape(m)})", m.tolist(), tok, cols, decimals)
               for n, m, cols in (("Q", w.Q, qcols), ("K", w.K, kcols), ("V", w.V, vcols))]))
    if H > 1:
        spans = ", ".join(f"head {h + 1}: q{h * dk + 1}–q{(h + 1) * dk}, k{h * dk + 1}–k{(h + 1) * dk}, "
                          f"v{h * dv + 1}–v{(h + 1) * dv}" for h in range(H))
        p(f"  {H} heads split the columns: {spans}. Each head attends on its own.")

    for h in range(H):
        _head(w, h, tok, decimals, p)

    if H > 1:
        p(bold=f"\nStep 8. Concatenate the heads' outputs ({_shape(w.concat)})", line=": "
          "side by side, head 1 first.")
        p(_table("concat", w.concat.tolist(), tok, vcols, decimals))
    if ex.W_O is not None:
        ycols = [f"y{i + 1}" for i in range(len(ex.W_O[0]))]
        p(bold=f"\nStep {9 if H > 1 else 8}. Output projection: output = concat W_O", line=" "
          "(mixes the heads back into one vector per token).")
        p(f"  e.g. output[{tok[last]}, y1] = {_dot(w.concat[last].tolist(), [r[0] for r in ex.W_O], decimals)} "
          f"= {fmt(w.output[last, 0].item(), decimals)}")
        p(_side([_table(f"W_O ({len(ex.W_O)}×{len(ex.W_O[0])})", ex.W_O, vcols, ycols, decimals),
                _table(f"output ({_shape(w.output)})", w.output.tolist(), tok, ycols, decimals)]))


def _head(w: Walkthrough, h: int, tok: list[str], decimals: int, p) -> None:
    s, H, dk, dv = w.per_head[h], w.heads, w.d_k, w.d_v
    T = len(tok)
    last = T - 1
    name = f"head {h + 1}: " if H > 1 else ""
    qcols = [f"q{h * dk + i + 1}" for i in range(dk)]
    kcols = [f"k{h * dk + i + 1}" for i in range(dk)]
    vcols = [f"v{h * dv + i + 1}" for i in range(dv)]
    if H > 1:
        p(bold=f"\n━━ Head {h + 1} of {H} ━━")
        p(_side([_table(f"{n}{h + 1} ({_shape(m)})", m.tolist(), tok, cols, decimals)
                   for n, m, cols in (("Q", s.Q, qcols), ("K", s.K, kcols), ("V", s.V, vcols))]))

    weights = s.weights.tolist()
    focus = max(range(T), key=lambda j: weights[last][j])  # the key the last token attends to most
    p(bold=f"\nStep 4. {name}scores = Q Kᵀ ({_shape(s.scores)})", line=": row = query, column = key; "
      "each entry is a dot product: how well that query matches that key.")
    p(f"  e.g. scores[{tok[last]}, {tok[focus]}] = Q[{tok[last]}]·K[{tok[focus]}] = "
      f"{_dot(s.Q[last].tolist(), s.K[focus].tolist(), decimals)} = {fmt(s.scores[last, focus].item(), decimals)}")
    p(_table("scores", s.scores.tolist(), tok, tok, decimals))

    root = math.sqrt(dk)
    p(bold=f"\nStep 5. {name}scale by √d_k", line=f": d_k = {dk}, √d_k = {fmt(root, decimals)}; every score is divided "
      f"by {fmt(root, decimals)} (the code multiplies by 1/√d_k = {fmt(w.scale, max(decimals, 4))}), so scores "
      "do not grow with the width and the softmax stays soft.")
    if w.causal:
        p("  Causal mask: a token may not look at later tokens, so the scores above the diagonal become -inf "
          "(exp(-inf) = 0: no weight).")
    p(_table("scores / √d_k" + (" (masked)" if w.causal else ""), s.scaled.tolist(), tok, tok, decimals))

    row = s.scaled[last].tolist()
    shift = max(row) if max(row) > 30 else 0.0  # exp would overflow a calculator; subtract the row max
    exps = [math.exp(x - shift) for x in row]
    p(bold=f"\nStep 6. {name}softmax of each row", line=": weight[i, j] = exp(s[i, j]) / Σ_k exp(s[i, k]); "
      "each row sums to 1.")
    shown = " + ".join(f"exp({fmt(x, decimals)}{f' - {fmt(shift, decimals)}' if shift else ''})"
                       for x in row)
    p(f"  e.g. row {tok[last]}: {shown} = {' + '.join(fmt(e, decimals) for e in exps)} = {fmt(sum(exps), decimals)}; "
      f"weight[{tok[last]}, {tok[focus]}] = {fmt(exps[focus], decimals)} / {fmt(sum(exps), decimals)} "
      f"= {fmt(weights[last][focus], decimals)}")
    sums = [fmt(sum(r), decimals) for r in weights]
    p(_table("weights", weights, tok, tok, decimals, extra=("Σ", sums)))

    p(bold=f"\nStep 7. {name}output = weights V ({_shape(s.output)})", line=": each token's output is the "
      "weighted average of the value rows.")
    terms = " + ".join(f"{fmt(weights[last][j], decimals)}·{fmt(s.V[j, 0].item(), decimals)}" for j in range(T))
    p(f"  e.g. output[{tok[last]}, {vcols[0]}] = {terms} = {fmt(s.output[last, 0].item(), decimals)}")
    p(_table("output" if H == 1 else f"output of head {h + 1}", s.output.tolist(), tok, vcols, decimals))

    p(bold=f"\nWho attends to whom{f' in head {h + 1}' if H > 1 else ''}:")
    for i, (keys, top) in enumerate(w.strongest(h)):
        names = " and ".join(f"“{tok[j]}”" for j in keys)
        seen = f" (it can see only {', '.join(tok[:i + 1])})" if w.causal and i < T - 1 else ""
        each = " each" if len(keys) > 1 else ""
        p(f"  “{tok[i]}” attends most to {names}: weight {fmt(top, decimals)}{each} = {100 * top:.1f}%{seen}.")
