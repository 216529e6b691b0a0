#!/usr/bin/env python3
"""Candidates for the analysis I/O, side by side (issue: fast enough to leave on).

Reading a run's events into a polars frame and writing its spans, on a real
SQLite file (and PostgreSQL with ``--pg URL``), each candidate timed in
interleaved repeats in one process, medians:

* read events: modtrace's reader today (``store.reader.read_events``: SQLite
  formats CSV text that polars parses; PostgreSQL a server-side cursor); ADBC
  (``adbc_driver_sqlite`` / ``adbc_driver_postgresql``), whose cursors give
  Arrow streams polars takes without a copy.
* write spans into ``span_rows`` (its compact stored form, revision 0005):
  modtrace's writer (``store.analysis_store.write_analysis``: multi-row
  ``INSERT``s with one flat parameter list on SQLite, one CSV ``COPY`` on
  PostgreSQL); one-row ``INSERT`` through ``executemany``; 64-row ``INSERT
  ... VALUES`` of per-statement tuples (what the event writer does);
  ``INSERT ... SELECT`` from a temporary table filled by ``executemany``;
  polars ``write_database`` (SQLAlchemy); ADBC bulk ingest of the polars
  frame; on PostgreSQL also psycopg's row-by-row ``COPY``.

ADBC's SQLite driver carries its own SQLite library, which ignores the locks
of Python's ``sqlite3`` in the same process (two libraries in one process
corrupted a file once): its candidates run in a child process, alone on the
file, and time themselves there.  They are skipped when ``adbc_driver_sqlite``
(``adbc_driver_postgresql``) is not installed; modtrace does not depend on it.

Prints one JSON summary on the last line.
Usage: benchmarks/bench_io.py [--events N] [--repeats R] [--pg URL]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this tree's modtrace and benchmarks

from benchmarks._common import event_rows, interleave  # noqa: E402
from modtrace.analysis.spans import SPAN_ROW_COLUMNS, SPAN_ROW_SCHEMA  # noqa: E402
from modtrace.core.contracts import ISSUE_FRAME, Batch  # noqa: E402
from modtrace.store.analysis_store import stored_span_rows, write_analysis  # noqa: E402
from modtrace.store.engine import Store, open_store  # noqa: E402
from modtrace.store.reader import read_events  # noqa: E402
from modtrace.store.runs import add_rank, create_run  # noqa: E402
from modtrace.store.writer import RankWriter  # noqa: E402

MULTI_ROWS = 64


def synthetic_spans(run_id: int, n: int) -> pl.DataFrame:
    ids = pl.col("span_id")
    backward = ids // 802 % 2 == 1
    return (
        pl.DataFrame({"span_id": pl.int_range(0, n, eager=True).cast(pl.Int64) * 2})
        .with_columns(
            pl.lit(run_id).alias("run_id"),
            pl.lit(0).alias("rank"),
            pl.when(ids % 400 == 0).then(None).otherwise(ids - ids % 400).alias("parent_span_id"),
            (ids % 400 != 0).alias("depth"),
            (ids // 2 % 400).alias("module_id"),
            backward.alias("phase"),
            (ids // 2).alias("call_id"),
            (ids // 1604).alias("step"),
            pl.lit(0).alias("thread_id"),
            pl.when(backward).then(7).otherwise(None).alias("graph_task"),
            (ids * 1000).alias("start_ns"),
            (ids * 1000 + 900).alias("end_ns"),
            pl.lit(900).alias("duration_ns"),
            pl.lit(500).alias("self_ns"),
            pl.lit(0).alias("device_id"),
            pl.lit(None).alias("stream"),
            pl.lit(0).alias("status"),
            (ids + 1).alias("exit_seq"),
        )
        .select(pl.col(c).cast(SPAN_ROW_SCHEMA[c]) for c in SPAN_ROW_COLUMNS)
    )


def prepare(url: str, events: int) -> tuple[Store, int]:
    store = open_store(url, create=True)
    run_id, _ = create_run(store, f"io-{random.randrange(1 << 30)}", {})
    add_rank(store, run_id, 0, 0)
    writer = RankWriter(store, run_id, 0)
    rows = event_rows(events)
    for i in range(0, len(rows), 20_000):
        writer.write(Batch(rows[i:i + 20_000]))
    return store, run_id


_ADBC_CHILD = r"""
import json, sys, time
import polars as pl
url, dialect, mode, run_id = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if dialect == "sqlite":
    import adbc_driver_sqlite.dbapi as adbc
