"""Device times in the store: ``device_events`` (per event) and ``span_device_rows`` (per span).

The recorder writes ``device_events`` with its batches (``store.writer``);
this module reads them back as the analysis' device events frame
(``contracts.DEVICE_EVENT_FRAME``), says whether a run has any, and keeps a
run's per-span device columns (``contracts.SPAN_DEVICE_ROW``) in
``span_device_rows`` beside ``span_rows``: written only when the spans carry
device times, so a CPU run stores nothing more.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from modtrace.core.contracts import DEVICE_EVENT_FRAME, DEVICE_SPAN_COLUMNS, SPAN_DEVICE_ROW
from modtrace.store.base import Store
from modtrace.store.cursor import driver_cursor, mark

if TYPE_CHECKING:
    import polars as pl
    from sqlalchemy import Connection

SPAN_DEVICE_COLUMNS = SPAN_DEVICE_ROW.names
_BATCH_ROWS = 50_000


def _where(store: Store, ranks: list[int] | None) -> str:
    where = f"run_id = {mark(store)}"
    if ranks is not None:
        where += f" AND rank IN ({', '.join(str(int(r)) for r in ranks)})" if ranks else " AND 1 = 0"
    return where


def has_device_events(store: Store, run_id: int) -> bool:
    """Whether any event of the run has a device time (the run "has device time")."""
    with driver_cursor(store) as cur:
        cur.execute(f"SELECT 1 FROM device_events WHERE run_id = {mark(store)} AND device_ts_ns IS NOT NULL LIMIT 1",
                    (run_id,))
        return cur.fetchone() is not None


def read_device_events(store: Store, run_id: int, *, ranks: list[int] | None = None) -> pl.DataFrame:
    """The run's device events (``DEVICE_EVENT_FRAME``), by rank and seq."""
    import polars as pl

    schema = DEVICE_EVENT_FRAME.polars()
    sql = (f"SELECT run_id, rank, seq, device_ts_ns, mem_bytes FROM device_events WHERE {_where(store, ranks)} "
           "ORDER BY rank, seq")
    parts = []
    with driver_cursor(store, "modtrace_device_events") as cur:
        cur.execute(sql, (run_id,))
        while rows := cur.fetchmany(200_000):
            parts.append(pl.DataFrame(rows, schema=schema, orient="row"))
    return pl.concat(parts) if parts else pl.DataFrame(schema=schema)


def replace_span_device_rows(conn: Connection, store: Store, run_id: int, rank: int | None,
                             spans: list[pl.DataFrame]) -> None:
    """In the caller's transaction: the run's (rank's) span device rows replaced
    by those of ``spans`` that have any device column set."""
    import polars as pl

    where = f"run_id = {int(run_id)}" + ("" if rank is None else f" AND rank = {int(rank)}")
    conn.exec_driver_sql(f"DELETE FROM span_device_rows WHERE {where}")
    marks = ", ".join(mark(store) for _ in SPAN_DEVICE_COLUMNS)
    sql = f"INSERT INTO span_device_rows ({', '.join(SPAN_DEVICE_COLUMNS)}) VALUES ({marks})"
    for frame in spans:
        if "device_start_ns" not in frame.columns:
            continue
        rows = frame.select(SPAN_DEVICE_COLUMNS).filter(pl.any_horizontal(pl.col(c).is_not_null()
                                                                          for c in DEVICE_SPAN_COLUMNS))
        for start in range(0, rows.height, _BATCH_ROWS):
            conn.exec_driver_sql(sql, rows.slice(start, _BATCH_ROWS).rows())


def write_span_device_rows(store: Store, run_id: int, rank: int, spans: pl.DataFrame) -> None:
    """Replace one rank's span device rows with those of ``spans``, in a transaction of their own."""
    with store.engine.begin() as conn:
        replace_span_device_rows(conn, store, run_id, rank, [spans])


def read_span_device_rows(store: Store, run_id: int) -> pl.DataFrame:
    """The run's stored span device rows (``SPAN_DEVICE_ROW``), by rank and span_id."""
    import polars as pl

    schema = SPAN_DEVICE_ROW.polars()
    sql = f"SELECT {', '.join(SPAN_DEVICE_COLUMNS)} FROM span_device_rows WHERE run_id = {mark(store)} ORDER BY rank, span_id"
    with driver_cursor(store, "modtrace_span_device") as cur:
        cur.execute(sql, (run_id,))
        rows = cur.fetchall()
    return pl.DataFrame(rows, schema=schema, orient="row")
