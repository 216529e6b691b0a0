"""Work counters where stored meets computed: the counters of a run's spans (stored by
``modtrace analyze``, else computed from the recorder's ``call_counters``), and each
call-tree node's work per counted step for ``tree``.

Only a run that counted work (``store.counters.has_counters``: one indexed probe) reads
or computes anything here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

    from modtrace.store.engine import Store


def span_counts(store: Store, run_id: int, spans: pl.DataFrame) -> pl.DataFrame | None:
    """rank, span_id and ``analysis.counters.SPAN_COUNTER_COLUMNS`` of the run's counted spans;
    None when the run counted none.  The stored rows when the run was analysed, else computed
    from ``spans`` (the run's spans frame, as computed: with call_id, phase, graph_task)."""
    from modtrace.store.analysis_store import has_analysis
    from modtrace.store.counters import has_counters, read_counters, read_span_counters

    if not has_counters(store, run_id):
        return None
    if has_analysis(store, run_id):
        return read_span_counters(store, run_id)
    import polars as pl

    from modtrace.analysis.counters import span_counters

    if isinstance(spans.schema["phase"], pl.Enum):  # its order is the codes' (contracts.PHASES)
        spans = spans.with_columns(pl.col("phase").to_physical())
    parts = []
    for rank in sorted(spans["rank"].unique().to_list()):
        calls, ranges = read_counters(store, run_id, rank)
        parts.append(span_counters(spans.filter(pl.col("rank") == rank), calls, ranges))
    return pl.concat(parts) if parts else span_counters(spans.clear(), *read_counters(store, run_id, 0))


def node_counts(store: Store, run_id: int, nodes: Sequence[Mapping[str, Any]], selected: pl.DataFrame | None = None,
                run_spans: pl.DataFrame | None = None) -> dict[int, dict[str, Any]] | None:
    """node_id -> ``core.work.COUNTED_KEYS`` of each of ``nodes`` (the whole tree's, before any
    filter) that ran in a counted step; None when the run counted nothing.

    ``selected``: the spans the tree was built from (``run_spans``: all of the run's, for
    ``span_counts``), their steps the counted steps' keys; None: the whole run's tree (the stored
    one), whose counted spans are read from the store alone, without polars."""
    from modtrace.core.work import counts_by_node
    from modtrace.store.counters import has_counters

    if not has_counters(store, run_id):
        return None
    if selected is None:
        from modtrace.core.contracts import PHASES
        from modtrace.store.counters import COUNTED_SPAN_COLUMNS, counted_span_rows

        at = [COUNTED_SPAN_COLUMNS.index(c) for c in ("rank", "first_seq", "span_id", "parent_span_id", "phase", "fqn",
                                                      "flops", "bytes", "unknown_ops")]
        rows = [tuple(r[i] for i in at) for r in counted_span_rows(store, run_id)]
        spans = [(*r[:4], PHASES[r[4]], *r[5:]) for r in rows]
        return counts_by_node(nodes, spans)
    import polars as pl

    counts = span_counts(store, run_id, selected if run_spans is None else run_spans)
    if counts is None:
        return None
    counted = selected.select(
        "rank", pl.col("step").alias("sample"), "span_id", "parent_span_id", pl.col("phase").cast(pl.String),
        pl.col("fqn").cast(pl.String),
    ).join(counts.select("rank", "span_id", "flops", "bytes", "unknown_ops"), on=["rank", "span_id"], how="inner",
           maintain_order="left")
    return counts_by_node(nodes, counted.rows())