else:
    import adbc_driver_postgresql.dbapi as adbc
conn = adbc.connect(url)
cur = conn.cursor()
if mode == "read":
    t0 = time.perf_counter()
    cur.execute(f"SELECT * FROM events WHERE run_id = {run_id} ORDER BY rank, seq")
    n = pl.DataFrame(cur.fetch_arrow()).height
else:
    spans = pl.read_parquet(sys.argv[5])
    t0 = time.perf_counter()
    cur.adbc_ingest("span_rows", spans, mode="append")
    conn.commit()
    n = spans.height
print(json.dumps({"seconds": time.perf_counter() - t0, "rows": n}))
cur.close()
conn.close()
"""


def _adbc_available(store: Store) -> bool:
    import importlib.util

    return importlib.util.find_spec("adbc_driver_sqlite" if store.dialect == "sqlite" else "adbc_driver_postgresql") is not None


def _adbc(store: Store, mode: str, run_id: int, parquet: str = "") -> float:
    """One ADBC candidate in a child process, the store's own connections closed first; its own timing."""
    import subprocess

    store.engine.dispose()
    url = str(store.path) if store.dialect == "sqlite" else store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
    done = subprocess.run([sys.executable, "-c", _ADBC_CHILD, url, store.dialect, mode, str(run_id), parquet],
                          capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout.splitlines()[-1])["seconds"])


def _clear(store: Store, run_id: int) -> None:
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM span_rows WHERE run_id = {int(run_id)}")


def _columns(frame: pl.DataFrame) -> str:
    return ", ".join(frame.columns)


def write_modtrace(store: Store, spans: pl.DataFrame) -> None:
    write_analysis(store, int(spans["run_id"][0]), spans, pl.DataFrame(schema=ISSUE_FRAME.polars()))


def write_rowwise(store: Store, spans: pl.DataFrame) -> None:
    rows = stored_span_rows(spans)
    mark = "?" if store.dialect == "sqlite" else "%s"
    sql = f"INSERT INTO span_rows ({_columns(rows)}) VALUES ({', '.join(mark for _ in rows.columns)})"
    with store.engine.begin() as conn:
        for start in range(0, rows.height, 50_000):
            conn.exec_driver_sql(sql, rows.slice(start, 50_000).rows())


def write_multirow(store: Store, spans: pl.DataFrame) -> None:
    frame = stored_span_rows(spans)
    mark = "?" if store.dialect == "sqlite" else "%s"
    one = "(" + ", ".join(mark for _ in frame.columns) + ")"
    head = f"INSERT INTO span_rows ({_columns(frame)}) VALUES "
    full = head + ", ".join([one] * MULTI_ROWS)
    rows = frame.rows()
    whole = len(rows) - len(rows) % MULTI_ROWS
    flat = [tuple(v for r in rows[i:i + MULTI_ROWS] for v in r) for i in range(0, whole, MULTI_ROWS)]
    with store.engine.begin() as conn:
        if flat:
            conn.exec_driver_sql(full, flat)
        if whole < len(rows):
            tail = rows[whole:]
            conn.exec_driver_sql(head + ", ".join([one] * len(tail)), tuple(v for r in tail for v in r))


def write_temp_select(store: Store, spans: pl.DataFrame) -> None:
    """executemany into a temporary table without a key, then one INSERT ... SELECT."""
    rows = stored_span_rows(spans)
    mark = "?" if store.dialect == "sqlite" else "%s"
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"CREATE TEMPORARY TABLE span_load AS SELECT {_columns(rows)} FROM span_rows WHERE 1 = 0")
        conn.exec_driver_sql(f"INSERT INTO span_load VALUES ({', '.join(mark for _ in rows.columns)})", rows.rows())
        conn.exec_driver_sql(f"INSERT INTO span_rows ({_columns(rows)}) SELECT {_columns(rows)} FROM span_load")
        conn.exec_driver_sql("DROP TABLE span_load")


def write_polars(store: Store, spans: pl.DataFrame) -> None:
    stored_span_rows(spans).write_database("span_rows", store.engine, if_table_exists="append")


def write_copy(store: Store, spans: pl.DataFrame) -> None:
    rows = stored_span_rows(spans)
    raw = store.engine.raw_connection()
    try:
        driver: Any = raw.driver_connection
        with driver.cursor() as cur, cur.copy(f"COPY span_rows ({_columns(rows)}) FROM STDIN") as copy:
            for row in rows.iter_rows():
                copy.write_row(row)
        driver.commit()
    finally:
        raw.close()


