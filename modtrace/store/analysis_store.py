"""Stored analysis results: a run's spans and nesting issues.

``write_analysis`` replaces a run's (or one rank's) rows in ``span_rows``
and ``nesting_issues`` in one transaction, so a rebuild is idempotent and a
reader never sees half of one; ``write_analysis_rounds`` does the same for
results that arrive in parts.  ``read_span_rows`` and ``read_issues`` return
them in their contracts (``modtrace.contracts.SPAN_ROW`` and ``ISSUE_FRAME``);
naming the spans is the analysis' job, done by ``modtrace.materialize``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import polars as pl
from sqlalchemy import Connection

from modtrace.contracts import ISSUE_FRAME, ISSUE_ROW, SPAN_ROW
from modtrace.store.device_store import replace_span_device_rows
from modtrace.store.engine import Store
from modtrace.store.reader import driver_cursor, mark

SPAN_ROW_COLUMNS = SPAN_ROW.names
ISSUE_COLUMNS = ISSUE_ROW.names

BATCH_ROWS = 50_000


def _batches(frame: pl.DataFrame) -> Iterator[list[tuple[Any, ...]]]:
    for start in range(0, frame.height, BATCH_ROWS):
        yield frame.slice(start, BATCH_ROWS).rows()


def _insert(conn: Connection, store: Store, table: str, columns: tuple[str, ...], frame: pl.DataFrame) -> None:
    marks = ", ".join(mark(store) for _ in columns)
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})"
    for batch in _batches(frame):
        conn.exec_driver_sql(sql, batch)


def _span_rows(spans: pl.DataFrame) -> pl.DataFrame:
    """A spans frame or span rows -> span rows (phase and status as their codes)."""
    codes = [pl.col(c).to_physical().cast(pl.Int16) if spans.schema[c] == pl.Enum else pl.col(c) for c in ("phase", "status")]
    return spans.with_columns(codes).select(SPAN_ROW_COLUMNS)


def _issue_rows(issues: pl.DataFrame) -> pl.DataFrame:
    return issues.with_columns(pl.col("phase").cast(pl.String)).select(ISSUE_COLUMNS)


def write_analysis(
    store: Store, run_id: int, spans: pl.DataFrame, issues: pl.DataFrame, *, rank: int | None = None
) -> None:
    """Replace the run's stored spans and issues (only ``rank``'s when given) with these frames.

    ``spans``: a spans frame (``SPAN_FRAME``) or span rows (``SPAN_ROW``);
    ``issues``: an issues frame (``ISSUE_FRAME``)."""
    write_analysis_rounds(store, run_id, [(spans, issues)], rank=rank)


def write_analysis_rounds(
    store: Store, run_id: int, parts: Iterable[tuple[pl.DataFrame, pl.DataFrame]], *, rank: int | None = None
) -> None:
    """``write_analysis`` for results that come in parts: (spans, issues) pairs, each
    written as it arrives, all of them in one transaction."""
    where = f"run_id = {int(run_id)}" + ("" if rank is None else f" AND rank = {int(rank)}")
    device: list[pl.DataFrame] = []  # spans with device columns (a run with device times)
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM span_rows WHERE {where}")
        conn.exec_driver_sql(f"DELETE FROM nesting_issues WHERE {where}")
        for spans, issues in parts:
            _insert(conn, store, "span_rows", SPAN_ROW_COLUMNS, _span_rows(spans))
            _insert(conn, store, "nesting_issues", ISSUE_COLUMNS, _issue_rows(issues))
            if "device_start_ns" in spans.columns:
                device.append(spans)
        replace_span_device_rows(conn, store, run_id, rank, device)


def has_analysis(store: Store, run_id: int) -> bool:
    """Whether the run has stored spans or issues."""
    m = mark(store)
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
    m = mark(store)
    where = f"run_id = {m}" + ("" if rank is None else f" AND rank = {int(rank)}")
    sql = f"SELECT {', '.join(columns)} FROM span_rows WHERE {where} ORDER BY rank, span_id"
    span_row_schema = SPAN_ROW.polars()
    schema = {c: span_row_schema[c] for c in columns}
    parts = []
    with driver_cursor(store, "modtrace_spans") as cur:
        cur.execute(sql, (run_id,))
        while rows := cur.fetchmany(200_000):
            parts.append(pl.DataFrame(rows, schema=schema, orient="row"))
    frame = pl.concat(parts) if parts else pl.DataFrame(schema=schema)
    if len(columns) == len(SPAN_ROW_COLUMNS):
        return frame
    missing = [pl.lit(None, dtype=span_row_schema[c]).alias(c) for c in SPAN_ROW_COLUMNS if c not in columns]
    return frame.with_columns(missing).select(SPAN_ROW_COLUMNS)


def count_span_rows(store: Store, run_id: int) -> int:
    """How many spans the run has stored."""
    m = mark(store)
    with driver_cursor(store, "modtrace_count") as cur:
        cur.execute(f"SELECT count(*) FROM span_rows WHERE run_id = {m}", (run_id,))
        row = cur.fetchone()
    return int(row[0]) if row else 0


def read_issues(store: Store, run_id: int) -> pl.DataFrame:
    """The run's stored nesting issues as an issues frame (``ISSUE_FRAME``), by (rank, seq, kind)."""
    m = mark(store)
    sql = f"SELECT {', '.join(ISSUE_COLUMNS)} FROM nesting_issues WHERE run_id = {m} ORDER BY rank, seq, kind"
    with driver_cursor(store, "modtrace_issues") as cur:
        cur.execute(sql, (run_id,))
        rows = cur.fetchall()
    return pl.DataFrame(rows, schema=ISSUE_ROW.polars(), orient="row").cast(ISSUE_FRAME.polars())  # type: ignore[arg-type]
