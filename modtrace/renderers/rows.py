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


class RowsRenderer(Renderer[Table]):
    kind = "rows"


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


class TableRenderer(RowsRenderer):
    """A terminal table drawn by rich; plain when the output is not a terminal."""

    name = "table"

    def render(self, model: Table) -> str:
        from rich.console import Console
        from rich.table import Table as RichTable

        table = RichTable(title=model.title, show_lines=False, header_style="bold", box=None, pad_edge=False)
        for col in model.columns:
            table.add_column(col, overflow="fold")
        for row in model.rows:
            table.add_row(*(_cell(v) for v in row))
        buf = io.StringIO()
        console = Console(file=buf, width=200, force_terminal=False, color_system=None, highlight=False)
        console.print(table)
        return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


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
