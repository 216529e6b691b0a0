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
    # Columns a terminal too narrow for the whole rows may go without, least needed first: they
    # are dropped in this order until the rows fit, before any cell is folded.
    droppable: Sequence[str] = ()


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

    On a terminal it fits the terminal's width (the table's ``droppable``
    columns go first, then long cells fold within their column) and styles
    rows; otherwise (a pipe, a file) every row is one whole line, however
    long, so ``grep`` and ``cut`` see whole rows.
    """

    name = "table"

    def render(self, model: Table) -> str:
        from rich.console import Console
        from rich.table import Table as RichTable

        term = self.terminal
        if term.width is not None:
            model = _fitted(model, term.width)
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


def _widths(model: Table) -> list[int]:
    """Each column's widest line, its name's included."""
    widths = [len(c) for c in model.columns]
    for row in model.rows:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], *(len(part) for part in _cell(value).splitlines() or [""]))
    return widths


def _natural_width(model: Table) -> int:
    # Each column's widest line plus the two spaces between columns, and room for the title.
    widths = _widths(model)
    return max(sum(widths) + 2 * len(widths), len(model.title or "")) + 1


def _fitted(model: Table, width: int) -> Table:
    """``model`` without its droppable columns, in their order, until its rows fit ``width``
    (a cell folded to a few characters a line is unreadable; a column left out is not)."""
    from dataclasses import replace

    widths = dict(zip(model.columns, _widths(model), strict=True))
    dropped: set[str] = set()
    for col in model.droppable:
        kept = [w for c, w in widths.items() if c not in dropped]
        if sum(kept) + 2 * (len(kept) - 1) <= width:
            break
        if col in widths:
            dropped.add(col)
    if not dropped:
        return model
    keep = [i for i, c in enumerate(model.columns) if c not in dropped]
    return replace(model, columns=[model.columns[i] for i in keep],
                   rows=[[row[i] for i in keep] for row in model.rows], droppable=())


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
