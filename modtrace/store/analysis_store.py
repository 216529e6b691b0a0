"""Stored analysis results: a run's spans and nesting issues (and its steps).

``write_analysis`` replaces a run's (or one rank's) rows in ``span_rows``
and ``nesting_issues`` in one transaction, so a rebuild is idempotent and a
reader never sees half of one (the transaction also sets ``runs.analysis``); ``write_analysis_rounds`` does the same for
results that arrive in parts.  ``read_span_rows`` and ``read_issues`` return
them in their contracts (``modtrace.core.contracts.SPAN_ROW`` and ``ISSUE_FRAME``);
naming the spans is the analysis' job, done by ``modtrace.results.materialize``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import chain
from typing import Any

import polars as pl
from sqlalchemy import Connection

from modtrace.core.contracts import (
    ISSUE_FRAME,
    ISSUE_ROW,
    SPAN_ROW,
    SPAN_STORED_AS,
    SPAN_STORED_ROW,
)
from modtrace.core.errors import StoreError
from modtrace.store.device_times import replace_span_device_rows
from modtrace.store.engine import Store
from modtrace.store.reader import copy_csv, driver_cursor, mark, sqlite_csv_chunks
from modtrace.store.runs import mark_analysis_stored

SPAN_ROW_COLUMNS = SPAN_ROW.names
SPAN_STORED_COLUMNS = SPAN_STORED_ROW.names
ISSUE_ROW_COLUMNS = ISSUE_ROW.names

# SQLite: rows per INSERT statement, their values in one flat parameter list
# (one Python tuple per statement, not per row: less binding work; docs/performance.md,
# "Span write").
ROWS_PER_INSERT = 256
# SQLite: the write transaction's page cache (negative: KiB), see ``_write_transaction``.
WRITE_CACHE_KIB = -65536


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


# A span's columns that are its enter event's (span_id is the enter's seq): span row column ->
# events column.  The analysis computes only the others (COMPUTED_COLUMNS).
ENTER_COLUMNS = {
    "module_id": "module_id", "phase": "phase", "call_id": "call_id", "step": "step", "thread_id": "thread_id",
    "graph_task": "graph_task", "start_ns": "ts_ns", "device_id": "device_id", "stream": "stream",
}
COMPUTED_COLUMNS = tuple(c for c in SPAN_STORED_COLUMNS if c not in ENTER_COLUMNS and c not in ("run_id", "rank"))


# The computed columns as bound, one value less: depth and status share one integer
# (depth * 1024 + status + 128; 1023 in the low bits: status NULL).  Polars packs, SQL unpacks.
_BOUND = (
    pl.col("span_id"),
    (pl.col("depth").cast(pl.Int64) * 1024 + (pl.col("status").cast(pl.Int64) + 128).fill_null(1023)).alias("_ds"),
    pl.col("duration_ns"), pl.col("self_ns"), pl.col("parent_gap"), pl.col("exit_gap"),
)
_UNBOUND = {
    "span_id": "v.column1", "depth": "v.column2 >> 10", "status": "nullif(v.column2 & 1023, 1023) - 128",
    "duration_ns": "v.column3", "self_ns": "v.column4", "parent_gap": "v.column5", "exit_gap": "v.column6",
}


def _insert_sqlite_joined(conn: Connection, run_id: int, frame: pl.DataFrame) -> None:
    """SQLite: ``frame``'s stored span rows, binding only what the analysis computed (6
    values of 18): the enter event's columns are read from ``events`` by the same
    statement (a primary-key seek per span, cheaper than binding them from Python).
    Every span must have its enter event in the store, else nothing is written."""
    width = len(_BOUND)
    row = f"({', '.join('?' for _ in range(width))})"
    columns = ", ".join(("run_id", "rank", *COMPUTED_COLUMNS, *ENTER_COLUMNS))
    values = ", ".join((*(_UNBOUND[c] for c in COMPUTED_COLUMNS), *(f"e.{c}" for c in ENTER_COLUMNS.values())))
    cur = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]  # this transaction's connection
    written = 0
    try:
        for part in frame.partition_by("rank", maintain_order=True):
            rank = int(part["rank"][0])

            def sql(rows: int, rank: int = rank) -> str:
                # CROSS JOIN: the VALUES drive the loop (SQLite keeps the join order as written).
                return (f"INSERT INTO span_rows ({columns}) SELECT {int(run_id)}, {rank}, {values} "
                        f"FROM (VALUES {', '.join([row] * rows)}) v CROSS JOIN events e "
                        f"ON e.run_id = {int(run_id)} AND e.rank = {rank} AND e.seq = v.column1")

            bound = part.select(_BOUND)
            whole = bound.height - bound.height % ROWS_PER_INSERT
            flat = _flat(bound.head(whole))
            step = ROWS_PER_INSERT * width
            if whole:
                cur.executemany(sql(ROWS_PER_INSERT), [flat[i:i + step] for i in range(0, len(flat), step)])
                written += cur.rowcount
            if whole < bound.height:
                cur.executemany(sql(1), bound.slice(whole).rows())
                written += cur.rowcount
    finally:
        cur.close()
    if written != frame.height:
        raise StoreError(f"run {run_id}: {frame.height - written} of {frame.height} spans have no enter event "
                         "in the store; nothing written")


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


def _insert_spans(conn: Connection, store: Store, run_id: int, rows: pl.DataFrame, from_events: bool) -> None:
    if from_events and rows.height and store.dialect == "sqlite":
        _insert_sqlite_joined(conn, run_id, rows)
    else:
        _insert(conn, store, "span_rows", rows)


@contextmanager
def _write_transaction(store: Store) -> Iterator[Connection]:
    """One transaction that replaces the run's analysis rows.

    SQLite: with foreign keys off for this connection (the pragma is a no-op
    inside a transaction, so around it) and the one key they would check,
    the run, checked once instead (``_check_run``): per row, a foreign key
    check made a DELETE of a run's spans several times slower and an INSERT
    slower too (span_rows has no foreign key since revision 0010; nesting_issues
    and span_device_rows keep theirs).  And with a page cache of
    ``WRITE_CACHE_KIB`` for the transaction: the B-trees of a run's spans
    outgrow SQLite's default 2 MiB, and pages spilled before the commit are
    written twice (docs/performance.md, "Span write")."""
    if store.dialect != "sqlite":
        with store.engine.begin() as conn:
            yield conn
        return
    with store.engine.connect() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        (cache,) = driver.execute("PRAGMA cache_size").fetchone()
        driver.execute("PRAGMA foreign_keys = OFF")
        driver.execute(f"PRAGMA cache_size = {WRITE_CACHE_KIB}")
        try:
            with conn.begin():
                yield conn
        finally:
            driver.execute("PRAGMA foreign_keys = ON")
            driver.execute(f"PRAGMA cache_size = {int(cache)}")


def _check_run(conn: Connection, run_id: int) -> None:
    """The foreign key check, once per transaction: the run is there, and stays until the
    commit (SQLite: this transaction holds the write lock; PostgreSQL: the row is locked
    against a DELETE, as a foreign key's own check locks it)."""
    lock = " FOR KEY SHARE" if conn.dialect.name == "postgresql" else ""
    if conn.exec_driver_sql(f"SELECT 1 FROM runs WHERE id = {int(run_id)}{lock}").first() is None:
        raise StoreError(f"run {run_id} no longer exists; nothing written")


def stored_span_rows(spans: pl.DataFrame) -> pl.DataFrame:
    """A spans frame or span rows -> stored span rows (phase and status as their codes, no end_ns)."""
    codes = [pl.col(c).to_physical().cast(pl.Int16) if spans.schema[c] == pl.Enum else pl.col(c) for c in ("phase", "status")]
    gaps = [d.encode() for d in SPAN_STORED_AS if d.stored not in SPAN_ROW_COLUMNS]
    rows = spans.with_columns(*codes, *gaps).select(SPAN_STORED_COLUMNS)
    # In primary-key order, each insert lands at the end of the table's B-tree.
    if rows.select(pl.struct("rank", "span_id").is_sorted()).item():
        return rows
    # The analysis' spans come in exit order.  (rank, span_id) as one integer where it fits:
    # a sort by one column costs about half of one by two (docs/performance.md, "Analysis").
    r0, r1, s0, s1 = rows.select(pl.col("rank").min().alias("r0"), pl.col("rank").max().alias("r1"),
                                 pl.col("span_id").min().alias("s0"), pl.col("span_id").max().alias("s1")).row(0)
    if None in (r0, s0) or (r1 - r0 + 1) * (s1 - s0 + 1) >= 1 << 62:
        return rows.sort("rank", "span_id")
    return rows.sort((pl.col("rank").cast(pl.Int64) - r0) * (s1 - s0 + 1) + (pl.col("span_id") - s0))


def _issue_rows(issues: pl.DataFrame) -> pl.DataFrame:
    return issues.with_columns(pl.col("phase").cast(pl.String)).select(ISSUE_ROW_COLUMNS)


def write_analysis(
    store: Store, run_id: int, spans: pl.DataFrame, issues: pl.DataFrame, *, rank: int | None = None
) -> None:
    """Replace the run's stored spans and issues (only ``rank``'s when given) with these frames.

    ``spans``: a spans frame (``SPAN_FRAME``) or span rows (``SPAN_ROW``);
    ``issues``: an issues frame (``ISSUE_FRAME``)."""
    write_analysis_rounds(store, run_id, [(spans, issues, None)], rank=rank)


def _journal_allows_overlap(mode: str) -> bool:
    return mode.lower() == "wal"


def writes_beside_reads(store: Store) -> bool:
    """Whether other connections may read the run's events while a write transaction is open
    (so that a run can be analysed in several rounds): PostgreSQL, and SQLite in WAL mode.  In rollback-journal mode a writer whose cache
    spills takes the exclusive lock until its commit, and a reader of the next part
    would wait on it while the commit waits on the reader."""
    if store.dialect != "sqlite":
        return True
    with driver_cursor(store) as cur:
        cur.execute("PRAGMA journal_mode")
        return _journal_allows_overlap(str(cur.fetchone()[0]))


# A run's (rank's) steps as ``write_analysis_rounds`` stores them, made once its spans are
# written: (step_rows, step_starts) frames with those tables' columns, or None for none.
StepsMaker = Callable[[Connection], "tuple[pl.DataFrame, pl.DataFrame] | None"]

# The span columns the step table and each span's step are computed from.
STEP_SPAN_COLUMNS = ("rank", "span_id", "step", "thread_id", "depth", "phase", "start_ns", "duration_ns", "self_ns")


def read_step_spans(conn: Connection, run_id: int, rank: int | None) -> pl.DataFrame:
    """The run's (``rank``'s) stored spans with ``STEP_SPAN_COLUMNS`` and ``end_ns``, read on
    ``conn``: inside the transaction that wrote them, which other connections do not see yet."""
    where = f"run_id = {int(run_id)}" + ("" if rank is None else f" AND rank = {int(rank)}")
    rows = conn.exec_driver_sql(
        f"SELECT {', '.join(STEP_SPAN_COLUMNS)} FROM span_rows WHERE {where} ORDER BY rank, span_id").fetchall()
    schema = {c: t for c, t in SPAN_ROW.polars().items() if c in STEP_SPAN_COLUMNS}
    frame = pl.DataFrame(rows, schema={c: schema[c] for c in STEP_SPAN_COLUMNS}, orient="row")
    return frame.with_columns((pl.col("start_ns") + pl.col("duration_ns")).alias("end_ns"))


def write_analysis_rounds(
    store: Store, run_id: int, parts: Iterable[tuple[pl.DataFrame, pl.DataFrame, int | None]], *,
    rank: int | None = None, from_events: bool = False, steps: StepsMaker | None = None, appended: bool = False,
    span_statistics: bool = True,
) -> None:
    """``write_analysis`` for results that come in parts, each written as it arrives, all
    of them in one transaction: (spans, issues, clear) triples, where ``clear`` names a
    rank whose rows written so far this part replaces (None: it adds to them).

    ``from_events``: the spans were computed from this run's events in this store, so
    their enter events' columns may be read from there rather than sent again.

    Each part is written as it comes, in this thread (writing beside the reads in a thread
    of its own did not pay end to end: docs/performance.md, "Concurrency: which threads pay").

    ``steps``, called on the transaction's connection once every part is written, makes
    the run's (rank's) rows of ``step_rows`` and ``step_starts``, stored in the same
    transaction: the ``steps`` and ``span_steps`` views never show steps of other spans
    than the stored ones.  Without it the run (rank) has none stored.

    ``appended``: the rank's spans and issues written so far (``append_analysis_round``, while
    it was recorded) are kept, and these parts add to them: the transaction completes them.

    ``span_statistics`` False: PostgreSQL's statistics of ``span_rows`` count most of these
    spans already (``refresh_statistics`` as they were appended), so only the other
    ``ANALYSED_TABLES`` are analysed after the commit."""
    where = f"run_id = {int(run_id)}" + ("" if rank is None else f" AND rank = {int(rank)}")
    device: list[pl.DataFrame] = []  # spans with device columns (a run with device times)
    with _write_transaction(store) as conn:

        def clear_old() -> None:
            if not appended:
                conn.exec_driver_sql(f"DELETE FROM span_rows WHERE {where}")
                conn.exec_driver_sql(f"DELETE FROM nesting_issues WHERE {where}")
            conn.exec_driver_sql(f"DELETE FROM step_rows WHERE {where}")
            conn.exec_driver_sql(f"DELETE FROM step_starts WHERE {where}")
            conn.exec_driver_sql(f"DELETE FROM tree_nodes WHERE run_id = {int(run_id)}")  # the whole run's tree (store.tree_table)
            _check_run(conn, run_id)

        def write(spans: pl.DataFrame, issues: pl.DataFrame, clear: int | None) -> None:
            if clear is not None:
                for table in ("span_rows", "nesting_issues"):
                    conn.exec_driver_sql(f"DELETE FROM {table} WHERE run_id = {int(run_id)} AND rank = {int(clear)}")
            _insert_spans(conn, store, run_id, stored_span_rows(spans), from_events)
            _insert(conn, store, "nesting_issues", _issue_rows(issues))

        clear_old()
        for spans, issues, clear in parts:
            if clear is not None:
                device = [f.filter(pl.col("rank") != clear) for f in device]
            if "device_start_ns" in spans.columns:
                device.append(spans)
            write(spans, issues, clear)
        made = steps(conn) if steps is not None else None
        if made is not None:
            _insert(conn, store, "step_rows", made[0])
            _insert(conn, store, "step_starts", made[1])
        replace_span_device_rows(conn, store, run_id, rank, device)
        mark_analysis_stored(conn, run_id, rank)  # runs.analysis, committed with the rows
    refresh_statistics(store, ANALYSED_TABLES if span_statistics else ANALYSED_TABLES[1:])


def append_analysis_round(store: Store, run_id: int, rank: int, spans: pl.DataFrame, issues: pl.DataFrame, *,
                          clear: bool = False) -> None:
    """One round of a rank analysed while it is recorded (``results.incremental``), committed on
    its own: its span rows (computed from this store's events) and issues added to the rank's
    (``clear``: in place of every row the rank has).  Nothing marks them stored: readers compute
    the run until ``write_analysis_rounds(..., appended=True)`` completes them."""
    with _write_transaction(store) as conn:
        if clear:
            for table in ("span_rows", "nesting_issues", "span_device_rows"):
                conn.exec_driver_sql(f"DELETE FROM {table} WHERE run_id = {int(run_id)} AND rank = {int(rank)}")
        _check_run(conn, run_id)
        _insert_spans(conn, store, run_id, stored_span_rows(spans), True)
        _insert(conn, store, "nesting_issues", _issue_rows(issues))


# PostgreSQL plans a query of a run's spans from the statistics of these tables; until they
# count the run's rows (autovacuum gets to them a minute later, if at all) it takes a run for a
# handful of rows and joins its spans to its modules by nested loops, quadratic in the spans.
ANALYSED_TABLES = ("span_rows", "modules", "step_rows", "step_starts")


def refresh_statistics(store: Store, tables: Sequence[str] = ANALYSED_TABLES) -> None:
    """PostgreSQL: the statistics of ``tables`` brought up to date, as once a run's analysis is
    committed (ANALYZE reads a bounded sample of each: 0.27 s for ``span_rows`` of 1M rows, the
    others a few ms).  SQLite plans without them."""
    if store.dialect != "postgresql" or not tables:
        return
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"ANALYZE {', '.join(tables)}")


