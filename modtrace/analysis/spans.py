"""Rebuild: normalised events -> spans, one per (call_id, phase) call.

A *span* is one module call in one phase: its enter row, its exit row and
its place in the hierarchy.  The spans frame (``SPAN_COLUMNS``) has::

    run_id Int32, rank Int32, span_id Int64 (seq of the enter row),
    parent_span_id Int64 (null at a root), depth Int32 (0 at a root),
    module_id Int32, fqn Categorical, module_type Categorical,
    phase Enum(forward|backward|recompute), call_id Int64, step Int32,
    thread_id Int32, graph_task Int64, start_ns Int64, end_ns Int64,
    duration_ns Int64, self_ns Int64 (duration minus its children's),
    device_id Int32, device Categorical, stream Int64,
    status Enum(ok|error|early_stop|closed_at_end_of_backward|no_enter),
    exit_seq Int64

A span that was never exited has null end_ns, duration_ns, self_ns,
status and exit_seq.  Hierarchy is per stack (``events.with_stack``):
forward per (rank, thread), backward and recompute per (rank, thread,
graph task), so a recompute span's parent is the backward span open on its
thread when it ran.

Stacks whose rows nest cleanly are rebuilt with window expressions (depth
is a running sum of +1 per enter and -1 per exit; an exit is the next row
at its enter's depth).  A stack where any exit does not close the call its
depth says, or where a call is entered twice, is walked row by row by
``stack.walk_stack`` instead, so that the result and the issues are exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from modtrace.analysis.events import (
    DEVICE_SCHEMA,
    ENTER,
    EXIT,
    MODULE_SCHEMA,
    PHASE_ENUM,
    STATUS_ENUM,
    conform,
    decode,
    normalize_events,
)
from modtrace.analysis.stack import walk_stack

SPAN_COLUMNS: tuple[str, ...] = (
    "run_id", "rank", "span_id", "parent_span_id", "depth", "module_id", "fqn", "module_type",
    "phase", "call_id", "step", "thread_id", "graph_task", "start_ns", "end_ns", "duration_ns",
    "self_ns", "device_id", "device", "stream", "status", "exit_seq",
)

# Columns of the pairs frame: a span before lookups and timings.
_PAIR_COLUMNS: tuple[str, ...] = (
    "run_id", "rank", "span_id", "parent_span_id", "depth", "module_id", "phase", "call_id",
    "step", "thread_id", "graph_task", "start_ns", "end_ns", "device_id", "stream", "status",
    "exit_seq", "order",
)

RAW_ISSUE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "seq": pl.Int64(),
    "kind": pl.String(),
    "module_id": pl.Int32(),
    "phase": pl.Int8(),
    "call_id": pl.Int64(),
    "other": pl.Int64(),
    "other_exit": pl.Int64(),
    "other_module": pl.Int32(),
    "status": pl.Int8(),
}


@dataclass(frozen=True)
class Pairing:
    """What ``pair_events`` found: one row per span, and structural issues.

    ``pairs`` has ``_PAIR_COLUMNS`` (codes, no names, no durations).
    ``issues`` has ``RAW_ISSUE_SCHEMA``: rank, seq, kind (no_enter, unclosed,
    crossed, reentered, duplicate_enter, duplicate_exit), the row's module,
    phase and call, and the other rows the message refers to.
    """

    pairs: pl.DataFrame
    issues: pl.DataFrame


def pair_events(ev: pl.DataFrame) -> Pairing:
    """Normalised event frame (``normalize_events``) -> enter/exit pairs and structural issues."""
    is_enter = pl.col("kind") == ENTER
    ev = ev.with_columns(
        pl.when(is_enter).then(1).otherwise(-1).cast(pl.Int32).cum_sum().over("stack").alias("_after"),
    ).with_columns((pl.col("_after") - is_enter.cast(pl.Int32)).alias("_level"))
    lvl = ["stack", "_level"]
    ev = ev.with_columns(
        pl.col("kind").shift(1).over(lvl).alias("_pk"),
        pl.col("call_id").shift(1).over(lvl).alias("_pc"),
        pl.col("phase").shift(1).over(lvl).alias("_pp"),
        pl.col("kind").shift(-1).over(lvl).alias("_nk"),
        pl.col("seq").shift(-1).over(lvl).alias("_ns"),
        pl.col("ts_ns").shift(-1).over(lvl).alias("_nt"),
        pl.col("status").shift(-1).over(lvl).alias("_nst"),
        pl.when(pl.col("kind").shift(1).over("stack") == ENTER)
        .then(pl.col("seq").shift(1).over("stack"))
        .alias("_parent"),
    )
    bad_exit = (pl.col("kind") == EXIT) & ~(
        (pl.col("_pk") == ENTER) & (pl.col("_pc") == pl.col("call_id")) & (pl.col("_pp") == pl.col("phase"))
    ).fill_null(False)
    dirty = set(ev.filter(bad_exit)["stack"].unique().to_list())
    repeated = (
        ev.filter(is_enter)
        .group_by("stack", "call_id", "phase")
        .agg(pl.len().alias("_n"))
        .filter(pl.col("_n") > 1)["stack"]
        .unique()
        .to_list()
    )
    dirty.update(repeated)

    clean = ev.filter(is_enter & ~pl.col("stack").is_in(list(dirty))) if dirty else ev.filter(is_enter)
    clean = clean.with_columns(pl.col("_parent").forward_fill().over(lvl))
    # In a clean stack the next row at an enter's depth is its exit, if any.
    closed = pl.col("_nk") == EXIT
    pairs = clean.select(
        "run_id",
        "rank",
        pl.col("seq").alias("span_id"),
        pl.col("_parent").alias("parent_span_id"),
        pl.col("_level").alias("depth"),
        "module_id",
        "phase",
        "call_id",
        "step",
        "thread_id",
        "graph_task",
        pl.col("ts_ns").alias("start_ns"),
        pl.when(closed).then(pl.col("_nt")).alias("end_ns"),
        "device_id",
        "stream",
        pl.when(closed).then(pl.col("_nst")).alias("status"),
        pl.when(closed).then(pl.col("_ns")).alias("exit_seq"),
        "order",
    )
    unclosed = clean.filter(~closed.fill_null(False)).select(
        "rank", "seq", pl.lit("unclosed").alias("kind"), "module_id", "phase", "call_id"
    )
    issues = [conform(unclosed, RAW_ISSUE_SCHEMA)]
    if dirty:
        walked_pairs, walked_issues = _walk_dirty(ev.filter(pl.col("stack").is_in(list(dirty))))
        pairs = pl.concat([pairs, walked_pairs], how="vertical_relaxed").sort("rank", "order")
        issues.append(walked_issues)
    return Pairing(pairs=pairs, issues=pl.concat(issues).sort("rank", "seq", "kind"))


def _walk_dirty(ev: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Walk the rows of unclean stacks; returns (pairs, raw issues) for them."""
    span_rows: list[tuple[int, int, int | None, int | None, int]] = []
    issue_rows: list[tuple[object, ...]] = []
    for (rank, _), part in ev.group_by("rank", "stack", maintain_order=True):
        rows = part.select("seq", "kind", "module_id", "phase", "call_id", "status").iter_rows()
        result = walk_stack(rows)
        span_rows.extend((int(rank), s, e, p, d) for s, e, p, d in result.spans)
        issue_rows.extend(
            (rank, seq, kind, mod, phase, call, det.get("other"), det.get("other_exit"), det.get("other_module"), det.get("status"))
            for seq, kind, mod, phase, call, det in result.issues
        )
    walked = pl.DataFrame(
        span_rows,
        schema={"rank": pl.Int32(), "span_id": pl.Int64(), "exit_seq": pl.Int64(), "parent_span_id": pl.Int64(), "depth": pl.Int32()},
        orient="row",
    )
    enter = ev.select(
        "run_id", "rank", pl.col("seq").alias("span_id"), "module_id", "phase", "call_id", "step",
        "thread_id", "graph_task", pl.col("ts_ns").alias("start_ns"), "device_id", "stream", "order",
    )
    exit_ = ev.select("rank", pl.col("seq").alias("exit_seq"), pl.col("ts_ns").alias("end_ns"), "status")
    pairs = (
        walked.join(enter, on=["rank", "span_id"], how="left")
        .join(exit_, on=["rank", "exit_seq"], how="left")
        .with_columns(pl.col("depth").cast(pl.Int32))
        .select(_PAIR_COLUMNS)
    )
    issues = pl.DataFrame(issue_rows, schema=RAW_ISSUE_SCHEMA, orient="row")
    return pairs, issues


