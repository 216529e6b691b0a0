"""Each call-tree node's memory for ``tree`` (``node_memory``), from the spans' kept and peak
memory (``modtrace.results.span_memory``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

    from modtrace.store.engine import Store


def node_memory(store: Store, run_id: int, nodes: Sequence[Mapping[str, Any]], selected: pl.DataFrame | None = None,
                run_spans: pl.DataFrame | None = None) -> dict[int, dict[str, Any]] | None:
    """node_id -> ``core.memory_nodes.MEMORY_KEYS`` of each of ``nodes`` (the whole tree's) that
    ran in a counted step with memory; None when the run recorded none.

    ``selected``: the spans the tree was built from (``run_spans``: all of the run's); None: the
    whole run's stored tree, whose counted spans are read from the store alone."""
    from modtrace.core.memory_nodes import memory_by_node
    from modtrace.store.memory import has_memory

    if not has_memory(store, run_id):
        return None
    if selected is None:
        from modtrace.core.contracts import PHASES
        from modtrace.store.cursor import driver_cursor, mark

        sql = (
            "SELECT s.rank, r.first_seq, s.span_id, s.span_id - s.parent_gap, s.phase, m.fqn, "
            "sm.kept_mem_bytes, sm.peak_mem_bytes FROM counted_ranges r "
            "CROSS JOIN span_rows s "  # the ranges first, each one's spans by key (store.counters)
            "JOIN span_memory_rows sm ON sm.run_id = s.run_id AND sm.rank = s.rank AND sm.span_id = s.span_id "
            "JOIN modules m ON m.run_id = s.run_id AND m.rank = s.rank AND m.module_id = s.module_id "
            "WHERE s.run_id = r.run_id AND s.rank = r.rank AND s.span_id BETWEEN r.first_seq AND r.last_seq "
            f"AND r.run_id = {mark(store)} ORDER BY s.rank, s.span_id"
        )
        with driver_cursor(store) as cur:
            cur.execute(sql, (run_id,))
            rows = [(r[0], r[1], r[2], r[3], PHASES[r[4]], *r[5:]) for r in cur.fetchall()]
        return memory_by_node(nodes, rows)
    import polars as pl

    from modtrace.results.span_memory import span_memory

    memory = span_memory(store, run_id, selected if run_spans is None else run_spans)
    if memory is None:
        return None
    counted = selected.select(
        "rank", pl.col("step").alias("sample"), "span_id", "parent_span_id", pl.col("phase").cast(pl.String),
        pl.col("fqn").cast(pl.String),
    ).join(memory.select("rank", "span_id", "kept_mem_bytes", "peak_mem_bytes"), on=["rank", "span_id"], how="inner",
           maintain_order="left")
    return memory_by_node(nodes, counted.rows())
