"""The module call tree kept with a run's analysis: computed where spans are written, read by ``tree``.

``modtrace tree`` with its default options (every rank, phase and step,
steps under the run's own rule) is ``analysis.aggregate.module_tree`` of all
of a run's spans: half a million spans read and grouped for a few thousand
nodes.  ``store_tree`` computes those nodes once, when the spans are
written (``materialize``), on the host clock and, for a run with device
times, on the device clock, and ``store.tree_table`` keeps them;
``read_tree_rows`` gives them back as node rows (``nodes_frame``: as the
nodes frame ``module_tree`` returns), for ``tree`` to filter (``--phase``,
``--max-depth`` and ``--min-percent`` apply to the whole tree's nodes).
Options that select spans (``--step``, ``--rank``, ``--step-kind``, another
step rule) read the spans as before.

Like ``materialize`` this joins the store and the analysis; the API decides
when a stored tree answers (``api._tree``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from modtrace.core.tree_rows import Node
from modtrace.store.tree_table import NODE_COLUMNS

if TYPE_CHECKING:
    import polars as pl

    from modtrace.store.engine import Store


def _node_rows(nodes: pl.DataFrame) -> list[tuple[Any, ...]]:
    """A nodes frame -> rows as ``tree_nodes`` keeps them (node ids signed, phase by name)."""
    import polars as pl

    return nodes.select(NODE_COLUMNS).with_columns(
        pl.col("node_id", "parent_node_id").reinterpret(signed=True), pl.col("phase").cast(pl.String)
    ).rows()


def _with_own_steps(store: Store, run_id: int, spans: pl.DataFrame) -> tuple[str, pl.DataFrame] | None:
    """(the run's own step rule, ``spans`` with their steps under it), as ``tree`` assigns them
    without a step rule given; None when that rule cannot be applied (``tree`` then reports why)."""
    from modtrace.core.step_rules import StepRuleError
    from modtrace.results.steps import apply_step_rule

    try:
        stepping = apply_step_rule(store, run_id, spans)
    except StepRuleError:
        return None
    if stepping.rule == "root" and stepping.roots.height == 0:
        return None
    return stepping.rule, stepping.frame


def tree_rows(store: Store, run_id: int, spans: pl.DataFrame) -> tuple[str, dict[str, list[tuple[Any, ...]]]] | None:
    """The run's default tree as ``store_tree`` stores it, computed from ``spans`` and not
    written: (its step rule, clock -> node rows); None when there is none to store."""
    from modtrace.analysis.aggregate import module_tree
    from modtrace.analysis.device import has_device_time, on_clock
    from modtrace.store.device_times import has_device_events

    if spans.height == 0:
        return None
    stepped = _with_own_steps(store, run_id, spans)
    if stepped is None:
        return None
    rule, frame = stepped
    trees = {"host": _node_rows(module_tree(frame))}
    if has_device_time(frame) and has_device_events(store, run_id):
        trees["device"] = _node_rows(module_tree(on_clock(frame, "device")))
    return rule, trees


def write_tree(
    store: Store, run_id: int, tree: tuple[str, dict[str, list[tuple[Any, ...]]]] | None, *, rank: int | None = None,
) -> bool:
    """Store ``tree`` (``tree_rows``'s) as the run's default tree; ``rank`` as for ``store_tree``.
    Whether it was stored."""
    from modtrace.store.tree_table import write_tree_nodes

    if tree is None:
        return False
    return write_tree_nodes(store, run_id, tree[0], tree[1], only_rank=rank)


def store_tree(
    store: Store, run_id: int, spans: pl.DataFrame | Callable[[], pl.DataFrame], *, rank: int | None = None,
) -> bool:
    """Compute and store the run's default tree, from ``spans`` (all of the run's spans, named,
    with their device columns when it has device times; or a function that reads them).

    ``rank``: the spans are that rank's only (the recorder analyses each rank as it ends); the
    tree is then stored only for a run of one rank, and a run of several keeps none (``tree``
    reads its spans, until ``modtrace analyze`` stores the whole run's).  Whether it was stored.
    """
    from modtrace.store.tree_table import single_rank_run

    if rank is not None and not single_rank_run(store, run_id, rank):
        return False
    if callable(spans):
        spans = spans()
    return write_tree(store, run_id, tree_rows(store, run_id, spans), rank=rank)


def _node(row: tuple[Any, ...]) -> Node:
    node = dict(zip(NODE_COLUMNS, row, strict=True))
    for key in ("node_id", "parent_node_id"):  # stored signed, as the 64-bit hash reads unsigned
        if node[key] is not None and node[key] < 0:
            node[key] += 1 << 64
    return node


def read_tree_rows(store: Store, run_id: int, clock: str, step_on: str | None) -> list[Node] | None:
    """The run's stored tree on ``clock`` as node rows (dicts of ``TREE_NODE_FRAME``'s columns, in
    pre-order), when one is stored and its steps follow the rule ``step_on`` resolves to (None:
    the run's own); else None.  No polars: ``tree`` shows them as they are."""
    from modtrace.core.step_rules import StepRuleError, resolve_rule
    from modtrace.store.tree_table import read_recorded_rule, read_tree_nodes

    found = read_tree_nodes(store, run_id, clock)
    if found is None:
        return None
    rule, rows = found
    if step_on is not None:
        try:
            if resolve_rule(step_on, *read_recorded_rule(store, run_id)) != rule:
                return None
        except StepRuleError:
            return None  # the spans' path says why, as it always has
    return [_node(row) for row in rows]


def nodes_frame(rows: list[Node]) -> pl.DataFrame:
    """Node rows with their work (``api._tree.tree_nodes``') -> the tree frame ``Database.tree``
    returns (``TREE_FRAME``)."""
    import polars as pl

    from modtrace.core.contracts import TREE_FRAME

    schema = TREE_FRAME.polars()
    return pl.DataFrame([{k: row[k] for k in schema} for row in rows], schema=schema)
