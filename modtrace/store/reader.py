"""Reads of a run's rows as polars frames, with explicit dtypes.

Events come back in the analysis input contract
(``modtrace.analysis.events.EVENT_SCHEMA``), by rank and seq, fetched in
chunks through the driver's cursor (a server-side cursor on PostgreSQL), so
memory holds the frame and one chunk of Python rows at most.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import polars as pl

from modtrace.analysis.events import DEVICE_SCHEMA, EVENT_SCHEMA, MODULE_SCHEMA, empty_events
from modtrace.store.engine import Store

CHUNK_ROWS = 200_000

# Columns fetched per event; run_id and rank are constant per query and added after.
_FETCHED = [c for c in EVENT_SCHEMA if c not in ("run_id", "rank")]
_FETCHED_SCHEMA = {c: EVENT_SCHEMA[c] for c in _FETCHED}


@contextmanager
def _cursor(store: Store, name: str) -> Iterator[Any]:
    """A DBAPI cursor; server-side on PostgreSQL so rows stream in chunks."""
    raw = store.engine.raw_connection()
    try:
        driver = raw.driver_connection
        assert driver is not None
        if store.dialect == "postgresql":
            cur = driver.cursor(name=name)
        else:
            cur = driver.cursor()
        try:
            yield cur
        finally:
            cur.close()
            raw.rollback()
    finally:
        raw.close()


def _mark(store: Store) -> str:
    return "?" if store.engine.dialect.paramstyle == "qmark" else "%s"


def read_ranks(store: Store, run_id: int) -> list[int]:
    """Ranks that wrote events or lookups for the run, ascending."""
    m = _mark(store)
    with _cursor(store, "modtrace_ranks") as cur:
        cur.execute(
            f"SELECT rank FROM run_ranks WHERE run_id = {m} UNION SELECT DISTINCT rank FROM modules WHERE run_id = {m}",
            (run_id, run_id),
        )
        return sorted(int(r[0]) for r in cur.fetchall())


def iter_event_chunks(
    store: Store, run_id: int, rank: int, *, chunk_rows: int = CHUNK_ROWS
) -> Iterator[pl.DataFrame]:
    """One rank's events by seq, as event frames of at most ``chunk_rows`` rows."""
    m = _mark(store)
    sql = f"SELECT {', '.join(_FETCHED)} FROM events WHERE run_id = {m} AND rank = {m} ORDER BY seq"
    with _cursor(store, "modtrace_events") as cur:
        cur.execute(sql, (run_id, rank))
        while True:
            rows = cur.fetchmany(chunk_rows)
            if not rows:
                break
            frame = pl.DataFrame(rows, schema=_FETCHED_SCHEMA, orient="row")
            yield frame.select(
                pl.lit(run_id, dtype=pl.Int32).alias("run_id"),
                pl.lit(rank, dtype=pl.Int32).alias("rank"),
                *_FETCHED,
            )


def read_events(
    store: Store, run_id: int, *, ranks: list[int] | None = None, chunk_rows: int = CHUNK_ROWS
) -> pl.DataFrame:
    """A run's events (all ranks, or ``ranks``) as one event frame sorted by (rank, seq)."""
    if ranks is None:
        ranks = read_ranks(store, run_id)
    parts = [chunk for rank in ranks for chunk in iter_event_chunks(store, run_id, rank, chunk_rows=chunk_rows)]
    if not parts:
        return empty_events()
    return pl.concat(parts, rechunk=True)


def _read_table(store: Store, sql: str, params: tuple[Any, ...], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    with _cursor(store, "modtrace_lookup") as cur:
        cur.execute(sql, params)
        rows = cur.fetchall()
    return pl.DataFrame(rows, schema=schema, orient="row")


def _rank_filter(store: Store, ranks: list[int] | None) -> str:
    if ranks is None:
        return ""
    return f" AND rank IN ({', '.join(str(int(r)) for r in ranks)})" if ranks else " AND 1 = 0"


def read_modules(store: Store, run_id: int, *, ranks: list[int] | None = None) -> pl.DataFrame:
    """The run's module frame (``MODULE_SCHEMA``)."""
    m = _mark(store)
    sql = (
        "SELECT rank, module_id, fqn, module_type, parent_module_id FROM modules "
        f"WHERE run_id = {m}{_rank_filter(store, ranks)} ORDER BY rank, module_id"
    )
    return _read_table(store, sql, (run_id,), MODULE_SCHEMA)


def read_devices(store: Store, run_id: int, *, ranks: list[int] | None = None) -> pl.DataFrame:
    """The run's device frame (``DEVICE_SCHEMA``)."""
    m = _mark(store)
    sql = f"SELECT rank, device_id, name FROM devices WHERE run_id = {m}{_rank_filter(store, ranks)} ORDER BY rank, device_id"
    return _read_table(store, sql, (run_id,), DEVICE_SCHEMA)


def read_run_status(store: Store, run_id: int, rank: int | None = None) -> str:
    """The run's status (or one rank's): running | completed | failed | interrupted."""
    m = _mark(store)
    with _cursor(store, "modtrace_status") as cur:
        if rank is None:
            cur.execute(f"SELECT status FROM runs WHERE id = {m}", (run_id,))
        else:
            cur.execute(f"SELECT status FROM run_ranks WHERE run_id = {m} AND rank = {m}", (run_id, rank))
        row = cur.fetchone()
    return str(row[0]) if row else "running"
