"""Stored analysis results: a run's spans and nesting issues.

``write_analysis`` replaces a run's (or one rank's) rows in ``span_rows``
and ``nesting_issues`` in one transaction, so a rebuild is idempotent and a
reader never sees half of one; ``write_analysis_rounds`` does the same for
results that arrive in parts.  ``read_span_rows`` and ``read_issues`` return
them in their contracts (``modtrace.contracts.SPAN_ROW`` and ``ISSUE_FRAME``);
naming the spans is the analysis' job, done by ``modtrace.materialize``.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain
from typing import Any

import polars as pl
from sqlalchemy import Connection

from modtrace.contracts import ISSUE_FRAME, ISSUE_ROW, SPAN_ROW, SPAN_STORED_ROW
from modtrace.store.device_store import replace_span_device_rows
from modtrace.store.engine import Store
from modtrace.store.reader import copy_csv, driver_cursor, mark, sqlite_csv_chunks

SPAN_ROW_COLUMNS = SPAN_ROW.names
SPAN_STORED_COLUMNS = SPAN_STORED_ROW.names
ISSUE_COLUMNS = ISSUE_ROW.names

# SQLite: rows per INSERT statement, their values in one flat parameter list
# (one Python tuple per statement, not per row: half the binding work).
ROWS_PER_INSERT = 256


def _flat(frame: pl.DataFrame) -> list[Any]:
    """The frame's values row after row, in one list (a C-level zip of its columns)."""
    return list(chain.from_iterable(zip(*(frame[c].to_list() for c in frame.columns), strict=True)))


def _insert_sqlite(conn: Connection, table: str, frame: pl.DataFrame) -> None:
    width = frame.width
    row = f"({', '.join('?' for _ in range(width))})"
    head = f"INSERT INTO {table} ({', '.join(frame.columns)}) VALUES "
    whole = frame.height - frame.height % ROWS_PER_INSERT
    values = _flat(frame.head(whole))
    step = ROWS_PER_INSERT * width
    cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]  # this transaction's connection
    try:
        if whole:
            cur.executemany(head + ", ".join([row] * ROWS_PER_INSERT), [values[i:i + step] for i in range(0, len(values), step)])
        if whole < frame.height:
            cur.executemany(head + row, frame.slice(whole).rows())
    finally:
        cur.close()


def _insert_pg(conn: Connection, table: str, frame: pl.DataFrame) -> None:
    """PostgreSQL: one COPY of the frame as CSV (an unquoted empty field is NULL)."""
    driver = conn.connection.driver_connection
    assert driver is not None
    data = frame.write_csv(include_header=False).encode()
    with driver.cursor() as cur, cur.copy(f"COPY {table} ({', '.join(frame.columns)}) FROM STDIN (FORMAT csv)") as copy:
        copy.write(data)


def _insert(conn: Connection, store: Store, table: str, frame: pl.DataFrame) -> None:
    if frame.height == 0:
        return
    if store.dialect == "postgresql":
        _insert_pg(conn, table, frame)
    else:
        _insert_sqlite(conn, table, frame)


def stored_span_rows(spans: pl.DataFrame) -> pl.DataFrame:
    """A spans frame or span rows -> stored span rows (phase and status as their codes, no end_ns)."""
    codes = [pl.col(c).to_physical().cast(pl.Int16) if spans.schema[c] == pl.Enum else pl.col(c) for c in ("phase", "status")]
    gaps = [(pl.col("span_id") - pl.col("parent_span_id")).alias("parent_gap"),
            (pl.col("exit_seq") - pl.col("span_id")).alias("exit_gap")]
    rows = spans.with_columns(*codes, *gaps).select(SPAN_STORED_COLUMNS)
    # In primary-key order, each insert lands at the end of the table's B-tree.
    return rows if rows.select(pl.struct("rank", "span_id").is_sorted()).item() else rows.sort("rank", "span_id")


