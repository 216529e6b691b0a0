"""Reads of a run's rows as polars frames, with explicit dtypes.

Events come back in the analysis input contract
(``modtrace.core.contracts.EVENT_FRAME``), by rank and seq, fetched in
chunks, so memory holds the frame and one chunk in transit at most, each
chunk as one CSV text the database formats (PostgreSQL: string_agg; SQLite:
printf, group_concat); polars parses it (faster than a Python tuple per
row; ADBC's SQLite driver was no faster: docs/performance.md, "Analysis").
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import polars as pl

from modtrace.core.codes import OUT_OF_RANGE_CODE
from modtrace.core.contracts import DEVICE_FRAME, EVENT_FRAME, MODULE_FRAME

# Defined in store.cursor (no polars there); re-exported, as the other readers import them from here.
from modtrace.store.cursor import driver_cursor as driver_cursor
from modtrace.store.cursor import mark as mark
from modtrace.store.engine import Store

CHUNK_ROWS = 200_000

# The frames' polars dtypes (the analysis names the same in analysis.events; store does not import analysis).
_EVENT_FRAME_SCHEMA = EVENT_FRAME.polars()
_MODULE_FRAME_SCHEMA = MODULE_FRAME.polars()
_DEVICE_FRAME_SCHEMA = DEVICE_FRAME.polars()

# Columns fetched per event; run_id and rank are constant per query and added after.
_FETCHED = [c for c in _EVENT_FRAME_SCHEMA if c not in ("run_id", "rank")]
_FETCHED_SCHEMA = {c: _EVENT_FRAME_SCHEMA[c] for c in _FETCHED}


# PostgreSQL: the planner's settings for a read in primary-key order (SET LOCAL: this
# transaction's only).  Without statistics (a table never analysed, autovacuum off or not
# yet run) the planner guesses a few rows and picks a bitmap scan and a sort of every row
# matched, spilled to disk past work_mem -- much slower than the ordered index scan these
# settings leave it (docs/performance.md, "Analysis").
_KEY_ORDER = "SET LOCAL enable_sort = off; SET LOCAL enable_bitmapscan = off"


def copy_csv(store: Store, select: str, *, key_order: bool = False) -> bytes:
    """PostgreSQL: the rows of ``select`` (values formatted into it, COPY binds none) as CSV
    bytes, without a header; NULL is an empty field, as polars reads it.  ``key_order``:
    ``select`` orders by a prefix of its table's primary key, to be read by that index in
    order rather than sorted."""
    buf = io.BytesIO()
    with driver_cursor(store) as cur:
        if key_order:
            cur.execute(_KEY_ORDER)
        with cur.copy(f"COPY ({select}) TO STDOUT (FORMAT csv)") as copy:
            for block in copy:
                buf.write(block)
    return buf.getvalue()


def sqlite_csv_chunks(
    store: Store, table: str, exprs: list[str], names: list[str], key: tuple[str, str], where: str,
    schema: dict[str, pl.DataType], chunk_rows: int = CHUNK_ROWS,
) -> Iterator[pl.DataFrame]:
    """SQLite: ``table``'s rows matching ``where`` by ``key`` (two columns of its primary key,
    both among ``names``), as frames of ``chunk_rows`` rows that SQLite formats as one CSV
    text each (printf, group_concat) and polars parses; ``exprs`` are the columns' SQL."""
    line = f"printf('{','.join('%s' for _ in exprs)}', {', '.join(exprs)})"
    a, b = key
    sql = (f"SELECT group_concat(line, char(10)) FROM (SELECT {line} AS line FROM {table} WHERE {where} "
           f"AND {{}} ORDER BY {a}, {b} LIMIT ?)")
    after: tuple[int, ...] = ()
    with driver_cursor(store) as cur:
        while True:
            cur.execute(sql.format(f"({a}, {b}) > (?, ?)" if after else "1 = 1"), (*after, chunk_rows))
            (text,) = cur.fetchone()
            if not text:
                return
            frame = pl.read_csv(text.encode(), has_header=False, new_columns=names, schema=schema)
            del text
            if not frame.select(pl.struct(a, b).is_sorted()).item():  # group_concat's order is SQLite's to choose
                frame = frame.sort(a, b)
            after = (int(frame[a][-1]), int(frame[b][-1]))
            yield frame
            if frame.height < chunk_rows:
                return


def read_ranks(store: Store, run_id: int) -> list[int]:
    """Ranks that wrote events or lookups for the run, ascending."""
    m = mark(store)
    with driver_cursor(store, "modtrace_ranks") as cur:
        cur.execute(
            f"SELECT rank FROM run_ranks WHERE run_id = {m} UNION SELECT DISTINCT rank FROM modules WHERE run_id = {m}",
            (run_id, run_id),
        )
        return sorted(int(r[0]) for r in cur.fetchall())


