"""Rebuild: normalised events -> spans, one per (call_id, phase) call.

A *span* is one module call in one phase: its enter row, its exit row and
its place in the hierarchy.  The spans frame (``SPAN_COLUMNS``) has::

    run_id Int32, rank Int32, span_id Int64 (seq of the enter row),
    parent_span_id Int64 (null at a root), depth Int32 (0 at a root),
    module_id Int32, fqn Categorical, module_type Categorical,
    phase Enum(forward|backward|recompute|backward_call), call_id Int64, step Int32,
    thread_id Int32, graph_task Int64, start_ns Int64, end_ns Int64,
    duration_ns Int64, self_ns Int64 (duration minus its children's),
    device_id Int32, device Categorical, stream Int64,
    status Enum(ok|error|early_stop|closed_at_end_of_backward|no_enter),
    exit_seq Int64

A span that was never exited has null end_ns, duration_ns, self_ns,
status and exit_seq.  Hierarchy is per stack (``events.with_stack``):
forward per (rank, thread), the other phases per (rank, thread, graph
task), so a recompute or backward_call span's parent is the backward span
open on its thread when it ran.

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
    lookup_key,
    normalize_events,
)
from modtrace.analysis.stack import walk_stack
from modtrace.core.contracts import SPAN_FRAME, SPAN_ROW

SPAN_COLUMNS: tuple[str, ...] = SPAN_FRAME.names

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
    ``child_ns``, when not None, is aligned with ``pairs``: each span's
    children's summed durations (what ``time_spans`` would otherwise join
    for), known cheaply when every stack nested cleanly.
    """

    pairs: pl.DataFrame
    issues: pl.DataFrame
    child_ns: pl.Series | None = None


def _levels(ev: pl.DataFrame) -> pl.DataFrame:
    """One row per row of ``ev`` (``_row``, its position), sorted by (stack, level, order).

    A row's level is the depth it opens (enter) or closes (exit).  Columns:
    ``_key`` (stack and level: rows with equal keys are one level of one
    stack, in order), ``kind``, ``_level`` (Int32) and ``_up``: for an enter
    whose previous row in its stack is an enter, that row (its parent).
    Two stable single-key sorts of narrow frames; no windows over many small
    groups.
    """
    is_enter = pl.col("kind") == ENTER
    by_stack = ev.select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("_row"), "stack", "kind")
    if not by_stack["stack"].is_sorted():
        by_stack = by_stack.sort("stack", maintain_order=True)
    step = pl.when(is_enter).then(1).otherwise(-1).cast(pl.Int64)
    first = (pl.col("stack") != pl.col("stack").shift(1)).fill_null(True)
    return (
        by_stack.with_columns(step.cum_sum().alias("_c"), first.alias("_first"))
        .select(
            "_row",
            "kind",
            # depth after the row: the running sum, less its value where the stack began
            (pl.col("_c") - pl.when(pl.col("_first")).then(pl.col("_c") - step).forward_fill() - is_enter.cast(pl.Int64))
            .cast(pl.Int32)
            .alias("_level"),
            pl.col("_first").cum_sum().cast(pl.Int64).alias("_sid"),
            pl.when(is_enter & ~pl.col("_first") & (pl.col("kind").shift(1) == ENTER))
            .then(pl.col("_row").shift(1))
            .alias("_up"),
        )
        .with_columns((pl.col("_sid") * (1 << 32) + pl.col("_level") + (1 << 31)).alias("_key"))
        .drop("_sid")
        .sort("_key", maintain_order=True)
    )


def _repeated_stacks(ev: pl.DataFrame) -> list[int]:
    """Stacks where a call is entered twice in one phase (the vectorised rebuild cannot pair them)."""
    enters = ev.filter(pl.col("kind") == ENTER)
    lo, hi = enters.select(pl.col("call_id").min(), pl.col("call_id").max().alias("_hi")).row(0)
    if lo is not None and -(1 << 60) < lo and hi < (1 << 60):
        # Cheap screen: a repeat needs a (call, phase) seen twice in some stack.
        packed = enters.select((pl.col("call_id") * 4 + pl.col("phase").cast(pl.Int64)).sort()).to_series()
        if not bool((packed.diff() == 0).any()):
            return []
    repeated = enters.select("stack", "call_id", "phase").filter(pl.struct("stack", "call_id", "phase").is_duplicated())
    return repeated["stack"].unique().to_list()


