"""The stored module call tree of a run (table ``tree_nodes``): plain rows in, plain rows out.

``modtrace.results.tree`` computes the tree that ``modtrace tree`` shows by
default when a run is analysed and writes it here; ``tree`` reads it back
instead of half a million spans.  Every rewrite of a run's spans deletes the
run's nodes in its own transaction (``store.analysis_store``), so nodes never
outlive the spans they were computed from.  No polars here: a stored tree is
a few thousand rows, and reading it should not wait for a dataframe library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from modtrace.core.contracts import TREE_NODE_FRAME
from modtrace.store.base import Store
from modtrace.store.cursor import driver_cursor, mark

if TYPE_CHECKING:
    from sqlalchemy import Connection

# The columns of a node as written and read, in table order after (run_id, clock, node).
NODE_COLUMNS: tuple[str, ...] = TREE_NODE_FRAME.names


def _single_rank(conn: Connection, run_id: int, rank: int) -> bool:
    one = conn.exec_driver_sql(f"SELECT world_size FROM runs WHERE id = {int(run_id)}").scalar()
    if one != 1:
        return False
    # two range probes of the primary key (run_id, rank, span_id): "rank <> r" scanned every span
    # of rank r (0.1 s at 500k spans, most of a second at 5M)
    return all(conn.exec_driver_sql(
        f"SELECT 1 FROM span_rows WHERE run_id = {int(run_id)} AND rank {op} {int(rank)} LIMIT 1").first() is None
               for op in ("<", ">"))


def single_rank_run(store: Store, run_id: int, rank: int) -> bool:
    """Whether ``rank``'s spans are all of the run's: a run launched with world size 1 and no
    other rank's spans stored."""
    with store.engine.connect() as conn:
        return _single_rank(conn, run_id, rank)


def write_tree_nodes(
    store: Store, run_id: int, rule: str, trees: Mapping[str, Sequence[tuple[Any, ...]]], *, only_rank: int | None,
) -> bool:
    """Replace the run's stored tree with ``trees`` (clock -> node rows in ``NODE_COLUMNS`` order,
    pre-order), whose steps follow ``rule``.  ``only_rank``: the rank the tree was computed from,
    written only when ``single_rank_run`` (checked again in this transaction).
    Whether it was written."""
    m = mark(store)
    columns = ("run_id", "clock", "node", *NODE_COLUMNS, "step_rule")
    insert = f"INSERT INTO tree_nodes ({', '.join(columns)}) VALUES ({', '.join(m for _ in columns)})"
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM tree_nodes WHERE run_id = {int(run_id)}")
        if only_rank is not None and not _single_rank(conn, run_id, only_rank):
            return False
        rows = [(run_id, clock, i, *node, rule) for clock, nodes in trees.items() for i, node in enumerate(nodes)]
        if rows:
            conn.exec_driver_sql(insert, rows)
    return bool(rows)


def read_tree_nodes(store: Store, run_id: int, clock: str) -> tuple[str, list[tuple[Any, ...]]] | None:
    """(the step rule, the node rows in ``NODE_COLUMNS`` order, pre-order) of the run's stored tree
    on ``clock``; None when none is stored."""
    m = mark(store)
    sql = (f"SELECT step_rule, {', '.join(NODE_COLUMNS)} FROM tree_nodes WHERE run_id = {m} AND clock = {m} "
           "ORDER BY node")
    with driver_cursor(store) as cur:
        cur.execute(sql, (run_id, clock))
        rows = cur.fetchall()
    if not rows:
        return None
    return str(rows[0][0]), [tuple(r[1:]) for r in rows]


def read_recorded_rule(store: Store, run_id: int) -> tuple[str, bool]:
    """(runs.step_on, whether any rank's recorded step counter advanced): what resolving the run's
    step rule needs but its root calls (``store.roots.read_step_basis`` without them)."""
    m = mark(store)
    with driver_cursor(store) as cur:
        cur.execute(f"SELECT r.step_on, (SELECT max(k.step_count) FROM run_ranks k WHERE k.run_id = r.id) "
                    f"FROM runs r WHERE r.id = {m}", (run_id,))
        row = cur.fetchone()
    if row is None:
        return "optimizer", False
    return str(row[0] or "optimizer"), bool(row[1])