# SQLite: each chunk comes back as one CSV text built by SQLite itself
# (printf, group_concat) and parsed by polars, instead of a Python tuple per
# row.  kind, phase, status and tie travel as one number, each byte one
# code offset by 128; a code outside -127..127 arrives as OUT_OF_RANGE_CODE.
_SMALL = ("kind", "phase", "status", "tie")
_NULLABLE = ("device_id", "stream", "graph_task")
_CSV_COLUMNS = [c for c in _FETCHED if c not in _SMALL] + ["_small"]
_CSV_SCHEMA = {**{c: _EVENT_FRAME_SCHEMA[c] for c in _CSV_COLUMNS if c != "_small"}, "_small": pl.Int64()}


def small_code(column: str) -> str:
    """SQL reading a one-byte code column: a value that does not fit becomes
    ``OUT_OF_RANGE_CODE``, for the analysis to report, not a failed read."""
    return f"(CASE WHEN {column} BETWEEN -127 AND 127 THEN {column} ELSE {OUT_OF_RANGE_CODE} END)"


def _csv_line() -> str:
    packed = " + ".join(f"(({small_code(c)} + 128) << {8 * i})" for i, c in enumerate(_SMALL))
    exprs = [c for c in _CSV_COLUMNS if c != "_small"] + [packed]
    fmt = ",".join("%d" if c in _CSV_COLUMNS[:-1] and c not in _NULLABLE else "%s" for c in _CSV_COLUMNS)
    return f"printf('{fmt}', {', '.join(exprs)})"


_SQLITE_CHUNK = (
    f"SELECT group_concat(line, char(10)) FROM (SELECT {_csv_line()} AS line FROM events "
    "WHERE run_id = ? AND rank = ? AND seq {} ? ORDER BY seq LIMIT ?)"
)


