"""The report as plain data: sections made of paragraphs, bullet lists, tables and figures.

Sections build these blocks; markdown.py and html.py render the same blocks two ways, so the
two files can never say different things. Inline markup is limited to `code` and **bold**,
which both renderers understand.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Text:
    text: str


@dataclass
class Bullets:
    items: list[str]


@dataclass
class Table:
    headers: list[str]
    rows: list[list[str]]
    caption: str = ""
    # Long tables (every op of a training step) fold away in the HTML; markdown shows them whole.
    collapsed: bool = False


@dataclass
class Figure:
    name: str  # file stem under plots/ (markdown) and the figure's id (HTML)
    png: bytes
    caption: str
    alt: str


@dataclass
class Section:
    number: int | None  # None: an appendix (not numbered)
    title: str
    anchor: str
    blocks: list = field(default_factory=list)

    @property
    def heading(self) -> str:
        return f"{self.number}. {self.title}" if self.number is not None else self.title

    def text(self, text: str) -> None:
        self.blocks.append(Text(text))

    def bullets(self, items: list[str]) -> None:
        if items:
            self.blocks.append(Bullets(list(items)))

    def table(self, headers: list[str], rows: list[list], caption: str = "", collapsed: bool = False) -> None:
        self.blocks.append(Table(list(headers), [[str(c) for c in r] for r in rows], caption, collapsed))

    def figure(self, name: str, png: bytes, caption: str, alt: str | None = None) -> None:
        self.blocks.append(Figure(name, png, caption, alt or caption))

    def figures(self) -> list[Figure]:
        return [b for b in self.blocks if isinstance(b, Figure)]


@dataclass
class Document:
    title: str
    summary: list[str]  # the lines printed to the terminal, also shown at the top of the report
    sections: list[Section]

    def figures(self) -> list[Figure]:
        return [f for s in self.sections for f in s.figures()]


__all__ = ["Bullets", "Document", "Figure", "Section", "Table", "Text"]
