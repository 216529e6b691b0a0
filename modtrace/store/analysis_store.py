"""Stored analysis results: a run's spans and nesting issues.

``write_analysis`` replaces a run's (or one rank's) rows in ``span_rows``
and ``nesting_issues`` in one transaction, so a rebuild is idempotent and a
reader never sees half of one.  ``read_analysis`` returns them as the
analysis frames, or None when the run was never analysed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import polars as pl
from sqlalchemy import Connection

from modtrace.analysis.events import PHASE_ENUM
from modtrace.analysis.nesting import ISSUE_COLUMNS, ISSUE_SCHEMA
from modtrace.analysis.spans import SPAN_ROW_COLUMNS, SPAN_ROW_SCHEMA, name_spans
from modtrace.store.engine import Store
from modtrace.store.reader import _mark, driver_cursor, read_devices, read_modules

BATCH_ROWS = 50_000


def _batches(frame: pl.DataFrame) -> Iterator[list[tuple[Any, ...]]]:
    for start in range(0, frame.height, BATCH_ROWS):
        yield frame.slice(start, BATCH_ROWS).rows()


def _insert(conn: Connection, store: Store, table: str, columns: tuple[str, ...], frame: pl.DataFrame) -> None:
    marks = ", ".join(_mark(store) for _ in columns)
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
    for batch in _batches(frame):
        conn.exec_driver_sql(sql, batch)


def write_analysis(
    store: Store, run_id: int, spans: pl.DataFrame, issues: pl.DataFrame, *, rank: int | None = None
) -> None:
    """Replace the run's stored spans and issues (only ``rank``'s when given) with these frames."""
    where = f"run_id = {int(run_id)}" + ("" if rank is None else f" AND rank = {int(rank)}")
    rows = spans.with_columns(
        pl.col("phase").to_physical().cast(pl.Int16),
        pl.col("status").to_physical().cast(pl.Int16),
    ).select(SPAN_ROW_COLUMNS)
    found = issues.with_columns(pl.col("phase").cast(pl.String)).select(ISSUE_COLUMNS)
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM span_rows WHERE {where}")
        conn.exec_driver_sql(f"DELETE FROM nesting_issues WHERE {where}")
        _insert(conn, store, "span_rows", SPAN_ROW_COLUMNS, rows)
        _insert(conn, store, "nesting_issues", ISSUE_COLUMNS, found)


def has_analysis(store: Store, run_id: int) -> bool:
    """Whether the run has stored spans or issues."""
    m = _mark(store)
    with driver_cursor(store, "modtrace_has") as cur:
        cur.execute(
            f"SELECT 1 FROM span_rows WHERE run_id = {m} UNION ALL SELECT 1 FROM nesting_issues WHERE run_id = {m}",
            (run_id, run_id),
        )
        return cur.fetchone() is not None


def read_span_rows(
    store: Store, run_id: int, *, columns: tuple[str, ...] = SPAN_ROW_COLUMNS, rank: int | None = None
) -> pl.DataFrame:
    """The run's stored span rows (one rank's when given); only ``columns``, the others null."""
    m = _mark(store)
    where = f"run_id = {m}" + ("" if rank is None else f" AND rank = {int(rank)}")
    sql = f"SELECT {', '.join(columns)} FROM span_rows WHERE {where} ORDER BY rank, span_id"
    schema = {c: SPAN_ROW_SCHEMA[c] for c in columns}
    parts = []
    with driver_cursor(store, "modtrace_spans") as cur:
        cur.execute(sql, (run_id,))
        while rows := cur.fetchmany(200_000):
            parts.append(pl.DataFrame(rows, schema=schema, orient="row"))
    frame = pl.concat(parts) if parts else pl.DataFrame(schema=schema)
    if len(columns) == len(SPAN_ROW_COLUMNS):
        return frame
    missing = [pl.lit(None, dtype=SPAN_ROW_SCHEMA[c]).alias(c) for c in SPAN_ROW_COLUMNS if c not in columns]
    return frame.with_columns(missing).select(SPAN_ROW_COLUMNS)


def read_issues(store: Store, run_id: int) -> pl.DataFrame:
    m = _mark(store)
    sql = f"SELECT {', '.join(ISSUE_COLUMNS)} FROM nesting_issues WHERE run_id = {m} ORDER BY rank, seq, kind"
    with driver_cursor(store, "modtrace_issues") as cur:
        cur.execute(sql, (run_id,))
        rows = cur.fetchall()
    schema = {**ISSUE_SCHEMA, "phase": pl.String()}
    return pl.DataFrame(rows, schema=schema, orient="row").with_columns(pl.col("phase").cast(PHASE_ENUM))


def read_analysis(store: Store, run_id: int) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    """(spans frame, issues frame) as stored, or None when the run has none stored."""
    if not has_analysis(store, run_id):
        return None
    spans = name_spans(read_span_rows(store, run_id), read_modules(store, run_id), read_devices(store, run_id))
    return spans, read_issues(store, run_id)