def has_analysis(store: Store, run_id: int) -> bool:
    """Whether the run's whole analysis is stored (``runs.analysis = 'stored'``): the one test
    every reader of a run's analysis makes (``results.materialize``) before reading it from the
    store rather than computing it.  A run stored in part (``partial``: some ranks only) or
    before it recorded more (``stale``) is computed, so no reader sees a part of it."""
    m = mark(store)
    with driver_cursor(store, "modtrace_has") as cur:
        cur.execute(f"SELECT analysis FROM runs WHERE id = {m}", (run_id,))
        row = cur.fetchone()
        return row is not None and row[0] == "stored"


_DERIVED = {d.column: d.sql() for d in SPAN_STORED_AS}


def _stored(column: str) -> str:
    """The SQL reading ``column`` of a span row from span_rows' compact form."""
    return _DERIVED.get(column, column)


# Span id ranges ``read_span_rows`` reads by key; beyond this many it reads every span.
MAX_SPAN_RANGES = 64


def read_span_rows(
    store: Store, run_id: int, *, columns: tuple[str, ...] = SPAN_ROW_COLUMNS, rank: int | None = None,
    within: Sequence[tuple[int, int]] | None = None,
) -> pl.DataFrame:
    """The run's stored span rows (one rank's when given); only ``columns``, the others null.
    ``within``: (first, last) span id ranges (inclusive); the spans in them, where there are at
    most ``MAX_SPAN_RANGES`` (the counted steps of ``--counters first``), else every span.

    SQLite formats each chunk as CSV text and PostgreSQL COPYs it out; polars
    parses either (no Python tuple per row)."""
    span_row_schema = SPAN_ROW.polars()
    columns = tuple(c for c in SPAN_ROW_COLUMNS if c in columns)
    schema = {c: span_row_schema[c] for c in columns}
    where = f"run_id = {int(run_id)}" + ("" if rank is None else f" AND rank = {int(rank)}")
    if within is not None and len(within) <= MAX_SPAN_RANGES:
        where += " AND (" + (" OR ".join(f"span_id BETWEEN {int(a)} AND {int(b)}" for a, b in within) or "1 = 0") + ")"
    if store.dialect == "postgresql":
        exprs = ", ".join(f"{_stored(c)} AS {c}" for c in columns)
        data = copy_csv(store, f"SELECT {exprs} FROM span_rows WHERE {where} ORDER BY rank, span_id", key_order=True)
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
    sql = f"SELECT {', '.join(ISSUE_ROW_COLUMNS)} FROM nesting_issues WHERE run_id = {m} ORDER BY rank, seq, kind"
    with driver_cursor(store, "modtrace_issues") as cur:
        cur.execute(sql, (run_id,))
        rows = cur.fetchall()
    return pl.DataFrame(rows, schema=ISSUE_ROW.polars(), orient="row").cast(ISSUE_FRAME.polars())  # type: ignore[arg-type]
