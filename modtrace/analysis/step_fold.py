"""The step table folded round by round: ``step_table`` and ``step_starts`` of a rank's spans
without holding them to the end.

A rank analysed while it is recorded (``results.incremental``) closes its spans in rounds, and
a long run's end should not step every span again (at 10M events, stepping 5M spans took 1.7 s
of the user's wait).  ``StepFold.add`` takes each round's spans with ``_key`` (their step as
``analysis.steps.step_keys`` gives it, equal exactly where the whole run's steps are) and keeps
per (rank, key) what a step's row is made of (``step_time.step_sums``: sums, a min and a max,
which parts add up to), its closed root spans (step time is their union), and per (rank, thread,
key) the first and last span id.  ``StepFold.table`` merges them into the rows ``step_table`` and
``step_starts`` give for all the spans at once.

``step_starts`` needs each thread's spans in span order.  The keys of a thread's spans grow with
its span ids (a recorded step and a root call only advance), so a thread enters a step at the
first span of it; ``table`` checks that every thread's steps follow one another in span order
(each step's last span before the next one's first) and gives None where they do not.

Pure: frames in, frames out.
"""

from __future__ import annotations

import polars as pl

from modtrace.analysis.step_time import merged_step_sums, step_sums, step_time, with_wall

# What the fold reads of a round's spans (span rows as ``analysis.stream`` gives them, and ``_key``).
FOLD_COLUMNS = ("rank", "thread_id", "span_id", "step", "depth", "phase", "start_ns", "end_ns", "duration_ns",
                "self_ns", "_key")

# Parts kept before they are merged into one (each a few rows per step of a round).
MERGE = 32


class StepFold:
    """``step_table`` and ``step_starts`` of a rank's spans, given round by round."""

    def __init__(self) -> None:
        self._steps: list[pl.DataFrame] = []  # per (rank, _key): step_sums' columns
        self._threads: list[pl.DataFrame] = []  # per (rank, thread_id, _key): first and last span id
        self._roots: list[pl.DataFrame] = []  # closed root spans: what step time is made of
        self._dtype: pl.DataType | None = None  # the spans' step column's

    def add(self, spans: pl.DataFrame) -> None:
        """Fold in one round's spans (``FOLD_COLUMNS``)."""
        if spans.height == 0:
            return
        self._dtype = spans.schema["step"]
        self._steps.append(spans.group_by("rank", "_key").agg(*step_sums()))
        self._threads.append(spans.group_by("rank", "thread_id", "_key").agg(
            pl.col("span_id").min().alias("_first"), pl.col("span_id").max().alias("_last")))
        roots = spans.filter((pl.col("depth") == 0) & pl.col("duration_ns").is_not_null())
        if roots.height:
            self._roots.append(roots.select("rank", "_key", "depth", "start_ns", "duration_ns"))
        if len(self._steps) >= MERGE:
            self._steps = [_merge_steps(self._steps)]
            self._threads = [_merge_threads(self._threads)]

    def table(self, rule: str) -> tuple[pl.DataFrame, pl.DataFrame] | None:
        """(``step_table(..., with_start=True)``, ``step_starts``) of every span added, with the
        steps under ``rule`` (the one the keys were made under); None when nothing was added or
        a thread's steps interleave in span order (the caller steps the spans instead)."""
        if not self._steps or self._dtype is None:
            return None
        threads = _merge_threads(self._threads).sort("rank", "thread_id", "_key")
        if threads.get_column("_key").null_count():
            return None
        same = (pl.col("rank") == pl.col("rank").shift(1)) & (pl.col("thread_id") == pl.col("thread_id").shift(1))
        if threads.select((same & (pl.col("_first") <= pl.col("_last").shift(1))).any()).item():
            return None
        step = ((pl.col("_key").rank("dense").over("rank") - 1) if rule == "root" else pl.col("_key")).cast(self._dtype)
        per_step = _merge_steps(self._steps).with_columns(step.alias("step"))
        if self._roots:  # a step without a closed root span has no step time
            times = pl.concat(self._roots).group_by("rank", "_key").agg(step_time().cast(pl.Int64).alias("step_ns"))
            per_step = per_step.join(times, on=["rank", "_key"], how="left").with_columns(pl.col("step_ns").fill_null(0))
        else:
            per_step = per_step.with_columns(pl.lit(0, pl.Int64).alias("step_ns"))
        per_step = per_step.sort("rank", "step")
        steps = per_step.select("rank", "_key", "step")
        starts = (
            threads.join(steps, on=["rank", "_key"])
            .select(pl.col("rank").cast(pl.Int32), pl.col("thread_id").cast(pl.Int32),
                    pl.col("_first").cast(pl.Int64).alias("span_id"), pl.col("step").cast(pl.Int32))
            .sort("rank", "thread_id", "span_id")
            .with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int32).over("rank", "thread_id").alias("nth"))
        )
        return with_wall(per_step, with_start=True), starts


def _merge_steps(parts: list[pl.DataFrame]) -> pl.DataFrame:
    if len(parts) == 1:
        return parts[0]
    both = pl.concat(parts)
    return both.group_by("rank", "_key").agg(*merged_step_sums()).select(both.columns)


def _merge_threads(parts: list[pl.DataFrame]) -> pl.DataFrame:
    if len(parts) == 1:
        return parts[0]
    return pl.concat(parts).group_by("rank", "thread_id", "_key").agg(pl.col("_first").min(), pl.col("_last").max())
