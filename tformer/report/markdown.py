"""Render a Document as Markdown; figures are referenced as plots/<name>.png beside report.md."""

from __future__ import annotations

from tformer.report.doc import Bullets, Document, Figure, Table, Text


def _cell(text: str) -> str:
    # A pipe inside a cell would end it; newlines would end the row.
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(t: Table) -> list[str]:
    lines = []
    if t.caption:
        lines += [f"*{t.caption}*", ""]
    lines.append("| " + " | ".join(_cell(h) for h in t.headers) + " |")
    lines.append("|" + "|".join("---" for _ in t.headers) + "|")
    for row in t.rows:
        lines.append("| " + " | ".join(_cell(c) for c in row) + " |")
    return lines


def render_markdown(doc: Document) -> str:
    out = [f"# {doc.title}", ""]
    if doc.summary:
        out += ["**Summary**", ""] + [f"- {line}" for line in doc.summary] + [""]
    out += ["Contents: " + " · ".join(f"[{s.heading}](#{s.anchor})" for s in doc.sections), ""]
    for s in doc.sections:
        out += [f'<a id="{s.anchor}"></a>', "", f"## {s.heading}", ""]
        for b in s.blocks:
            if isinstance(b, Text):
                out += [b.text, ""]
            elif isinstance(b, Bullets):
                out += [f"- {item}" for item in b.items] + [""]
            elif isinstance(b, Table):
                out += render_table(b) + [""]
            elif isinstance(b, Figure):
                out += [f"![{_cell(b.alt)}](plots/{b.name}.png)", "", f"*{b.caption}*", ""]
    return "\n".join(out).rstrip() + "\n"


__all__ = ["render_markdown", "render_table"]
