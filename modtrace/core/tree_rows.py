"""The module call tree's nodes as plain rows, and the filters ``tree`` applies to them.

``sort_nodes`` and ``top_nodes`` reorder and select the rows to show
(``--sort``, ``--top``), keeping the tree's shape.

A node (``contracts.TREE_NODE_FRAME``) is a call path with its timings, in
tree pre-order with its ``level`` and ``parent_node_id``;
``analysis.aggregate.module_tree`` builds them from spans, ``store.tree_table``
keeps a run's default tree.  Which nodes ``--phase``, ``--max-depth`` and
``--min-percent`` leave, and where the shown ones hang, is decided here once,
for the nodes frame (``analysis.aggregate.filter_tree``) and for plain rows
(``filter_nodes``: a tree read from the store is shown without polars).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Node = dict[str, Any]


def shown_nodes(
    nodes: Iterable[tuple[int, int | None, Any, float | None]], *, phases: set[str] | None = None,
    max_depth: int | None = None, min_percent: float | None = None,
) -> list[tuple[int, int | None, int]]:
    """(node_id, parent_node_id, phase, percent) of each node, in pre-order -> (node_id, shown
    parent, level) of the nodes to show, in pre-order.

    A node of another phase is hidden and its shown descendants move up to
    its nearest shown ancestor; nodes deeper than ``max_depth`` (0 = roots
    only) or below ``min_percent`` are dropped with their subtrees.
    """
    listed = list(nodes)
    parents = {node: parent for node, parent, _, _ in listed}
    shown: dict[int, tuple[int | None, int]] = {}  # node -> (shown parent, level)
    dropped: set[int] = set()
    rows = []
    for node, parent, phase, pct in listed:
        keep = phases is None or str(phase) in phases
        if parent in dropped:
            dropped.add(node)
            continue
        while parent is not None and parent not in shown:
            parent = parents.get(parent)
        level = 0 if parent is None else shown[parent][1] + 1
        too_small = min_percent is not None and (pct is None or pct < min_percent)
        too_deep = max_depth is not None and level > max_depth
        if keep and (too_small or too_deep):
            dropped.add(node)
            continue
        if keep:
            shown[node] = (parent, level)
            rows.append((node, parent, level))
    return rows


def filter_nodes(nodes: Sequence[Mapping[str, Any]], *, phases: set[str] | None = None, max_depth: int | None = None,
                 min_percent: float | None = None) -> list[Node]:
    """Node rows (dicts, pre-order) -> the rows to show (``shown_nodes``), re-parented and re-levelled."""
    by_id = {n["node_id"]: n for n in nodes}
    shown = shown_nodes(((n["node_id"], n["parent_node_id"], n["phase"], n["percent"]) for n in nodes),
                        phases=phases, max_depth=max_depth, min_percent=min_percent)
    return [{**by_id[node], "parent_node_id": parent, "level": level} for node, parent, level in shown]


# ``tree --sort``: the measure each choice orders by (totals over the steps shown).
SORT_KEYS = {"self": "self_total_ns", "incl": "inclusive_total_ns", "calls": "calls"}


def _forest(nodes: Sequence[Node]) -> list[tuple[Node, list[Any]]]:
    roots: list[tuple[Node, list[Any]]] = []
    path: list[tuple[Node, list[Any]]] = []
    for node in nodes:
        entry: tuple[Node, list[Any]] = (node, [])
        level = int(node["level"])
        del path[level:]
        (path[-1][1] if path else roots).append(entry)
        path.append(entry)
    return roots


def sort_nodes(nodes: Sequence[Node], by: str) -> list[Node]:
    """Pre-order rows -> the same tree with every node's children (and the roots) ordered by
    ``SORT_KEYS[by]``, largest first; equal ones keep their order."""
    key = SORT_KEYS[by]
    out: list[Node] = []

    def walk(entries: list[tuple[Node, list[Any]]]) -> None:
        for node, children in sorted(entries, key=lambda e: -(e[0][key] or 0)):
            out.append(node)
            walk(children)

    walk(_forest(nodes))
    return out


def top_nodes(nodes: Sequence[Node], by: str, n: int) -> list[Node]:
    """The ``n`` nodes with the most ``SORT_KEYS[by]``, with their ancestors (so each is shown
    where it hangs), in the order given."""
    key = SORT_KEYS[by]
    ranked = sorted(range(len(nodes)), key=lambda i: -(nodes[i][key] or 0))[:n]
    keep = set(ranked)
    path: list[int] = []
    for i, node in enumerate(nodes):
        del path[int(node["level"]):]
        if i in keep:
            keep.update(path)
        path.append(i)
    return [node for i, node in enumerate(nodes) if i in keep]
