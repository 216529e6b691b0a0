"""Renderers: small classes that turn rows into text, chosen by ``--format``.

A renderer takes column names and rows (sequences of plain Python values)
and returns a string.  Nothing here opens a database or runs analysis.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import Any, ClassVar

Row = Sequence[Any]


class Renderer:
    name: ClassVar[str]

    def render(self, columns: Sequence[str], rows: Sequence[Row], *, title: str | None = None) -> str:
        raise NotImplementedError


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


class TableRenderer(Renderer):
    """A terminal table drawn by rich; plain when the output is not a terminal."""

    name = "table"

    def render(self, columns: Sequence[str], rows: Sequence[Row], *, title: str | None = None) -> str:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, show_lines=False, header_style="bold", box=None, pad_edge=False)
        for col in columns:
            table.add_column(col, overflow="fold")
        for row in rows:
            table.add_row(*(_cell(v) for v in row))
        buf = io.StringIO()
        console = Console(file=buf, width=200, force_terminal=False, color_system=None, highlight=False)
        console.print(table)
        return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


class JsonRenderer(Renderer):
    name = "json"

    def render(self, columns: Sequence[str], rows: Sequence[Row], *, title: str | None = None) -> str:
        return json.dumps([dict(zip(columns, row, strict=True)) for row in rows], indent=2, default=str) + "\n"


class CsvRenderer(Renderer):
    name = "csv"

    def render(self, columns: Sequence[str], rows: Sequence[Row], *, title: str | None = None) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(columns)
        for row in rows:
            writer.writerow(["" if v is None else v for v in row])
        return buf.getvalue()


class MarkdownRenderer(Renderer):
    name = "markdown"

    def render(self, columns: Sequence[str], rows: Sequence[Row], *, title: str | None = None) -> str:
        def esc(v: Any) -> str:
            return _cell(v).replace("|", "\\|").replace("\n", " ")

        out = []
        if title:
            out.append(f"### {title}\n")
        out.append("| " + " | ".join(columns) + " |")
        out.append("|" + "|".join("---" for _ in columns) + "|")
        out.extend("| " + " | ".join(esc(v) for v in row) + " |" for row in rows)
        return "\n".join(out) + "\n"


RENDERERS: dict[str, type[Renderer]] = {
    r.name: r for r in (TableRenderer, JsonRenderer, CsvRenderer, MarkdownRenderer)
}


def get_renderer(name: str) -> Renderer:
    return RENDERERS[name]()
