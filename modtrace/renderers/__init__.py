"""Renderers: small classes that turn a model into text, chosen by ``--format``.

Every renderer implements ``base.Renderer`` (``render(model) -> str``,
``write(model, out)``) and is registered here under its kind and its
``--format`` name; ``get_renderer(kind, name)`` is the only way the CLI picks
one.  The registry names classes by module path, so choosing a renderer
imports only that renderer's module (the HTML and trace renderers need
polars; a table of runs does not).

=========  ===================  ==========================================
kind       model                formats
=========  ===================  ==========================================
rows       ``rows.Table``       table, json, csv, markdown
tree       ``tree.TreeView``    table, json
diff       ``diff.DiffView``    table, json, csv, markdown
stragglers ``Stragglers.to_dict``  table, json, csv, markdown
memory     ``MemoryReport.to_dict``  table, json, csv, markdown
report     the report's model   html (``html_report.report_data``)
trace      ``perfetto.Trace``   perfetto
=========  ===================  ==========================================

Nothing here opens a database or runs analysis: models are built by the
caller (plain values, or frames for the report and the trace).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Literal, overload

from modtrace.renderers.base import Progress, Renderer, Terminal, terminal_of
from modtrace.renderers.rows import Row, Table

if TYPE_CHECKING:
    from collections.abc import Mapping

    from modtrace.renderers.diff import DiffView
    from modtrace.renderers.perfetto import Trace
    from modtrace.renderers.tree import TreeView

__all__ = ["REGISTRY", "Progress", "Renderer", "Row", "Table", "Terminal", "formats", "get_renderer", "terminal_of"]

REGISTRY: dict[str, dict[str, str]] = {
    "rows": {
        "table": "modtrace.renderers.rows:TableRenderer",
        "json": "modtrace.renderers.rows:JsonRenderer",
        "csv": "modtrace.renderers.rows:CsvRenderer",
        "markdown": "modtrace.renderers.rows:MarkdownRenderer",
    },
    "tree": {
        "table": "modtrace.renderers.tree:TreeTextRenderer",
        "json": "modtrace.renderers.tree:TreeJsonRenderer",
    },
    "diff": {
        "table": "modtrace.renderers.diff:DiffTableRenderer",
        "json": "modtrace.renderers.diff:DiffJsonRenderer",
        "csv": "modtrace.renderers.diff:DiffCsvRenderer",
        "markdown": "modtrace.renderers.diff:DiffMarkdownRenderer",
    },
    "stragglers": {
        "table": "modtrace.renderers.stragglers:StragglersTableRenderer",
        "json": "modtrace.renderers.stragglers:StragglersJsonRenderer",
        "csv": "modtrace.renderers.stragglers:StragglersCsvRenderer",
        "markdown": "modtrace.renderers.stragglers:StragglersMarkdownRenderer",
    },
    "memory": {
        "table": "modtrace.renderers.memory:MemoryTableRenderer",
        "json": "modtrace.renderers.memory:MemoryJsonRenderer",
        "csv": "modtrace.renderers.memory:MemoryCsvRenderer",
        "markdown": "modtrace.renderers.memory:MemoryMarkdownRenderer",
    },
    "report": {"html": "modtrace.renderers.html_report:HtmlReportRenderer"},
    "trace": {"perfetto": "modtrace.renderers.perfetto:PerfettoRenderer"},
}


def formats(kind: str) -> tuple[str, ...]:
    """The ``--format`` names of a kind of model."""
    return tuple(REGISTRY[kind])


@overload
def get_renderer(kind: Literal["rows"], name: str, *, progress: Progress | None = None, terminal: Terminal | None = None) -> Renderer[Table]: ...
@overload
def get_renderer(kind: Literal["tree"], name: str, *, progress: Progress | None = None, terminal: Terminal | None = None) -> Renderer[TreeView]: ...
@overload
def get_renderer(kind: Literal["diff"], name: str, *, progress: Progress | None = None, terminal: Terminal | None = None) -> Renderer[DiffView]: ...
@overload
def get_renderer(
    kind: Literal["stragglers"], name: str, *, progress: Progress | None = None, terminal: Terminal | None = None
) -> Renderer[Mapping[str, Any]]: ...
@overload
def get_renderer(
    kind: Literal["memory"], name: str, *, progress: Progress | None = None, terminal: Terminal | None = None
) -> Renderer[Mapping[str, Any]]: ...
@overload
def get_renderer(
    kind: Literal["report"], name: str, *, progress: Progress | None = None, terminal: Terminal | None = None
) -> Renderer[Mapping[str, Any]]: ...
@overload
def get_renderer(kind: Literal["trace"], name: str, *, progress: Progress | None = None, terminal: Terminal | None = None) -> Renderer[Trace]: ...
def get_renderer(kind: str, name: str, *, progress: Progress | None = None, terminal: Terminal | None = None) -> Renderer[Any]:
    """The renderer of ``kind`` models registered as ``name`` (a ``--format`` value)."""
    try:
        target = REGISTRY[kind][name]
    except KeyError:
        known = ", ".join(REGISTRY.get(kind, {})) or "none"
        raise ValueError(f"no {kind!r} renderer named {name!r} (known: {known})") from None
    module, _, cls_name = target.partition(":")
    cls: type[Renderer[Any]] = getattr(importlib.import_module(module), cls_name)
    return cls(progress=progress, terminal=terminal)

