"""Renderers of a ``Table``: column names and rows of plain Python values (``modtrace runs``,
``show``, ``check``, ``query``), as a terminal table, JSON, CSV or Markdown."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from modtrace.renderers.base import Renderer

Row = Sequence[Any]


@dataclass(frozen=True)
class Table:
    columns: Sequence[str]
    rows: Sequence[Row]
    title: str | None = None
    # A rich style per row (e.g. "red" for an error), shown only on a terminal that takes colour.
    row_styles: Sequence[str | None] = ()


class RowsRenderer(Renderer[Table]):
    kind = "rows"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


class TableRenderer(RowsRenderer):
    """A borderless table drawn by rich.

    On a terminal it fits the terminal's width (long cells fold within their
    column) and styles rows; otherwise (a pipe, a file) every row is one
    whole line, however long, so ``grep`` and ``cut`` see whole rows.
    """

    name = "table"

    def render(self, model: Table) -> str:
        from rich.console import Console
        from rich.table import Table as RichTable

        term = self.terminal
        table = RichTable(title=model.title, show_lines=False, header_style="bold" if term.color else None,
                          box=None, pad_edge=False)
        for col in model.columns:
            table.add_column(col, overflow="fold")
        for i, row in enumerate(model.rows):
            style = model.row_styles[i] if term.color and i < len(model.row_styles) else None
            table.add_row(*(_cell(v) for v in row), style=style)
        buf = io.StringIO()
        # Not a terminal: wide enough for any row, so rich never folds a cell onto a second line.
        width = term.width if term.width is not None else _natural_width(model)
        console = Console(file=buf, width=max(width, 20), force_terminal=term.color,
                          color_system="standard" if term.color else None, highlight=False, emoji=False)
        console.print(table)
        return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


def _natural_width(model: Table) -> int:
    # Each column's widest line plus the two spaces between columns, and room for the title.
    widths = [len(c) for c in model.columns]
    for row in model.rows:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], *(len(part) for part in _cell(value).splitlines() or [""]))
    return max(sum(widths) + 2 * len(widths), len(model.title or "")) + 1


class JsonRenderer(RowsRenderer):
    name = "json"

    def render(self, model: Table) -> str:
        rows = [dict(zip(model.columns, row, strict=True)) for row in model.rows]
        return json.dumps(rows, indent=2, default=str) + "\n"


class CsvRenderer(RowsRenderer):
    name = "csv"

    def render(self, model: Table) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(model.columns)
        for row in model.rows:
            writer.writerow(["" if v is None else v for v in row])
        return buf.getvalue()


class MarkdownRenderer(RowsRenderer):
    name = "markdown"

    def render(self, model: Table) -> str:
        def esc(v: Any) -> str:
            return _cell(v).replace("|", "\\|").replace("\n", " ")

        out = []
        if model.title:
            out.append(f"### {model.title}\n")
        out.append("| " + " | ".join(model.columns) + " |")
        out.append("|" + "|".join("---" for _ in model.columns) + "|")
        out.extend("| " + " | ".join(esc(v) for v in row) + " |" for row in model.rows)
        return "\n".join(out) + "\n"
