"""Step time: the one definition every view of a step uses.

The *step time* of a (rank, step) is the time the step spent inside module
calls: the summed duration of its closed root spans (depth 0), every phase.
Self times partition the root spans, so the step time is also the sum of
the self times of all the step's closed spans, and it splits into phases by
self time: forward + backward + recompute = step time (recompute runs inside
backward spans and counts once, as recompute; a backward_call, a module
called by backward code, counts as backward).

A step's *wall* time runs from its first span's start to the next step's
first start on the same rank (so the optimizer step and data loading that
follow a step's backward are its own); the last step, and the last before a
step not recorded (a schedule's), ends at its last span's end (or start, for
a span never exited).  ``wall - step`` is the time
outside module calls.

``modtrace tree`` shows inclusive time as a percent of the step time,
``modtrace diff`` compares step times and shares of them, the HTML report's
per-step table and ``queries/step_breakdown.sql`` (like ``slowest_steps``
and ``rank_stragglers`` for the wall time) show both, with the phase split.
``docs/schema.md`` writes the same down for SQL users.
"""

from __future__ import annotations

import polars as pl

from modtrace.codes import Phase

STEP_COLUMNS: tuple[str, ...] = (
    "rank", "step", "step_ns", "forward_ns", "backward_ns", "recompute_ns", "wall_ns", "spans", "unclosed",
)


def step_time() -> pl.Expr:
    """Aggregation over a (rank, step)'s spans: its step time (summed root-span durations)."""
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


def step_table(spans: pl.DataFrame) -> pl.DataFrame:
    """Spans frame -> one row per (rank, step) (``STEP_COLUMNS``), sorted: step time, its split by
    phase, wall time, spans entered and spans never exited."""
    last = pl.max_horizontal(pl.col("end_ns").max(), pl.col("start_ns").max())
    per_step = (
        spans.group_by("rank", "step")
        .agg(
            step_time().cast(pl.Int64).alias("step_ns"),
            *(_phase_time(*phases).cast(pl.Int64).alias(column) for column, phases in _PHASE_COLUMNS.items()),
            pl.col("start_ns").min().alias("_start"),
            last.alias("_last"),
            pl.len().alias("spans"),
            pl.col("end_ns").is_null().sum().alias("unclosed"),
        )
        .sort("rank", "step")
    )
    # The next step's start ends this one only when it is the next step: a schedule's recorded
    # steps come in windows, and the steps between them were not recorded.
    nxt = pl.when(pl.col("step").shift(-1).over("rank") == pl.col("step") + 1).then(pl.col("_start").shift(-1).over("rank"))
    wall = pl.coalesce(nxt, pl.col("_last")) - pl.col("_start")
    return per_step.with_columns(wall.alias("wall_ns")).select(STEP_COLUMNS)


def total_step_time(spans: pl.DataFrame) -> int:
    """The summed step time of every (rank, step) in ``spans``."""
    return int(spans.select(step_time()).item() or 0)