def _issue_rows(issues: pl.DataFrame) -> pl.DataFrame:
    return issues.with_columns(pl.col("phase").cast(pl.String)).select(ISSUE_COLUMNS)


def write_analysis(
    store: Store, run_id: int, spans: pl.DataFrame, issues: pl.DataFrame, *, rank: int | None = None
) -> None:
    """Replace the run's stored spans and issues (only ``rank``'s when given) with these frames.

    ``spans``: a spans frame (``SPAN_FRAME``) or span rows (``SPAN_ROW``);
    ``issues``: an issues frame (``ISSUE_FRAME``)."""
    write_analysis_rounds(store, run_id, [(spans, issues, None)], rank=rank)


def write_analysis_rounds(
    store: Store, run_id: int, parts: Iterable[tuple[pl.DataFrame, pl.DataFrame, int | None]], *,
    rank: int | None = None,
) -> None:
    """``write_analysis`` for results that come in parts, each written as it arrives, all
    of them in one transaction: (spans, issues, clear) triples, where ``clear`` names a
    rank whose rows written so far this part replaces (None: it adds to them)."""
    where = f"run_id = {int(run_id)}" + ("" if rank is None else f" AND rank = {int(rank)}")
    device: list[pl.DataFrame] = []  # spans with device columns (a run with device times)
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM span_rows WHERE {where}")
        conn.exec_driver_sql(f"DELETE FROM nesting_issues WHERE {where}")
        conn.exec_driver_sql(f"DELETE FROM tree_nodes WHERE run_id = {int(run_id)}")  # the whole run's tree (store.tree_store)
        for spans, issues, clear in parts:
            if clear is not None:
                for table in ("span_rows", "nesting_issues"):
                    conn.exec_driver_sql(f"DELETE FROM {table} WHERE run_id = {int(run_id)} AND rank = {int(clear)}")
                device = [f.filter(pl.col("rank") != clear) for f in device]
            _insert(conn, store, "span_rows", stored_span_rows(spans))
            _insert(conn, store, "nesting_issues", _issue_rows(issues))
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


_DERIVED = {
    "end_ns": "start_ns + duration_ns", "parent_span_id": "span_id - parent_gap", "exit_seq": "span_id + exit_gap",
}


def _stored(column: str) -> str:
    """The SQL reading ``column`` of a span row from span_rows' compact form."""
    return _DERIVED.get(column, column)


def read_span_rows(
    store: Store, run_id: int, *, columns: tuple[str, ...] = SPAN_ROW_COLUMNS, rank: int | None = None
) -> pl.DataFrame:
    """The run's stored span rows (one rank's when given); only ``columns``, the others null.

    SQLite formats each chunk as CSV text and PostgreSQL COPYs it out; polars
    parses either (no Python tuple per row)."""
    span_row_schema = SPAN_ROW.polars()
    columns = tuple(c for c in SPAN_ROW_COLUMNS if c in columns)
    schema = {c: span_row_schema[c] for c in columns}
    where = f"run_id = {int(run_id)}" + ("" if rank is None else f" AND rank = {int(rank)}")
    if store.dialect == "postgresql":
        exprs = ", ".join(f"{_stored(c)} AS {c}" for c in columns)
        data = copy_csv(store, f"SELECT {exprs} FROM span_rows WHERE {where} ORDER BY rank, span_id")
        frame = (pl.read_csv(data, has_header=False, new_columns=list(columns), schema=schema) if data
                 else pl.DataFrame(schema=schema))
    else:
        ordered = [c for c in ("rank", "span_id") if c not in columns]
        fetched = (*columns, *ordered)
        fetched_schema = {c: span_row_schema[c] for c in fetched}
        parts = list(sqlite_csv_chunks(store, "span_rows", [_stored(c) for c in fetched], list(fetched),
                                       ("rank", "span_id"), where, fetched_schema))
        frame = pl.concat(parts).select(columns) if parts else pl.DataFrame(schema=schema)
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
