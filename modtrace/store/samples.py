"""Bulk read of a run's closed calls, for ``modtrace diff``.

``read_closed_calls`` returns the few span columns a diff needs
(``modtrace.core.contracts.CALL_FRAME``) for every closed span of a run, or
of one rank, unordered.  It is the diff's only read of ``span_rows``, so it
is built for speed: a run of a million events has half a million spans.

Why not fetch rows, or aggregate per step in SQL?  Fetching 11 columns as
Python rows costs most of the read's CPU in building a Python int per value
(docs/performance.md, "Diff speed"); ``GROUP BY step, module_id,
phase`` in SQLite costs more than it saves, because SQLite groups by sorting
and a real model calls most modules once per step, so there is about one
span per group.  What is cheap is letting the database write the values as
text in bulk and parsing that text with polars:

- SQLite: one ``group_concat`` per column, all in the same aggregate query:
  SQLite steps every aggregate of a query through the same rows in the same
  loop, so the k-th item of every column comes from the same row (one
  ``printf`` line per row would not rely on that, but costs more).  Four small
  columns are packed two by two into integers (``step`` with ``thread_id``,
  ``module_id`` with ``depth`` and ``phase``) so there are fewer strings to
  build; the packings fit in 64 bits for every value of the columns' 32-bit
  types (``_STEP_THREAD``, ``_MODULE_DEPTH_PHASE``).  Values are one a
  line (polars' CSV reader parses that faster than a split); nullable
  columns are written as 'n' when null (``group_concat`` would skip a null
  and shift the column).
- PostgreSQL: ``COPY (SELECT ...) TO STDOUT`` as CSV, read by polars.

Either way the run is read in windows of ``WINDOW_SEQ`` sequence numbers of
``span_id`` (a range of the primary key), so the text held at once stays
bounded on long runs.

Reading is two stages: ``fetch_closed_calls`` (the database's work, during
which the driver releases the GIL; it imports nothing heavy, so ``modtrace
diff`` starts it before importing polars) and ``parse_closed_calls``.
``read_closed_calls`` does both.
"""

from __future__ import annotations

import io
from typing import TYPE_CHECKING, Any

from modtrace.core.contracts import CALL_FRAME
from modtrace.store.engine import Store
from modtrace.store.reader import driver_cursor

if TYPE_CHECKING:
    import polars as pl

# span_id is the seq of the enter event: a window of this many seqs holds at
# most half as many spans (each has an enter and an exit event).
WINDOW_SEQ = 4_000_000

_SHIFT = 1 << 32
_THREAD_OFFSET = 1 << 31  # an Int32 thread id + this is in [0, 2^32)
# step * 2^32 + (thread_id + 2^31): in [-2^63, 2^63) for Int32 step and thread_id.
_STEP_THREAD = f"step * {_SHIFT} + (thread_id + {_THREAD_OFFSET})"
# module_id * 2^32 + depth * 4 + phase: fits for an Int32 module_id and depth < 2^30
# (a call 2^30 levels deep cannot happen: every level is a Python frame).
_MODULE_DEPTH_PHASE = f"module_id * {_SHIFT} + depth * 4 + phase"
_SQLITE_COLUMNS = (
    "span_id", _STEP_THREAD, _MODULE_DEPTH_PHASE, "duration_ns", "self_ns",
    "coalesce(device_id, 'n')", "coalesce(stream, 'n')",
)

# a newline literal, not char(10): SQLite would call char() once per row
_NEWLINE = "'\n'"

_PG_COLUMNS = ("span_id", "step", "thread_id", "module_id", "depth", "phase", "duration_ns", "self_ns",
               "device_id", "stream")

# One fetched window: its rank and either the SQLite column texts or PostgreSQL's CSV.
Window = tuple[int, "tuple[str, ...] | bytes"]




def read_closed_calls(
    store: Store, run_id: int, *, rank: int | None = None, window_seq: int = WINDOW_SEQ
) -> pl.DataFrame:
    """Every closed span of the run (of ``rank`` when given) as a calls frame (``CALL_SCHEMA``), unordered."""
    return parse_closed_calls(fetch_closed_calls(store, run_id, rank=rank, window_seq=window_seq))


def fetch_closed_calls(
    store: Store, run_id: int, *, rank: int | None = None, window_seq: int = WINDOW_SEQ
) -> list[Window]:
    """The database's text of every closed span of the run (of ``rank``), window by window."""
    out: list[Window] = []
    with driver_cursor(store) as cur:
        for r in span_ranks(store, run_id) if rank is None else [rank]:
            for lo, hi in _windows(cur, store, run_id, r, window_seq):
                if store.dialect == "postgresql":
                    data = _fetch_window_pg(cur, run_id, r, lo, hi)
                    if data:
                        out.append((r, data))
                else:
                    texts = _fetch_window_sqlite(cur, run_id, r, lo, hi)
                    if texts is not None:
                        out.append((r, texts))
    return out