def pair_events(ev: pl.DataFrame) -> Pairing:
    """Normalised event frame (``normalize_events``) -> enter/exit pairs and structural issues."""
    lv = _levels(ev)
    first = (pl.col("_key") != pl.col("_key").shift(1)).fill_null(True)
    last = (pl.col("_key") != pl.col("_key").shift(-1)).fill_null(True)
    call = ev["call_id"].gather(lv["_row"])
    phase = ev["phase"].gather(lv["_row"])
    lv = lv.with_columns(
        # An exit is clean when the previous row at its level is its call's enter.
        (
            (pl.col("kind") == EXIT)
            & ~(
                ~first
                & (pl.col("kind").shift(1) == ENTER)
                & (call.shift(1) == call)
                & (phase.shift(1) == phase)
            ).fill_null(False)
        ).alias("_bad"),
        # In a clean stack the next row at an enter's depth is its exit, if any.
        pl.when(~last & (pl.col("kind").shift(-1) == EXIT)).then(pl.col("_row").shift(-1)).alias("_exit"),
        # Parents: known where the previous row of the stack is an enter, else
        # the same as the previous enter at this level (a sibling); -1 stops
        # the fill at the start of a level.
        pl.when(first & pl.col("_up").is_null())
        .then(-1)
        .otherwise(pl.col("_up").cast(pl.Int64))
        .forward_fill()
        .alias("_parent"),
    )
    del call, phase
    dirty = set(ev["stack"].gather(lv.filter(pl.col("_bad"))["_row"]).unique().to_list())
    dirty.update(_repeated_stacks(ev))

    enter_rows = pl.col("kind") == ENTER
    if dirty:
        clean = ~pl.col("stack").is_in(list(dirty))
        clean_rows = ev.select(clean).to_series()
        lv = lv.filter(enter_rows & clean_rows.gather(lv["_row"]))
    else:
        clean = pl.lit(True)
        lv = lv.filter(enter_rows)
    lv = lv.select("_row", "_level", "_exit", pl.when(pl.col("_parent") >= 0).then(pl.col("_parent")).alias("_parent"))
    child_ns = None if dirty else _child_durations(ev, lv)
    # Enters back in (rank, order) order, the order of ``ev``'s rows.
    lv = lv.sort("_row")
    exit_row = lv["_exit"]
    parent_row = lv["_parent"]
    pairs = ev.filter((pl.col("kind") == ENTER) & clean).select(
        "run_id", "rank", pl.col("seq").alias("span_id"),
        pl.lit(ev["seq"].gather(parent_row)).alias("parent_span_id"),
        pl.lit(lv["_level"]).alias("depth"),
        "module_id", "phase", "call_id", "step", "thread_id", "graph_task",
        pl.col("ts_ns").alias("start_ns"),
        pl.lit(ev["ts_ns"].gather(exit_row)).alias("end_ns"),
        "device_id", "stream",
        pl.lit(ev["status"].gather(exit_row)).alias("status"),
        pl.lit(ev["seq"].gather(exit_row)).alias("exit_seq"),
        "order",
    )
    del lv, exit_row, parent_row
    unclosed = pairs.filter(pl.col("exit_seq").is_null()).select(
        "rank", pl.col("span_id").alias("seq"), pl.lit("unclosed").alias("kind"), "module_id", "phase", "call_id"
    )
    issues = [conform(unclosed, RAW_ISSUE_SCHEMA)]
    if dirty:
        walked_pairs, walked_issues = _walk_dirty(ev.filter(~clean))
        pairs = pl.concat([pairs, walked_pairs], how="vertical_relaxed").sort("rank", "order")
        issues.append(walked_issues)
    return Pairing(pairs=pairs, issues=pl.concat(issues).sort("rank", "seq", "kind"), child_ns=child_ns)


def _child_durations(ev: pl.DataFrame, enters: pl.DataFrame) -> pl.Series:
    """Children's summed durations per enter of ``ev``, in ``ev``'s row order (enters only).

    ``enters`` are the enters of clean stacks in (stack, level, order) order
    with their ``_exit`` and ``_parent`` rows.  There, the children of one
    parent are next to each other (they are the rows one level down between
    its enter and its exit), so a running sum over runs of equal parents
    adds them up without a join.
    """
    ts = ev["ts_ns"]
    runs = (
        enters.select("_parent", (ts.gather(enters["_exit"]) - ts.gather(enters["_row"])).fill_null(0).alias("_d"))
        .filter(pl.col("_parent").is_not_null())
        .with_columns(pl.col("_d").cum_sum())
        .filter((pl.col("_parent") != pl.col("_parent").shift(-1)).fill_null(True))
        .select("_parent", (pl.col("_d") - pl.col("_d").shift(1).fill_null(0)).alias("_sum"))
    )
    # A parent's place among the enters in row order.
    place = ev.select(((pl.col("kind") == ENTER).cum_sum() - 1).cast(pl.UInt32)).to_series()
    n_enters = int(place[-1]) + 1 if len(place) else 0
    child = pl.zeros(n_enters, dtype=pl.Int64, eager=True)
    if runs.height:
        child.scatter(place.gather(runs["_parent"]), runs["_sum"])
    return child


