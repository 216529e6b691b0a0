"""The API's module-level functions: imports to do early, and the steps of a
diff the CLI runs in two threads (``modtrace diff`` reads both sides at once).
Re-exported by ``modtrace.api``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

    from modtrace.analysis.diff import DiffOptions, DiffResult, RunCalls
    from modtrace.api._steps import Stepped


def preload_store() -> None:
    """Import the store's engine (before threads that would all import it at once)."""
    import modtrace.store.engine  # noqa: F401


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


def preload_diff() -> None:
    """Import what a diff needs (while other threads read the runs)."""
    from modtrace.api._diff import preload

    preload()


def diff_calls(base: RunCalls, cand: RunCalls, options: DiffOptions | None = None) -> DiffResult:
    """Compare two sides read by ``Database.diff_side`` (possibly from two databases, in two threads)."""
    from modtrace.analysis.diff import diff_runs

    return diff_runs(base, cand, options)


def like_with_like(runs: Sequence[tuple[str, Stepped]], kind: str | None) -> tuple[list[pl.DataFrame], str | None]:
    """The frames of ``Database.steps`` results to compare: the steps of ``kind`` in each (named) run;
    None: the kind most steps share when they have more than one; ``all``: every step.  Also the kind
    compared (None for all)."""
    from modtrace.api._steps import like_with_like as pick

    return pick(runs, kind)


def like_with_like_calls(
    base: tuple[RunCalls, dict[str, Any]], cand: tuple[RunCalls, dict[str, Any]], kind: str | None
) -> tuple[RunCalls, RunCalls]:
    """Two ``Database.diff_side`` results kept to steps of one kind (as ``like_with_like``);
    their descriptions get each run's step rule and kinds."""
    from modtrace.api._diff import like_with_like as pick

    return pick(base, cand, kind)


def no_common_step(base: dict[str, Any], cand: dict[str, Any]) -> str | None:
    """For two ``Database.diff_side`` descriptions: one line when the runs' schedules recorded no
    step in common, else None."""
    from modtrace.api._diff import no_common_step as check

    return check(base, cand)


def step_table(spans: pl.DataFrame) -> pl.DataFrame:
    """One row per (rank, step) of a spans frame: step time, its split by phase, wall time,
    spans and unclosed spans (``modtrace.analysis.step_time``; docs/schema.md)."""
    from modtrace.analysis.step_time import step_table as table

    return table(spans)