# Columns of the stored form of a span (table span_rows): codes, no names.
SPAN_ROW_COLUMNS: tuple[str, ...] = (
    "run_id", "rank", "span_id", "parent_span_id", "depth", "module_id", "phase", "call_id", "step",
    "thread_id", "graph_task", "start_ns", "end_ns", "duration_ns", "self_ns", "device_id", "stream",
    "status", "exit_seq",
)

SPAN_ROW_SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.Int32(), "rank": pl.Int32(), "span_id": pl.Int64(), "parent_span_id": pl.Int64(),
    "depth": pl.Int32(), "module_id": pl.Int32(), "phase": pl.Int8(), "call_id": pl.Int64(),
    "step": pl.Int32(), "thread_id": pl.Int32(), "graph_task": pl.Int64(), "start_ns": pl.Int64(),
    "end_ns": pl.Int64(), "duration_ns": pl.Int64(), "self_ns": pl.Int64(), "device_id": pl.Int32(),
    "stream": pl.Int64(), "status": pl.Int8(), "exit_seq": pl.Int64(),
}


def time_spans(pairs: pl.DataFrame) -> pl.DataFrame:
    """Pairs frame -> span rows (``SPAN_ROW_COLUMNS``): adds duration and self time."""
    spans = pairs.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"))
    children = (
        spans.filter(pl.col("parent_span_id").is_not_null())
        .group_by("rank", "parent_span_id")
        .agg(pl.col("duration_ns").sum().alias("_child_ns"))
        .rename({"parent_span_id": "span_id"})
    )
    return (
        spans.join(children, on=["rank", "span_id"], how="left", maintain_order="left")
        .with_columns((pl.col("duration_ns") - pl.col("_child_ns").fill_null(0)).alias("self_ns"))
        .select(SPAN_ROW_COLUMNS)
    )


