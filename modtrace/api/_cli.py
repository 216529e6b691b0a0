"""What the command line needs beyond the public ``Database``: the reads ``runs``, ``show``,
``tree``, ``export`` and ``report`` render, in the shapes their renderers take.

These are not the product (``Database`` is); they take an open ``Database`` and may change
with the CLI.  Scripts should use ``Database``'s members.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from modtrace.api._runs import run_filter as run_filter

if TYPE_CHECKING:
    import polars as pl

    from modtrace.analysis import Analysis
    from modtrace.analysis.diff import DiffResult
    from modtrace.api import Database, RunLike
    from modtrace.api._steps import Stepped
    from modtrace.store.runs import RunFilter


def run_list(db: Database, limit: int | None = None, which: RunFilter | None = None) -> list[dict[str, Any]]:
    """Runs newest first, as dicts (``Database.runs``' columns and the rest ``show`` prints);
    only those ``which`` takes (``run_filter``)."""
    return db._run_rows(limit, which)


def details(db: Database, run: RunLike) -> dict[str, Any]:
    """The run's metadata, status and counts, as ``modtrace show`` prints them."""
    return dict(db.run(run).details)


def anchors(db: Database, run: RunLike) -> dict[int, int]:
    """rank -> wall-clock nanoseconds at that rank's ``ts_ns = 0``."""
    return db._anchors(db._ref(run))


def thread_names(db: Database, run: RunLike) -> dict[tuple[int, int], str | None]:
    """(rank, thread_id) -> thread name."""
    return db._thread_names(db._ref(run))


def event_log(db: Database, run: RunLike) -> Iterator[pl.DataFrame]:
    """The run's events with names instead of codes and ``wall_ns``, in chunks, rank by rank in
    seq order (an export streams them)."""
    return db._event_log(db._ref(run))


def analysis(db: Database, run: RunLike) -> Analysis:
    """The run's spans and issues, stored or computed, kept for ``db``."""
    return db._analysis(db._ref(run))


def has_analysis(db: Database, run: RunLike) -> bool:
    """Whether the run's spans and issues are stored."""
    return db._has_analysis(db._ref(run))


def start_spans_with(db: Database, run: RunLike, columns: tuple[str, ...]) -> Callable[[], pl.DataFrame]:
    """The run's spans with at least ``columns`` filled, begun now (a stored analysis is read
    while the caller does other work); calling the result gives the frame."""
    return db._start_spans(db._ref(run), columns)


def clock(db: Database, run: RunLike, chosen: str | None) -> str:
    """The clock the run's times are read on (``Database.spans``' ``clock``)."""
    return db._clock(db._ref(run), chosen)


def is_history(base: str) -> bool:
    """Whether a base reference is a history (``tag:KEY=VALUE`` selectors, checked: a malformed
    one is a ``UsageError``) rather than a run."""
    from modtrace.api._diff import parse_selector

    return parse_selector([base]) is not None


def diff_clock(db: Database, base: RunLike, cand: RunLike, chosen: str | None) -> str:
    """The one clock both sides of a comparison are read on (``Database.diff``'s ``clock``)."""
    return db._diff_clock(base, cand, db, chosen)


def restep(db: Database, run: RunLike, frame: pl.DataFrame, step_on: str | None) -> Stepped:
    """``frame`` (rows of the run with ``rank``, ``span_id``, ``step``) with its steps under
    ``step_on`` and each step's kind."""
    return db._restep(db._ref(run), frame, step_on)


def tree_rows(db: Database, run: RunLike, **options: Any) -> list[dict[str, Any]]:
    """``Database.tree`` as plain dicts in pre-order (what the tree renderers take); a stored
    tree is read and filtered without polars."""
    from modtrace.api._tree import TreeOptions

    opts = TreeOptions(options.get("phase"), options.get("step"), options.get("rank"), options.get("max_depth"),
                       options.get("min_percent"), options.get("step_on"), options.get("step_kind"),
                       options.get("peak_tflops"))
    return db._tree_rows(run, opts, options.get("clock"))


def diff_spans(base_spans: pl.DataFrame, cand_spans: pl.DataFrame) -> DiffResult:
    """Compare two spans frames (the report's comparison of two runs' steps of one kind)."""
    from modtrace.analysis.diff import diff_spans as compare

    return compare(base_spans, cand_spans)


def like_with_like(runs: list[tuple[str, Stepped]], kind: str | None) -> tuple[list[pl.DataFrame], str | None]:
    """The frames of ``restep`` results to compare: the steps of ``kind`` in each named run."""
    from modtrace.api._steps import like_with_like as pick

    return pick(runs, kind)


def step_table(spans: pl.DataFrame) -> pl.DataFrame:
    """One row per (rank, step) of a spans frame (``analysis.step_time``)."""
    from modtrace.analysis.step_time import step_table as table

    return table(spans)


def is_database_file(path: str, db: str | None) -> bool:
    """Whether ``path`` is the SQLite database ``db`` names or one of SQLite's files beside it
    (``-wal``, ``-shm``, ``-journal``): a file only SQLite may open, let alone replace."""
    import os
    from pathlib import Path

    from modtrace.store.engine import sqlite_files

    target = Path(path).expanduser().absolute()
    for file in sqlite_files(db):
        if target == file or (target.exists() and file.exists() and os.path.samefile(target, file)):
            return True
    return False
