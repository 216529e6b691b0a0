"""Batched writes of one rank's events and names.

The recorder hands over a ``Batch`` of plain tuples (``modtrace.core.contracts``);
this module writes it inside one transaction, lookup rows (modules,
threads, devices) first, so ``event_log`` never shows an event whose names are missing.

Events go as multi-row ``INSERT ... VALUES (...), (...), ...`` statements of
``ROWS_PER_STATEMENT`` rows, executed with the driver's ``executemany`` over
the batch's tuples flattened: the same values bound, but the per-statement work of the
driver and the database (step, reset, program start) is paid once per 64
rows instead of once per row.  The writer keeps one connection for its whole
life; opening one per flush cost a connect and, on SQLite, a checkpoint of
the write-ahead log each time the last connection closed.

On SQLite that connection checks its foreign keys once a batch instead of
once a row: every row it writes names the same run (``run_id`` is written
into the statements), so one look for the run inside the batch's write
transaction, which no other writer can enter, answers for all of them, as
SQLite's own check would (the same ``IntegrityError``); the per-row check
was a measurable part of the writer's work (docs/performance.md, "Writer process and event
writes").  PostgreSQL checks
every row as before.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError, IntegrityError

from modtrace.core.contracts import (
    DEVICE_EVENT_ROW,
    DEVICE_ROW,
    EVENT_ROW,
    MODULE_ROW,
    ROOT_ROW,
    THREAD_ROW,
    Batch,
)
from modtrace.store.engine import Store

# Order of the values in the tuples the tracker builds (modtrace.core.contracts).
EVENT_COLUMNS: tuple[str, ...] = EVENT_ROW.names
MODULE_COLUMNS: tuple[str, ...] = MODULE_ROW.names
THREAD_COLUMNS: tuple[str, ...] = THREAD_ROW.names
DEVICE_COLUMNS: tuple[str, ...] = DEVICE_ROW.names
ROOT_COLUMNS: tuple[str, ...] = ROOT_ROW.names
DEVICE_EVENT_COLUMNS: tuple[str, ...] = DEVICE_EVENT_ROW.names

# Rows per multi-row statement: 64 x 13 = 832 bound values, under the 999
# that SQLite builds before 3.32 allow.
ROWS_PER_STATEMENT = 64

# Connections inherited by a forked child, kept referenced so the child never closes them.
_forked_away: list[Any] = []


def _insert_sql(table: str, columns: Sequence[str], run_id: int, rank: int, paramstyle: str, rows: int = 1) -> str:
    # run_id and rank are integers we own; inlining them lets the hot path's
    # tuples go to the driver as they are, with no per-row rebuilding.
    mark = "?" if paramstyle == "qmark" else "%s"
    one = f"({int(run_id)}, {int(rank)}, {', '.join(mark for _ in columns)})"
    return f"INSERT INTO {table} (run_id, rank, {', '.join(columns)}) VALUES {', '.join([one] * rows)}"


class RankWriter:
    """Writes the events of one (run, rank) to the store, over one connection
    kept until ``close()``.  Not thread-safe: the caller serialises writes."""

    def __init__(self, store: Store, run_id: int, rank: int) -> None:
        self.store = store
        self.run_id = run_id
        self.rank = rank
        style = store.engine.dialect.paramstyle
        self._mark = "?" if style == "qmark" else "%s"
        self._sql = {
            "events": _insert_sql("events", EVENT_COLUMNS, run_id, rank, style),
            "events_multi": _insert_sql("events", EVENT_COLUMNS, run_id, rank, style, ROWS_PER_STATEMENT),
            # a module row comes again once the module is seen running compiled: keep the last
            "modules": _insert_sql("modules", MODULE_COLUMNS, run_id, rank, style)
            + " ON CONFLICT (run_id, rank, module_id) DO UPDATE SET compiled = excluded.compiled",
            "threads": _insert_sql("threads", THREAD_COLUMNS, run_id, rank, style),
            "devices": _insert_sql("devices", DEVICE_COLUMNS, run_id, rank, style),
            "root_calls": _insert_sql("root_calls", ROOT_COLUMNS, run_id, rank, style),
            "device_events": _insert_sql("device_events", DEVICE_EVENT_COLUMNS, run_id, rank, style),
        }
        self._conn: Connection | None = None
        self._check_run_once = store.is_sqlite  # see the module docstring
        self._run_sql = f"SELECT 1 FROM runs WHERE id = {int(run_id)}"

    def write(self, batch: Batch, reconnects: int = 0) -> None:
        """Write one batch in one transaction; ``reconnects`` is added to the rank's count.

        On failure nothing of the batch is kept and the connection is dropped
        (the next write opens a new one)."""
        conn = self._connection()
        try:
            with conn.begin():
                self._many(conn, "modules", [m if len(m) == len(MODULE_COLUMNS) else (*m, 0) for m in batch.modules])
                self._many(conn, "threads", batch.threads)
                self._many(conn, "devices", batch.devices)
                self._events(conn, batch.events)
                self._many(conn, "root_calls", batch.roots)
                self._many(conn, "device_events", batch.device_rows)
                progress = batch.progress
                if progress is not None:
                    conn.exec_driver_sql(
                        f"UPDATE run_ranks SET event_count = {self._mark}, step_count = {self._mark}"
                        f" WHERE run_id = {int(self.run_id)} AND rank = {int(self.rank)}",
                        (int(progress[0]), int(progress[1])),
                    )
                if reconnects:
                    conn.exec_driver_sql(
                        f"UPDATE run_ranks SET reconnects = reconnects + {int(reconnects)}"
                        f" WHERE run_id = {int(self.run_id)} AND rank = {int(self.rank)}")
                if self._check_run_once and conn.exec_driver_sql(self._run_sql).scalar() is None:
                    raise IntegrityError(self._run_sql, None, _ForeignKeyError("FOREIGN KEY constraint failed"))
        except BaseException:
            self.close()
            raise

    def committed(self) -> int:
        """The rank's event count as committed (on this writer's connection)."""
        conn = self._connection()
        try:
            value = conn.exec_driver_sql(
                f"SELECT event_count FROM run_ranks WHERE run_id = {int(self.run_id)} AND rank = {int(self.rank)}"
            ).scalar()
            conn.rollback()  # end the read transaction: SQLite would keep its snapshot
        except BaseException:
            self.close()
            raise
        return int(value or 0)

    def forget(self) -> None:
        """In a process forked from the writer's: drop the connection without
        closing it (closing would end the parent's session)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            forget_connection(conn)

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                if self._check_run_once:  # as the engine made it, should a pool keep it
                    conn.exec_driver_sql("PRAGMA foreign_keys = ON")
                conn.close()
            except Exception:  # a broken connection is gone either way
                pass

    def _connection(self) -> Connection:
        conn = self._conn
        if conn is None:
            conn = self.store.engine.connect()
            if self._check_run_once:  # checked once a batch instead (see the module docstring)
                conn.exec_driver_sql("PRAGMA foreign_keys = OFF")  # outside a transaction: SQLite ignores it inside
                conn.commit()
            self._conn = conn
        return conn

    def _events(self, conn: Connection, rows: Sequence[tuple[Any, ...]]) -> None:
        k = ROWS_PER_STATEMENT
        full = len(rows) // k * k
        if full:
            # The driver's own cursor, in the transaction SQLAlchemy began: the
            # statements' values as one flat stream cut into k-row tuples by
            # zip, in C (no slice, no tuple built per row in Python, nothing
            # SQLAlchemy would redo per statement).
            flat = chain.from_iterable(rows if full == len(rows) else rows[:full])
            cursor = conn.connection.cursor()
            values: Any = zip(*[flat] * (k * len(EVENT_COLUMNS)), strict=True)  # the drivers take any iterable
            dbapi_error = conn.dialect.loaded_dbapi.Error
            try:
                cursor.executemany(self._sql["events_multi"], values)
            except dbapi_error as exc:  # as SQLAlchemy would have raised it
                raise DBAPIError.instance(self._sql["events_multi"], None, exc, dbapi_error,
                                          dialect=conn.dialect) from exc
            finally:
                cursor.close()
        if full < len(rows):
            self._many(conn, "events", rows[full:])

    def _many(self, conn: Connection, table: str, rows: Sequence[tuple[Any, ...]]) -> None:
        if not rows:
            return
        if not isinstance(rows, list):
            rows = list(rows)
        conn.exec_driver_sql(self._sql[table], rows)


class _ForeignKeyError(Exception):
    """What SQLite's own check raises, for the batch's one check (not transient: no retry)."""


def forget_connection(conn: Connection) -> None:
    """In a process forked from the one that opened ``conn``: drop it without
    closing it (closing would end the parent's session), the way SQLAlchemy
    documents for connections carried across a fork."""
    try:
        fairy: Any = conn.connection
        _forked_away.append(fairy.dbapi_connection)  # never finalised by this process
        if fairy._connection_record is not None:
            fairy._connection_record.dbapi_connection = None
        fairy.dbapi_connection = None
    except Exception:  # an invalidated connection holds nothing
        pass
    _forked_away.append(conn)