def parse_closed_calls(windows: list[Window]) -> pl.DataFrame:
    """``fetch_closed_calls``'s text -> calls frame (``CALL_SCHEMA``)."""
    import polars as pl

    call_schema = CALL_FRAME.polars()

    parts = [_parse_csv(r, data) if isinstance(data, bytes) else _parse_columns(r, data) for r, data in windows]
    if not parts:
        return pl.DataFrame(schema=call_schema)
    return pl.concat(parts, rechunk=True)


def _mark(store: Store) -> str:
    return "?" if store.engine.dialect.paramstyle == "qmark" else "%s"


def span_ranks(store: Store, run_id: int) -> list[int]:
    """Ranks with stored spans, ascending: one primary-key seek per rank (no scan of the spans)."""
    m = _mark(store)
    sql = (
        f"WITH RECURSIVE r(rank) AS (SELECT MIN(rank) FROM span_rows WHERE run_id = {m} "
        f"UNION ALL SELECT (SELECT MIN(rank) FROM span_rows WHERE run_id = {m} AND rank > r.rank) "
        "FROM r WHERE r.rank IS NOT NULL) SELECT rank FROM r WHERE rank IS NOT NULL"
    )
    with driver_cursor(store) as cur:
        cur.execute(sql, (run_id, run_id))
        return [int(row[0]) for row in cur.fetchall()]


def _windows(cur: Any, store: Store, run_id: int, rank: int, width: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges of span_id covering the rank's spans, ``width`` wide."""
    m = _mark(store)
    where = f"FROM span_rows WHERE run_id = {m} AND rank = {m}"
    # Two subqueries: each is a single seek of the primary key (one query
    # with both MIN and MAX would scan the rank's rows).
    cur.execute(f"SELECT (SELECT MIN(span_id) {where}), (SELECT MAX(span_id) {where})", (run_id, rank) * 2)
    lo, hi = cur.fetchone()
    if lo is None:
        return []
    return [(start, min(start + width, int(hi) + 1)) for start in range(int(lo), int(hi) + 1, width)]


def _fetch_window_sqlite(cur: Any, run_id: int, rank: int, lo: int, hi: int) -> tuple[str, ...] | None:
    sql = (
        f"SELECT COUNT(*), {', '.join(f'group_concat({c}, {_NEWLINE})' for c in _SQLITE_COLUMNS)} FROM span_rows "
        "WHERE run_id = ? AND rank = ? AND span_id >= ? AND span_id < ? AND duration_ns IS NOT NULL"
    )
    cur.execute(sql, (run_id, rank, lo, hi))
    count, *texts = cur.fetchone()
    return tuple(texts) if count else None


def _fetch_window_pg(cur: Any, run_id: int, rank: int, lo: int, hi: int) -> bytes:
    # COPY takes no bind parameters; the values are ints, formatted here.
    sql = (
        f"COPY (SELECT {', '.join(_PG_COLUMNS)} FROM span_rows WHERE run_id = {int(run_id)} AND rank = {int(rank)} "
        f"AND span_id >= {int(lo)} AND span_id < {int(hi)} AND duration_ns IS NOT NULL) TO STDOUT (FORMAT csv)"
    )
    buf = io.BytesIO()
    with cur.copy(sql) as copy:
        for block in copy:
            buf.write(block)
    return buf.getvalue()


def _split(text: str, name: str) -> pl.Series:
    """Integers, one a line ('n' is null) -> Int64 Series."""
    import polars as pl

    column: pl.Series = pl.read_csv(text.encode(), has_header=False, schema={name: pl.Int64}, null_values="n")[name]
    return column


def _parse_columns(rank: int, texts: tuple[str, ...]) -> pl.DataFrame:
    import polars as pl

    call_schema = CALL_FRAME.polars()

    span_id, step_thread, module_depth_phase, duration, self_ns, device, stream = texts
    frame = pl.DataFrame([
        _split(span_id, "span_id"), _split(step_thread, "st"), _split(module_depth_phase, "mdp"),
        _split(duration, "duration_ns"), _split(self_ns, "self_ns"),
        _split(device, "device_id"), _split(stream, "stream"),
    ])
    low = pl.col("mdp") % _SHIFT  # polars % of Int64 is the floored modulo, like //
    return frame.select(
        pl.lit(rank, dtype=pl.Int32).alias("rank"),
        "span_id",
        (pl.col("st") // _SHIFT).alias("step"),
        (pl.col("st") % _SHIFT - _THREAD_OFFSET).alias("thread_id"),
        (pl.col("mdp") // _SHIFT).alias("module_id"),
        (low // 4).alias("depth"),
        (low % 4).alias("phase"),
        "duration_ns",
        "self_ns",
        "device_id",
        "stream",
    ).cast(call_schema)  # type: ignore[arg-type]


def _parse_csv(rank: int, data: bytes) -> pl.DataFrame:
    import polars as pl

    call_schema = CALL_FRAME.polars()

    schema = {c: call_schema[c] for c in _PG_COLUMNS}
    frame = pl.read_csv(data, has_header=False, new_columns=list(_PG_COLUMNS), schema=schema)
    return frame.select(pl.lit(rank, dtype=pl.Int32).alias("rank"), *_PG_COLUMNS).select(list(call_schema))
