"""Renderers for the module call tree (``modtrace tree``).

Both take a ``TreeView``: the nodes of ``modtrace.analysis.aggregate`` as
plain dicts, in tree pre-order with their ``level``; nothing here computes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from modtrace.core.contracts import HOOKS, KERNELS, MIXED
from modtrace.core.memory_nodes import MEMORY_KEYS
from modtrace.core.sizes import format_bytes
from modtrace.core.work import WORK_KEYS
from modtrace.renderers.base import Renderer

Node = dict[str, Any]


@dataclass(frozen=True)
class TreeView:
    nodes: Sequence[Node]
    title: str | None = None
    full_names: bool = False  # the table names each node by its full name, not its part below its parent


def leaf_names(nodes: Sequence[Node]) -> list[str]:
    """Each node's name below its parent (``fc1`` under ``Net.blocks.0``); the full name for a
    root and for a node whose name does not extend its parent's (a recompute under a backward)."""
    names = []
    path: list[str] = []
    for node in nodes:
        fqn, level = str(node["fqn"]), int(node["level"])
        del path[level:]
        parent = path[-1] if path else None
        names.append(fqn[len(parent) + 1:] if parent is not None and fqn.startswith(parent + ".") else fqn)
        path.append(fqn)
    return names


class TreeRenderer(Renderer[TreeView]):
    kind = "tree"

_JSON_KEYS = (
    "fqn", "module_type", "phase", "calls", "steps", "inclusive_total_ns", "self_total_ns",
    "inclusive_median_ns", "self_median_ns", "percent", "source", *WORK_KEYS, *MEMORY_KEYS,
)

# The table marks a node whose time was not (or not all) measured by hooks before its name (a
# name cut to the terminal's width keeps it), and says what the mark means under the table.
SOURCE_MARKS: dict[str, tuple[str, str]] = {
    KERNELS: ("≈", "attributed from compiled kernels (status attributed): the sum of the kernels inductor"
                   " generated from the module's code, not measured by hooks"),
    MIXED: ("+≈", "some calls measured by hooks, some attributed from compiled kernels"),
}


def format_ns(ns: float | int | None) -> str:
    """A duration in the largest unit that keeps it >= 1 (ns, us, ms, s)."""
    if ns is None:
        return ""
    value = float(ns)
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("us", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.0f} ns"


def format_count(n: float | int | None) -> str:
    """A count with an SI prefix (k, M, G, T, P), three significant digits: ``1.23 G``."""
    if n is None:
        return ""
    value = float(n)
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}"
    return f"{value:.0f}"


def _g(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"


class TreeTextRenderer(TreeRenderer):
    """An indented table: one line per node, children under their parent.

    Never wrapped: on a terminal narrower than the table, module names are cut
    (ending in ``…``) so that each node keeps one line with its numbers.
    """

    name = "table"
    columns = ("module", "type", "phase", "calls", "incl/step", "self/step", "incl total", "self total", "% step")
    # The work columns are shown when some node was counted (% peak when a peak was given), the
    # memory columns when some node has memory; on a terminal too narrow for the table once names
    # are cut, DROPPABLE columns go, in this order (memory first).
    DROPPABLE = ("peak mem", "kept/step", "FLOP/B", "incl total", "self total")

    def render(self, model: TreeView) -> str:
        # Plain text, laid out as a borderless table (columns two spaces apart, names
        # left, numbers right): a tree of a big model has thousands of rows, which a
        # table library takes seconds to measure and render; this takes milliseconds.
        left = {"module", "type", "phase"}
        columns = list(self.columns)
        if any(n.get("flops_per_step") is not None for n in model.nodes):
            shown: tuple[str, ...] = ("FLOPs/step", "GFLOP/s", "FLOP/B")
            if any(n.get("peak_percent") is not None for n in model.nodes):
                shown += ("% peak",)
            columns += shown
        if any(n.get("kept_mem_per_step") is not None or n.get("peak_mem_bytes") is not None for n in model.nodes):
            columns += ["kept/step", "peak mem"]
        names = [str(n["fqn"]) for n in model.nodes] if model.full_names else leaf_names(model.nodes)
        sources = {str(node["source"]) for node in model.nodes}
        marked = [s for s in SOURCE_MARKS if s in sources]
        names = [f"{SOURCE_MARKS[str(node['source'])][0]} {name}" if node["source"] != HOOKS else name
                 for node, name in zip(model.nodes, names, strict=True)]
        cells = [self._cells(node, name) for node, name in zip(model.nodes, names, strict=True)]
        rows = [tuple(columns), *(tuple(c[col] for col in columns) for c in cells)]
        widths = [max(len(row[i]) for row in rows) for i in range(len(columns))]
        room = self.terminal.width or 1 << 30
        over = sum(widths) + 2 * (len(widths) - 1) - room
        if over > 0:
            widths[0] = max(len(columns[0]), widths[0] - over, 12)
            rows = [(_cut(row[0], widths[0]), *row[1:]) for row in rows]
            for col in self.DROPPABLE:
                if sum(widths) + 2 * (len(widths) - 1) <= room or col not in columns:
                    continue
                i = columns.index(col)
                del columns[i], widths[i]
                rows = [(*row[:i], *row[i + 1:]) for row in rows]
        lines = [
            "  ".join(cell.ljust(w) if col in left else cell.rjust(w)
                      for col, cell, w in zip(columns, row, widths, strict=True)).rstrip()
            for row in rows
        ]
        if model.title:
            lines.insert(0, model.title.center(sum(widths) + 2 * (len(widths) - 1)).rstrip())
        lines.extend(f"{SOURCE_MARKS[source][0]} {SOURCE_MARKS[source][1]}" for source in marked)
        return "\n".join(lines) + "\n"

    @staticmethod
    def _cells(node: Node, name: str) -> dict[str, str]:
        peak = node.get("peak_percent")
        return {
            "module": "  " * int(node["level"]) + name,
            "type": str(node["module_type"]),
            "phase": str(node["phase"]),
            "calls": str(node["calls"]),
            "incl/step": format_ns(node["inclusive_median_ns"]),
            "self/step": format_ns(node["self_median_ns"]),
            "incl total": format_ns(node["inclusive_total_ns"]),
            "self total": format_ns(node["self_total_ns"]),
            "% step": "" if node["percent"] is None else f"{node['percent']:.1f}",
            "FLOPs/step": format_count(node.get("flops_per_step")),
            "GFLOP/s": _g(node.get("gflop_per_s")),
            "FLOP/B": _g(node.get("flop_per_byte")),
            "% peak": "" if peak is None else f"{peak:.1f}",
            "kept/step": format_bytes(node.get("kept_mem_per_step")),
            "peak mem": format_bytes(node.get("peak_mem_bytes")),
        }


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


class TreeJsonRenderer(TreeRenderer):
    """Nested JSON: a list of root nodes, each with its ``children``; stable keys."""

    name = "json"

    def render(self, model: TreeView) -> str:
        roots: list[dict[str, Any]] = []
        path: list[dict[str, Any]] = []
        for node in model.nodes:
            item: dict[str, Any] = {k: (str(node[k]) if k == "phase" else node.get(k)) for k in _JSON_KEYS}
            item["children"] = []
            level = int(node["level"])
            del path[level:]
            (path[-1]["children"] if path else roots).append(item)
            path.append(item)
        return json.dumps(roots, indent=2) + "\n"

