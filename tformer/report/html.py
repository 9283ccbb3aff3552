"""Render a Document as one self-contained HTML file: styles inline, plots as base64 PNG data
URIs, no scripts, fonts or links to fetch, so it opens the same offline, from an e-mail
attachment or a CI artifact."""

from __future__ import annotations

import base64
import html
import re

from tformer.report.doc import Bullets, Document, Figure, Table, Text

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;max-width:1100px;margin:2em auto;
padding:0 1.2em;color:#1d1d1f;line-height:1.5}
h1{font-size:1.8em;margin-bottom:.2em}h2{border-bottom:2px solid #d0d7de;padding-bottom:.2em;margin-top:2em}
code{background:#f2f4f7;padding:.05em .3em;border-radius:3px;font-size:.92em}
table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:.88em;display:block;overflow-x:auto}
th,td{border:1px solid #d0d7de;padding:.25em .55em;text-align:left;vertical-align:top}
th{background:#f6f8fa}tr:nth-child(even) td{background:#fbfcfd}
td{font-variant-numeric:tabular-nums}
figure{margin:1em 0 1.6em}figure img{max-width:100%;height:auto;border:1px solid #e5e7eb}
figcaption{font-size:.88em;color:#57606a;margin-top:.3em}
.summary{background:#f0f6ff;border:1px solid #b6d4fe;border-radius:6px;padding:.6em 1.2em}
.caption{font-style:italic;color:#57606a;margin-bottom:.2em}
nav ul{columns:2;list-style:none;padding-left:0}details{margin:.5em 0 1.2em}summary{cursor:pointer;color:#0b5cad}
"""

_CODE = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*([^*]+)\*\*")


def inline(text: str) -> str:
    """Escape, then turn the two inline marks the sections use into tags."""
    out = html.escape(text, quote=False)
    out = _CODE.sub(r"<code>\1</code>", out)
    return _BOLD.sub(r"<strong>\1</strong>", out)


def _table(t: Table) -> str:
    head = "".join(f"<th>{inline(h)}</th>" for h in t.headers)
    body = "".join("<tr>" + "".join(f"<td>{inline(c)}</td>" for c in row) + "</tr>" for row in t.rows)
    table = f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
    caption = f'<p class="caption">{inline(t.caption)}</p>' if t.caption else ""
    if t.collapsed:
        label = inline(t.caption or "table")
        return f"<details><summary>{label} ({len(t.rows)} rows)</summary>{table}</details>"
    return caption + table


def _figure(f: Figure) -> str:
    data = base64.b64encode(f.png).decode("ascii")
    return (f'<figure id="fig-{html.escape(f.name)}"><img src="data:image/png;base64,{data}" '
            f'alt="{html.escape(f.alt)}"><figcaption>{inline(f.caption)}</figcaption></figure>')


def render_html(doc: Document) -> str:
    parts = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{html.escape(doc.title)}</title><style>{STYLE}</style></head><body>",
             f"<h1>{html.escape(doc.title)}</h1>"]
    if doc.summary:
        parts.append('<div class="summary"><strong>Summary</strong><ul>'
                     + "".join(f"<li>{inline(line)}</li>" for line in doc.summary) + "</ul></div>")
    parts.append("<nav><ul>" + "".join(f'<li><a href="#{s.anchor}">{html.escape(s.heading)}</a></li>'
                                      for s in doc.sections) + "</ul></nav>")
    for s in doc.sections:
        parts.append(f'<section id="{s.anchor}"><h2>{html.escape(s.heading)}</h2>')
        for b in s.blocks:
            if isinstance(b, Text):
                parts.append(f"<p>{inline(b.text)}</p>")
            elif isinstance(b, Bullets):
                parts.append("<ul>" + "".join(f"<li>{inline(i)}</li>" for i in b.items) + "</ul>")
            elif isinstance(b, Table):
                parts.append(_table(b))
            elif isinstance(b, Figure):
                parts.append(_figure(b))
        parts.append("</section>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


__all__ = ["inline", "render_html"]