def _walk_dirty(ev: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Walk the rows of unclean stacks; returns (pairs, raw issues) for them.

    The walk is given each row's position in ``ev`` where a seq goes (it
    only needs an identity in stack order), so its spans and issues turn
    back into seqs and attributes by gathers, not joins.
    """
    span_rows: list[tuple[int, int | None, int | None, int]] = []
    issue_rows: list[tuple[object, ...]] = []
    rows = ev.select(pl.int_range(pl.len(), dtype=pl.Int64).alias("_i"), "rank", "stack", "kind", "module_id",
                     "phase", "call_id", "status")
    for _, part in rows.group_by("rank", "stack", maintain_order=True):
        result = walk_stack(part.select("_i", "kind", "module_id", "phase", "call_id", "status").iter_rows())
        span_rows.extend(result.spans)
        issue_rows.extend(
            (i, kind, mod, phase, call, det.get("other"), det.get("other_exit"), det.get("other_module"), det.get("status"))
            for i, kind, mod, phase, call, det in result.issues
        )
    del rows
    walked = pl.DataFrame(
        span_rows, schema={"_i": pl.Int64(), "_x": pl.Int64(), "_p": pl.Int64(), "depth": pl.Int32()}, orient="row"
    )
    seq, ts, status = ev["seq"], ev["ts_ns"], ev["status"]
    pairs = pl.concat(
        [
            ev.select(
                "run_id", "rank", pl.col("seq").alias("span_id"), "module_id", "phase", "call_id", "step",
                "thread_id", "graph_task", pl.col("ts_ns").alias("start_ns"), "device_id", "stream", "order",
            )[walked["_i"]],
            walked.select(
                pl.lit(seq).gather(pl.col("_p")).alias("parent_span_id"),
                "depth",
                pl.lit(ts).gather(pl.col("_x")).alias("end_ns"),
                pl.lit(status).gather(pl.col("_x")).alias("status"),
                pl.lit(seq).gather(pl.col("_x")).alias("exit_seq"),
            ),
        ],
        how="horizontal",
    ).select(_PAIR_COLUMNS)
    found = pl.DataFrame(
        issue_rows,
        schema={"_i": pl.Int64(), "kind": pl.String(), "module_id": pl.Int32(), "phase": pl.Int8(),
                "call_id": pl.Int64(), "_o": pl.Int64(), "_oe": pl.Int64(), "other_module": pl.Int32(),
                "status": pl.Int8()},
        orient="row",
    )
    issues = found.select(
        pl.lit(ev["rank"]).gather(pl.col("_i")).alias("rank"),
        pl.lit(seq).gather(pl.col("_i")).alias("seq"),
        "kind", "module_id", "phase", "call_id",
        pl.lit(seq).gather(pl.col("_o")).alias("other"),
        pl.lit(seq).gather(pl.col("_oe")).alias("other_exit"),
        "other_module", "status",
    )
    return pairs, conform(issues, RAW_ISSUE_SCHEMA)


# Columns of the stored form of a span (table span_rows): codes, no names.
SPAN_ROW_COLUMNS: tuple[str, ...] = SPAN_ROW.names
SPAN_ROW_SCHEMA: dict[str, pl.DataType] = SPAN_ROW.polars()


def _span_keys(spans: pl.DataFrame) -> tuple[list[str], pl.Expr, pl.Expr]:
    """How to join spans to their parents: (key columns, own key, parent key).

    A span is named by (rank, span_id).  One Int64 key joins much faster than
    two columns: span_id alone when there is one rank, rank * 2**47 + id when
    ranks and ids fit, else the two columns (``_rank``, ``_key``).
    """
    lo_rank, hi_rank, lo_id, hi_id = spans.select(
        pl.col("rank").min().alias("a"), pl.col("rank").max().alias("b"),
        pl.min_horizontal(pl.col("span_id").min(), pl.col("parent_span_id").min()).alias("c"),
        pl.max_horizontal(pl.col("span_id").max(), pl.col("parent_span_id").max()).alias("d"),
    ).row(0)
    if lo_rank == hi_rank:
        return ["_key"], pl.col("span_id").alias("_key"), pl.col("parent_span_id").alias("_key")
    if lo_rank >= 0 and hi_rank < (1 << 15) and lo_id >= 0 and hi_id < (1 << 47):
        rank = pl.col("rank").cast(pl.Int64) * (1 << 47)
        return ["_key"], (rank + pl.col("span_id")).alias("_key"), (rank + pl.col("parent_span_id")).alias("_key")
    return ["rank", "_key"], pl.col("span_id").alias("_key"), pl.col("parent_span_id").alias("_key")


def time_spans(pairs: pl.DataFrame, child_ns: pl.Series | None = None) -> pl.DataFrame:
    """Pairs frame -> span rows (``SPAN_ROW_COLUMNS``): adds duration and self time.

    ``child_ns`` (``Pairing.child_ns``) saves joining each span with its children.
    """
    spans = pairs.with_columns((pl.col("end_ns") - pl.col("start_ns")).alias("duration_ns"))
    if child_ns is not None:
        return spans.with_columns((pl.col("duration_ns") - pl.lit(child_ns)).alias("self_ns")).select(SPAN_ROW_COLUMNS)
    key, own, parent = _span_keys(spans)
    children = (
        spans.filter(pl.col("parent_span_id").is_not_null())
        .group_by(*key[:-1], parent)
        .agg(pl.col("duration_ns").sum().alias("_child_ns"))
    )
    return (
        spans.with_columns(own)
        .join(children, on=key, how="left", maintain_order="left")
        .with_columns((pl.col("duration_ns") - pl.col("_child_ns").fill_null(0)).alias("self_ns"))
        .select(SPAN_ROW_COLUMNS)
    )


def name_spans(rows: pl.DataFrame, modules: pl.DataFrame, devices: pl.DataFrame) -> pl.DataFrame:
    """Span rows (codes) -> spans frame (``SPAN_COLUMNS``): module and device names, phase and status as Enums."""
    names = conform(modules, MODULE_SCHEMA).select(
        lookup_key("rank", "module_id").alias("_mk"),
        pl.col("fqn").cast(pl.Categorical),
        pl.col("module_type").cast(pl.Categorical),
    )
    devs = conform(devices, DEVICE_SCHEMA).select(
        lookup_key("rank", "device_id").alias("_dk"), pl.col("name").cast(pl.Categorical).alias("device")
    )
    keys = rows.select(lookup_key("rank", "module_id").alias("_mk"), lookup_key("rank", "device_id").alias("_dk"))
    found = keys.join(names, on="_mk", how="left", maintain_order="left").join(
        devs, on="_dk", how="left", maintain_order="left"
    )
    if found.height == rows.height:
        # Lookups join the two key columns only; the span rows are not copied.
        rows = rows.with_columns(found.select("fqn", "module_type", "device"))
    else:  # a lookup listed a module or device twice: one span row per match, as a join gives
        rows = rows.with_columns(keys).join(names, on="_mk", how="left", maintain_order="left").join(
            devs, on="_dk", how="left", maintain_order="left"
        )
    return rows.with_columns(
        decode(pl.col("phase"), PHASE_ENUM).alias("phase"),
        decode(pl.col("status"), STATUS_ENUM).alias("status"),
    ).select(SPAN_COLUMNS)


def empty_spans() -> pl.DataFrame:
    """A spans frame with no rows."""
    return pl.DataFrame(schema=SPAN_FRAME.polars())


def build_spans(
    pairs: pl.DataFrame, modules: pl.DataFrame, devices: pl.DataFrame, child_ns: pl.Series | None = None
) -> pl.DataFrame:
    """Pairs frame -> spans frame (``SPAN_COLUMNS``): timings, self time, names.

    Pass ``Pairing.child_ns`` along with ``Pairing.pairs`` when you have it (faster).
    """
    return name_spans(time_spans(pairs, child_ns), modules, devices)


def rebuild_spans(events: pl.DataFrame, modules: pl.DataFrame, devices: pl.DataFrame) -> pl.DataFrame:
    """Event frame (with its module and device frames) -> spans frame (of its valid rows)."""
    from modtrace.analysis.validate import validate

    pairing = pair_events(normalize_events(validate(events, modules)[0], modules))
    return build_spans(pairing.pairs, modules, devices, pairing.child_ns)