def name_spans(rows: pl.DataFrame, modules: pl.DataFrame, devices: pl.DataFrame) -> pl.DataFrame:
    """Span rows (codes) -> spans frame (``SPAN_COLUMNS``): module and device names, phase and status as Enums."""
    names = conform(modules, MODULE_SCHEMA).select(
        "rank", "module_id", pl.col("fqn").cast(pl.Categorical), pl.col("module_type").cast(pl.Categorical)
    )
    devs = conform(devices, DEVICE_SCHEMA).select(
        "rank", "device_id", pl.col("name").cast(pl.Categorical).alias("device")
    )
    return (
        rows.join(names, on=["rank", "module_id"], how="left", maintain_order="left")
        .join(devs, on=["rank", "device_id"], how="left", maintain_order="left")
        .with_columns(
            decode(pl.col("phase"), PHASE_ENUM).alias("phase"),
            decode(pl.col("status"), STATUS_ENUM).alias("status"),
        )
        .select(SPAN_COLUMNS)
    )


def build_spans(pairs: pl.DataFrame, modules: pl.DataFrame, devices: pl.DataFrame) -> pl.DataFrame:
    """Pairs frame -> spans frame (``SPAN_COLUMNS``): timings, self time, names."""
    return name_spans(time_spans(pairs), modules, devices)


def rebuild_spans(events: pl.DataFrame, modules: pl.DataFrame, devices: pl.DataFrame) -> pl.DataFrame:
    """Event frame (with its module and device frames) -> spans frame."""
    pairing = pair_events(normalize_events(events, modules))
    return build_spans(pairing.pairs, modules, devices)
