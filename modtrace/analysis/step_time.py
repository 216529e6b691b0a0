"""Step time: the one definition every view of a step uses.

The *step time* of a (rank, step) is the time the step spent inside module
calls: the union of the intervals of its closed root spans (depth 0), every
phase.  Root spans of one thread never overlap, so on one thread this is
their summed duration; root calls that threads make at once (a serving
pool's requests in one optimizer step, say) count the time any of them ran
once.  Self times partition the root spans, so it splits into phases by self
time: forward + backward + recompute = step time when the step's root spans
do not overlap (recompute runs inside backward spans and counts once, as
recompute; a backward_call, a module called by backward code, counts as
backward); where they overlap, the phases sum the threads' time and exceed
it.

A step's *wall* time runs from its first span's start to the next step's
first start on the same rank (so the optimizer step and data loading that
follow a step's backward are its own), or to its own last span's end when
that is later (steps that overlap on threads: a request still running when
the next one starts); the last step, and the last before a step not
recorded (a schedule's), ends at its last span's end (or start, for a span
never exited).  ``wall - step`` is the time outside module calls, never
negative.

``modtrace tree`` shows inclusive time as a percent of the step time,
``modtrace diff`` compares step times and shares of them, the HTML report's
per-step table and ``queries/step_breakdown.sql`` (like ``slowest_steps``
and ``rank_stragglers`` for the wall time) show both, with the phase split;
the queries read the ``steps`` view, over the step table stored with a
run's analysis (``modtrace.results.materialize``).  ``docs/schema.md`` writes the same down for SQL
users.
"""

from __future__ import annotations

import polars as pl

from modtrace.core.codes import Phase

STEP_COLUMNS: tuple[str, ...] = (
    "rank", "step", "step_ns", "forward_ns", "backward_ns", "recompute_ns", "wall_ns", "spans", "unclosed",
)

# The step table as the store keeps it (table step_rows, read by the steps view).
STORED_STEP_COLUMNS: tuple[str, ...] = ("rank", "step", "start_ns", *STEP_COLUMNS[2:])


def step_time() -> pl.Expr:
    """Aggregation over a (rank, step)'s spans (``depth``, ``start_ns``, ``duration_ns``): its step
    time, the union of its closed root spans' intervals.

    Taken in start order, each root span adds the part of it past the latest end of those before
    it: all of it when it starts after them, nothing when they cover it.
    """
    root = (pl.col("depth") == 0) & pl.col("duration_ns").is_not_null()
    start = pl.col("start_ns").filter(root)
    end = (pl.col("start_ns") + pl.col("duration_ns")).filter(root)
    order = start.arg_sort()
    start, end = start.gather(order), end.gather(order)
    covered = end.cum_max().shift(1)
    return pl.max_horizontal(end - pl.max_horizontal(start, covered), pl.lit(0, pl.Int64)).sum()


def summed_step_time() -> pl.Expr:
    """Aggregation over a (rank, step)'s calls that carry no start times (``modtrace diff``'s): the
    summed duration of its closed root spans, the step time of a step whose root spans do not
    overlap (every step whose root calls one thread made)."""
    return pl.col("duration_ns").filter(pl.col("depth") == 0).sum()


# The step table's phase columns and the phases each sums: a module called by backward code
# (backward_call) is backward's work.
_PHASE_COLUMNS: dict[str, tuple[Phase, ...]] = {
    "forward_ns": (Phase.FORWARD,),
    "backward_ns": (Phase.BACKWARD, Phase.BACKWARD_CALL),
    "recompute_ns": (Phase.RECOMPUTE,),
}


def _phase_time(*phases: Phase) -> pl.Expr:
    """Aggregation over a (rank, step)'s spans: the part of its step time spent in ``phases``
    (summed self time of their closed spans)."""
    return pl.col("self_ns").filter(pl.col("phase").to_physical().is_in([int(p) for p in phases])).sum()


def step_table(spans: pl.DataFrame, *, with_start: bool = False) -> pl.DataFrame:
    """Spans frame -> one row per (rank, step) (``STEP_COLUMNS``), sorted: step time, its split by
    phase, wall time, spans entered and spans never exited.  ``with_start``: with ``start_ns``
    too, the step's first span's start, after ``step`` (the rows the ``steps`` view keeps:
    ``STORED_STEP_COLUMNS``)."""
    if spans.height == 0:  # the step time of no group cannot be typed: the table of one null row, emptied
        return step_table(spans.clear(n=1), with_start=with_start).clear()
    per_step = spans.group_by("rank", "step").agg(step_time().cast(pl.Int64).alias("step_ns"), *step_sums())
    return with_wall(per_step.sort("rank", "step"), with_start=with_start)


def step_sums() -> list[pl.Expr]:
    """Aggregations over a (rank, step)'s spans, besides its step time, that ``with_wall`` makes
    the rest of its row from: each is a sum, a min (``_start``) or a max (``_last``), so the
    values of parts of a step's spans make the step's (``analysis.step_fold``)."""
    last = pl.max_horizontal(pl.col("end_ns").max(), pl.col("start_ns").max())
    return [
        *(_phase_time(*phases).cast(pl.Int64).alias(column) for column, phases in _PHASE_COLUMNS.items()),
        pl.col("start_ns").min().alias("_start"),
        last.alias("_last"),
        pl.len().alias("spans"),
        pl.col("end_ns").is_null().sum().alias("unclosed"),
    ]


def merged_step_sums() -> list[pl.Expr]:
    """Aggregations over ``step_sums``' rows of parts of a (rank, step)'s spans: the step's."""
    names = [e.meta.output_name() for e in step_sums()]
    return [pl.col("_start").min(), pl.col("_last").max(),
            *(pl.col(n).sum() for n in names if n not in ("_start", "_last"))]


def with_wall(per_step: pl.DataFrame, *, with_start: bool = False) -> pl.DataFrame:
    """Per (rank, step) rows sorted by them, with ``step_ns`` and ``step_sums``' columns -> the step
    table (``STEP_COLUMNS``, or ``STORED_STEP_COLUMNS`` under ``with_start``): each step's wall time."""
    # The next step's start ends this one only when it is the next step: a schedule's recorded
    # steps come in windows, and the steps between them were not recorded.  A step still
    # running when the next starts (threads) ends at its own last end.
    nxt = pl.when(pl.col("step").shift(-1).over("rank") == pl.col("step") + 1).then(pl.col("_start").shift(-1).over("rank"))
    wall = pl.max_horizontal(pl.coalesce(nxt, pl.col("_last")), pl.col("_last")) - pl.col("_start")
    columns = STORED_STEP_COLUMNS if with_start else STEP_COLUMNS
    return per_step.with_columns(wall.alias("wall_ns"), pl.col("_start").alias("start_ns")).select(columns)


def total_step_time(spans: pl.DataFrame) -> int:
    """The summed step time of every (rank, step) in ``spans``."""
    # Only closed root spans make step time (``step_time``): the rest are left out before the
    # grouping, which then runs over a few rows per step instead of every span.
    roots = spans.filter((pl.col("depth") == 0) & pl.col("duration_ns").is_not_null())
    if roots.height == 0:
        return 0
    per_step = roots.group_by("rank", "step").agg(step_time().alias("_t"))
    return int(per_step["_t"].sum() or 0)