def _unpack_small(frame: pl.DataFrame) -> pl.DataFrame:
    small = pl.col("_small")
    return frame.select(
        *(
            c
            if c not in _SMALL
            else ((small // (1 << (8 * _SMALL.index(c)))) % 256 - 128).cast(_EVENT_FRAME_SCHEMA[c]).alias(c)
            for c in _FETCHED
        )
    )


def _sqlite_event_chunks(cur: Any, run_id: int, rank: int, chunk_rows: int) -> Iterator[pl.DataFrame]:
    after, op = -(1 << 63), ">="
    while True:
        cur.execute(_SQLITE_CHUNK.format(op), (run_id, rank, after, chunk_rows))
        (text,) = cur.fetchone()
        if not text:
            return
        frame = _unpack_small(pl.read_csv(text.encode(), has_header=False, new_columns=_CSV_COLUMNS, schema=_CSV_SCHEMA))
        del text
        if not frame["seq"].is_sorted():  # group_concat's order is SQLite's to choose
            frame = frame.sort("seq")
        after, op = int(frame["seq"][-1]), ">"
        yield frame
        if frame.height < chunk_rows:
            return


def csv_text(store: Store, select: str, columns: list[str], *, key_order: bool = False) -> bytes:
    """PostgreSQL: the rows of ``select`` (values formatted into it) as one CSV text built by
    the server (``string_agg`` of each row's ``columns`` joined by commas, NULL an empty
    field as polars reads it), in ``select``'s order, without a header; empty when no row.
    One row comes back: a ``COPY`` sends a message per row, each a step of Python's
    (this moves CPU from the client to the server for about the same wall time; the
    client's is the CPU the analysis and the writes share: docs/performance.md, "Analysis").
    ``key_order`` as for ``copy_csv``."""
    line = " || ',' || ".join(f"coalesce({c}::text, '')" for c in columns)
    with driver_cursor(store) as cur:
        if key_order:
            cur.execute(_KEY_ORDER)
        cur.execute(f"SELECT string_agg({line}, E'\\n') FROM ({select}) AS part")
        row = cur.fetchone()
    return b"" if row is None or row[0] is None else str(row[0]).encode()


def _pg_event_chunks(store: Store, run_id: int, rank: int, chunk_rows: int) -> Iterator[pl.DataFrame]:
    """PostgreSQL: each chunk the next ``chunk_rows`` rows by seq as one CSV text polars parses."""
    columns = ", ".join(f"{small_code(c)} AS {c}" if c in _SMALL else c for c in _FETCHED)
    after, op = -(1 << 63), ">="
    while True:
        data = csv_text(store, f"SELECT {columns} FROM events WHERE run_id = {int(run_id)} AND rank = {int(rank)} "
                               f"AND seq {op} {after} ORDER BY seq LIMIT {int(chunk_rows)}", _FETCHED, key_order=True)
        if not data:
            return
        frame = pl.read_csv(data, has_header=False, new_columns=_FETCHED, schema=_FETCHED_SCHEMA)
        del data
        if not frame["seq"].is_sorted():  # an aggregate's input order is the server's to choose
            frame = frame.sort("seq")
        after, op = int(frame["seq"][-1]), ">"
        yield frame
        if frame.height < chunk_rows:
            return


def iter_event_chunks(
    store: Store, run_id: int, rank: int, *, chunk_rows: int = CHUNK_ROWS
) -> Iterator[pl.DataFrame]:
    """One rank's events by seq, as event frames of at most ``chunk_rows`` rows."""
    def tagged(chunks: Iterator[pl.DataFrame]) -> Iterator[pl.DataFrame]:
        for frame in chunks:
            yield frame.select(
                pl.lit(run_id, dtype=pl.Int32).alias("run_id"),
                pl.lit(rank, dtype=pl.Int32).alias("rank"),
                *_FETCHED,
            )

    if store.dialect == "sqlite":
        with driver_cursor(store) as cur:
            yield from tagged(_sqlite_event_chunks(cur, run_id, rank, chunk_rows))
    else:
        yield from tagged(_pg_event_chunks(store, run_id, rank, chunk_rows))


def read_events(
    store: Store, run_id: int, *, ranks: list[int] | None = None, chunk_rows: int = CHUNK_ROWS
) -> pl.DataFrame:
    """A run's events (all ranks, or ``ranks``) as one event frame sorted by (rank, seq)."""
    if ranks is None:
        ranks = read_ranks(store, run_id)
    parts = [chunk for rank in ranks for chunk in iter_event_chunks(store, run_id, rank, chunk_rows=chunk_rows)]
    if not parts:
        return pl.DataFrame(schema=_EVENT_FRAME_SCHEMA)
    return pl.concat(parts, rechunk=True)


def _read_table(store: Store, sql: str, params: tuple[Any, ...], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    with driver_cursor(store, "modtrace_lookup") as cur:
        cur.execute(sql, params)
        rows = cur.fetchall()
    return pl.DataFrame(rows, schema=schema, orient="row")


def _rank_filter(store: Store, ranks: list[int] | None) -> str:
    if ranks is None:
        return ""
    return f" AND rank IN ({', '.join(str(int(r)) for r in ranks)})" if ranks else " AND 1 = 0"


def read_modules(store: Store, run_id: int, *, ranks: list[int] | None = None) -> pl.DataFrame:
    """The run's module frame (``MODULE_FRAME``)."""
    m = mark(store)
    sql = (
        "SELECT rank, module_id, fqn, module_type, parent_module_id, compiled FROM modules "
        f"WHERE run_id = {m}{_rank_filter(store, ranks)} ORDER BY rank, module_id"
    )
    return _read_table(store, sql, (run_id,), _MODULE_FRAME_SCHEMA)


def read_devices(store: Store, run_id: int, *, ranks: list[int] | None = None) -> pl.DataFrame:
    """The run's device frame (``DEVICE_FRAME``)."""
    m = mark(store)
    sql = f"SELECT rank, device_id, name FROM devices WHERE run_id = {m}{_rank_filter(store, ranks)} ORDER BY rank, device_id"
    return _read_table(store, sql, (run_id,), _DEVICE_FRAME_SCHEMA)


def max_rank_events(store: Store, run_id: int, rank: int | None = None) -> int:
    """The largest number of events one rank of the run (or ``rank``) has written."""
    m = mark(store)
    sql = f"SELECT max(event_count) FROM run_ranks WHERE run_id = {m}"
    params: tuple[int, ...] = (run_id,)
    if rank is not None:
        sql += f" AND rank = {m}"
        params = (run_id, rank)
    with driver_cursor(store, "modtrace_total") as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
    return int(row[0] or 0) if row else 0


def read_run_status(store: Store, run_id: int, rank: int | None = None) -> str:
    """The run's status (or one rank's): running | completed | failed | interrupted."""
    m = mark(store)
    with driver_cursor(store, "modtrace_status") as cur:
        if rank is None:
            cur.execute(f"SELECT status FROM runs WHERE id = {m}", (run_id,))
        else:
            cur.execute(f"SELECT status FROM run_ranks WHERE run_id = {m} AND rank = {m}", (run_id, rank))
        row = cur.fetchone()
    return str(row[0]) if row else "running"
