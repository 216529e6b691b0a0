"""Work counters per span: the recorder's sums per (call, phase, graph task) charged to
spans, inclusive (the span and its descendants) and self (its own ops).

Pure polars (``modtrace.results.materialize`` reads and writes).  Only spans entered
inside a counted range (``counted_ranges``: a counted step) get counters; a span
there with no ops of its own counts 0, and one outside stays without (NULL).
"""

from __future__ import annotations

import polars as pl

from modtrace.core.contracts import SPAN_COUNTS

COUNTS = ("flops", "bytes", "ops", "unknown_ops")
# span_counter_rows' columns after run_id, rank, span_id
SPAN_COUNTER_COLUMNS = SPAN_COUNTS.names


def span_counters(spans: pl.DataFrame, calls: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """Counters of the spans entered in ``ranges``.

    ``spans``: rank, span_id, parent_span_id, depth, call_id, phase (code), graph_task;
    ``calls``: rank, call_id, phase, graph_task (-1 in forward) and ``COUNTS``;
    ``ranges``: rank, first_seq, last_seq.  Returns rank, span_id and
    ``SPAN_COUNTER_COLUMNS``, by rank and span_id."""
    out_schema = {"rank": pl.Int32, "span_id": pl.Int64, **dict.fromkeys(SPAN_COUNTER_COLUMNS, pl.Int64)}
    if spans.height == 0 or ranges.height == 0:
        return pl.DataFrame(schema=out_schema)
    keys = ("rank", "call_id", "phase", "task")
    picked = (
        spans.select(
            pl.col("rank").cast(pl.Int32), pl.col("span_id").cast(pl.Int64), pl.col("parent_span_id").cast(pl.Int64),
            pl.col("depth").cast(pl.Int32), pl.col("call_id").cast(pl.Int64), pl.col("phase").cast(pl.Int8),
            pl.col("graph_task").fill_null(-1).cast(pl.Int64).alias("task"),
        )
        .sort("rank", "span_id")
        .join_asof(
            ranges.select(pl.col("rank").cast(pl.Int32), pl.col("first_seq").cast(pl.Int64),
                          pl.col("last_seq").cast(pl.Int64)).sort("rank", "first_seq"),
            left_on="span_id", right_on="first_seq", by="rank", strategy="backward", check_sortedness=False,
        )
        .filter(pl.col("first_seq").is_not_null() & (pl.col("span_id") <= pl.col("last_seq")))
        .drop("first_seq", "last_seq")
    )
    own = calls.select(
        pl.col("rank").cast(pl.Int32), pl.col("call_id").cast(pl.Int64), pl.col("phase").cast(pl.Int8),
        pl.col("graph_task").cast(pl.Int64).alias("task"), *(pl.col(c).cast(pl.Int64).alias(f"{c}_self") for c in COUNTS),
    )
    counted = picked.join(own, on=keys, how="left").with_columns(
        pl.col(f"{c}_self").fill_null(0) for c in COUNTS
    ).with_columns(pl.col(f"{c}_self").alias(c) for c in COUNTS)
    # Inclusive: each depth's sums added to its parents, deepest first.
    max_depth = counted["depth"].max()
    for depth in range(int(max_depth) if isinstance(max_depth, int) else 0, 0, -1):
        children = (
            counted.filter(pl.col("depth") == depth)
            .group_by("rank", "parent_span_id")
            .agg(pl.col(c).sum().alias(f"{c}_children") for c in COUNTS)
            .rename({"parent_span_id": "span_id"})
        )
        counted = counted.join(children, on=["rank", "span_id"], how="left").with_columns(
            (pl.col(c) + pl.col(f"{c}_children").fill_null(0)).alias(c) for c in COUNTS
        ).drop(f"{c}_children" for c in COUNTS)
    return counted.select("rank", "span_id", *SPAN_COUNTER_COLUMNS).cast(out_schema).sort("rank", "span_id")  # type: ignore[arg-type]

