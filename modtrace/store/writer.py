"""Batched writes of one rank's events and names.

The recorder hands over plain tuples; this module writes them with one
``executemany`` per table per flush, inside one transaction.  Lookup rows
(modules, threads, devices) go first, so ``event_log`` never shows an event
whose names are missing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from modtrace.store.engine import Store

# Order of the values in an event tuple, as the recorder builds it.
EVENT_COLUMNS: tuple[str, ...] = (
    "seq", "ts_ns", "kind", "module_id", "phase", "call_id", "step",
    "thread_id", "device_id", "stream", "status", "graph_task", "tie",
)
MODULE_COLUMNS: tuple[str, ...] = ("module_id", "fqn", "module_type", "parent_module_id")
THREAD_COLUMNS: tuple[str, ...] = ("thread_id", "ident", "name")
DEVICE_COLUMNS: tuple[str, ...] = ("device_id", "name")


def _insert_sql(table: str, columns: Sequence[str], run_id: int, rank: int, paramstyle: str) -> str:
    # run_id and rank are integers we own; inlining them lets the hot path's
    # tuples go to executemany as they are, with no per-row rebuilding.
    marks = ", ".join("?" if paramstyle == "qmark" else "%s" for _ in columns)
    cols = ", ".join(columns)
    return f"INSERT INTO {table} (run_id, rank, {cols}) VALUES ({int(run_id)}, {int(rank)}, {marks})"


class RankWriter:
    """Writes the events of one (run, rank) to the store."""

    def __init__(self, store: Store, run_id: int, rank: int) -> None:
        self.store = store
        self.run_id = run_id
        self.rank = rank
        style = store.engine.dialect.paramstyle
        self._sql = {
            "events": _insert_sql("events", EVENT_COLUMNS, run_id, rank, style),
            "modules": _insert_sql("modules", MODULE_COLUMNS, run_id, rank, style),
            "threads": _insert_sql("threads", THREAD_COLUMNS, run_id, rank, style),
            "devices": _insert_sql("devices", DEVICE_COLUMNS, run_id, rank, style),
        }

    def write(
        self,
        events: Sequence[tuple[Any, ...]],
        modules: Sequence[tuple[Any, ...]] = (),
        threads: Sequence[tuple[Any, ...]] = (),
        devices: Sequence[tuple[Any, ...]] = (),
        progress: tuple[int, int] | None = None,
    ) -> None:
        """Write one batch in one transaction; ``progress`` is (event_count, step_count)."""
        with self.store.engine.begin() as conn:
            self._many(conn, "modules", modules)
            self._many(conn, "threads", threads)
            self._many(conn, "devices", devices)
            self._many(conn, "events", events)
            if progress is not None:
                conn.exec_driver_sql(
                    "UPDATE run_ranks SET event_count = "
                    + ("?" if self.store.engine.dialect.paramstyle == "qmark" else "%s")
                    + ", step_count = "
                    + ("?" if self.store.engine.dialect.paramstyle == "qmark" else "%s")
                    + f" WHERE run_id = {int(self.run_id)} AND rank = {int(self.rank)}",
                    (int(progress[0]), int(progress[1])),
                )

    def _many(self, conn: Connection, table: str, rows: Sequence[tuple[Any, ...]]) -> None:
        if not rows:
            return
        if not isinstance(rows, list):
            rows = list(rows)
        conn.exec_driver_sql(self._sql[table], rows)
