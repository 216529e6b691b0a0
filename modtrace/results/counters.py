"""Work counters where stored meets computed: the counters of a run's spans (stored by
``modtrace analyze``, else computed from the recorder's ``call_counters``), and each
call-tree node's work per counted step for ``tree``.

Only a run that counted work (``store.counters.has_counters``: one indexed probe) reads
or computes anything here.
"""

from __future__ import annotations

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


def node_counts(store: Store, run_id: int, selected: pl.DataFrame | None = None,
                run_spans: pl.DataFrame | None = None) -> dict[int, dict[str, Any]] | None:
    """node_id -> ``core.work.COUNTED_KEYS`` of each tree node that ran in a counted step; None
    when the run counted nothing.

    ``selected``: the spans the tree was built from (``run_spans``: all of the run's, for
    ``span_counts``), their steps the counted steps' keys; None: the whole run's tree (the stored
    one), whose counted steps are read from the store alone (the counted ranges' spans)."""
    from modtrace.store.counters import has_counters

    if not has_counters(store, run_id):
        return None
    import polars as pl

    from modtrace.analysis.counters import node_work
    from modtrace.core.contracts import PHASES

    columns = ("rank", "sample", "span_id", "parent_span_id", "depth", "phase", "fqn", "flops", "bytes", "unknown_ops")
    if selected is None:
        from modtrace.store.counters import read_counted_spans

        counted = read_counted_spans(store, run_id).with_columns(
            pl.col("first_seq").alias("sample"),
            pl.col("phase").replace_strict(list(range(len(PHASES))), list(PHASES), return_dtype=pl.String),
        )
    else:
        counts = span_counts(store, run_id, selected if run_spans is None else run_spans)
        if counts is None:
            return None
        counted = selected.select(
            "rank", pl.col("step").cast(pl.Int64).alias("sample"), "span_id", "parent_span_id", "depth",
            pl.col("phase").cast(pl.String), pl.col("fqn").cast(pl.String),
        ).join(counts.select("rank", "span_id", "flops", "bytes", "unknown_ops"), on=["rank", "span_id"], how="inner")
    work = node_work(counted.select(columns))
    return {row["node_id"]: row for row in work.iter_rows(named=True)}