def read_fetchall(store: Store, run_id: int) -> pl.DataFrame:
    raw = store.engine.raw_connection()
    try:
        cur = raw.driver_connection.cursor()  # type: ignore[union-attr]
        cur.execute(f"SELECT * FROM events WHERE run_id = {int(run_id)} ORDER BY rank, seq")
        rows = cur.fetchall()
        cur.close()
    finally:
        raw.rollback()
        raw.close()
    return pl.DataFrame(rows, orient="row", infer_schema_length=None)


def read_polars(store: Store, run_id: int) -> pl.DataFrame:
    with store.engine.connect() as conn:
        return pl.read_database(f"SELECT * FROM events WHERE run_id = {int(run_id)} ORDER BY rank, seq", conn, infer_schema_length=None)


def measure(store: Store, run_id: int, events: int, spans_n: int, repeats: int, tmp: str) -> dict[str, Any]:
    spans = synthetic_spans(run_id, spans_n)
    parquet = str(Path(tmp) / "spans.parquet")
    stored_span_rows(spans).write_parquet(parquet)
    readers: dict[str, Callable[[], pl.DataFrame]] = {
        "modtrace_reader": lambda: read_events(store, run_id),
        "driver_fetchall": lambda: read_fetchall(store, run_id),
        "polars_read_database": lambda: read_polars(store, run_id),
    }
    writers: dict[str, Callable[[Store, pl.DataFrame], None]] = {
        "modtrace_writer": write_modtrace,
        "rowwise_executemany": write_rowwise,
        "multirow_64_tuples": write_multirow,
        "temp_table_insert_select": write_temp_select,
    }
    import importlib.util

    if importlib.util.find_spec("pandas") is not None:  # polars writes through SQLAlchemy with pandas only
        writers["polars_write_database"] = write_polars
    if store.dialect == "postgresql":
        writers["psycopg_copy_rows"] = write_copy
    # the ADBC candidates run in a child process and time themselves there
    read_calls: dict[str, Callable[[], object]] = dict(readers)
    write_calls: dict[str, Callable[[], object]] = {name: partial(write, store, spans) for name, write in writers.items()}
    if _adbc_available(store):
        read_calls["adbc_child"] = lambda: _adbc(store, "read", run_id)
        write_calls["adbc_ingest_child"] = lambda: _adbc(store, "write", run_id, parquet)
    self_timed = ("adbc_child", "adbc_ingest_child")

    def read_back(name: str, frame: object) -> None:
        if name not in self_timed:
            assert isinstance(frame, pl.DataFrame) and frame.height == events, (name, frame)

    def written(name: str, _: object) -> None:
        with store.engine.connect() as conn:
            count = conn.exec_driver_sql(f"SELECT COUNT(*) FROM span_rows WHERE run_id = {run_id}").scalar()
        assert count == spans_n, (name, count)

    rng = random.Random(0)
    reads = interleave(read_calls, repeats, rng=rng, after=read_back, own_time=self_timed).medians()
    writes = interleave(write_calls, repeats, rng=rng, before=lambda _: _clear(store, run_id), after=written,
                        own_time=self_timed).medians()
    _clear(store, run_id)
    return {
        "read_events_s": {k: round(v, 3) for k, v in reads.items()},
        "write_spans_us_per_span": {k: round(v / spans_n * 1e6, 3) for k, v in writes.items()},
        "events": events,
        "spans": spans_n,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--pg", default=None, help="a PostgreSQL URL (a scratch schema is fine) to measure there too")
    args = ap.parse_args()
    summary: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as d:
        store, run_id = prepare(str(Path(d) / "io.db"), args.events)
        try:
            summary["sqlite"] = measure(store, run_id, args.events, args.events // 2, args.repeats, d)
        finally:
            store.dispose()
    if args.pg:
        store, run_id = prepare(args.pg, args.events)
        try:
            with tempfile.TemporaryDirectory() as d:
                summary["postgresql"] = measure(store, run_id, args.events, args.events // 2, args.repeats, d)
        finally:
            with store.engine.begin() as conn:
                conn.exec_driver_sql(f"DELETE FROM runs WHERE id = {run_id}")
            store.dispose()
    for section, values in summary.items():
        print(f"{section}: {values}", file=sys.stderr)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
