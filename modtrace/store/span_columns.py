"""A run's stored span rows read column by column, in parts.

The same frame as ``analysis_store.read_span_rows`` (span rows in
(rank, span_id) order, only the asked columns filled), read faster:

* SQLite: each part of a rank's spans (a range of span ids) is one query
  whose every column is one ``group_concat`` text, one value a line; polars
  parses a part's texts, one after another, as one column of values, cut
  back into columns.  SQLite spends less CPU on that than on formatting each
  row as a CSV line with ``printf`` (and deriving columns in SQL;
  docs/performance.md, "Tree, check, export"); all of a part's columns come from one scan, so their lines
  line up.
* PostgreSQL: the same, with ``string_agg`` over the part's rows by span id (one row of
  texts: a ``COPY`` sends a message per row, each a step of Python's, more client CPU).

Parts are read by two threads, each with its own connection: SQLite and
PostgreSQL work (and polars parses) without Python's lock, so the reads
overlap the caller's work and each other (it paid end to end for ``export``:
docs/performance.md, "Concurrency: which threads pay").  ``end_ns``,
``parent_span_id`` and ``exit_seq`` come back from the stored columns they
derive from (``modtrace.core.contracts.SPAN_STORED_AS``) and are derived here.  Rows
this read cannot vouch for -- a rank the run does not list, a sum past 64
bits -- make it read the rows the ordinary way instead.

``start_span_columns`` begins the read and returns at once: the queries run
while the caller does other work -- imports polars, reads a run's metadata --
and ``SpanColumnsRead.result`` waits for them.  An error in a reading thread is
raised there, never taken for a reason to read the ordinary way.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from modtrace.core.contracts import SPAN_ROW, SPAN_STORED_AS, SPAN_STORED_ROW, StoredAs
from modtrace.store.base import Store
from modtrace.store.cursor import driver_cursor, mark

if TYPE_CHECKING:
    import polars as pl

# Parts per rank (a range of span ids each; smaller texts are cheaper for SQLite to build) and
# threads reading them.
PARTS = 8
THREADS = 2
# A column's NULL in the SQLite texts (no number reads as it).
_NULL = "N"

# Columns of a span row that span_rows keeps as others, and how.
_DERIVED: dict[str, StoredAs] = {d.column: d for d in SPAN_STORED_AS}


def _stored_columns(columns: tuple[str, ...]) -> list[str]:
    stored: list[str] = []
    for column in columns:
        derived = _DERIVED.get(column)
        for source in (derived.base, derived.stored) if derived is not None else (column,):
            if source not in stored and source != "rank":
                stored.append(source)
    return stored


def _derive(frame: pl.DataFrame, columns: tuple[str, ...]) -> pl.DataFrame | None:
    """The derived columns (None when one overflows 64 bits: SQL would not wrap it)."""
    import polars as pl

    exprs, wrapped = [], []
    for column in columns:
        if column not in _DERIVED:
            continue
        exprs.append(_DERIVED[column].decode())
        wrapped.append(_DERIVED[column].wrapped())
    if not exprs:
        return frame
    if frame.select(pl.any_horizontal(*[w.fill_null(False) for w in wrapped]).any()).item():
        return None
    return frame.with_columns(exprs)


def _parse_part(found: tuple[Any, ...] | None, stored: list[str], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """One part's row count and column texts, parsed as one column of all the columns' values one
    after another (one parse per part, not per column) and cut back into columns."""
    import polars as pl

    if found is None or not found[0]:
        return pl.DataFrame(schema={c: schema[c] for c in stored})
    rows, texts = int(found[0]), found[1:]
    values = pl.read_csv("\n".join(texts).encode(), has_header=False, new_columns=["v"], schema={"v": pl.Int64()},
                         null_values=_NULL).to_series()
    if values.len() != rows * len(stored):
        raise ValueError("a column's text does not have a line per row")
    return pl.DataFrame([values.slice(i * rows, rows).cast(schema[c], strict=True).alias(c) for i, c in enumerate(stored)])


def _span_range(cur: Any, m: str, run_id: int, rank: int) -> tuple[int, int] | None:
    """The rank's smallest and largest span id (two index seeks), or None without spans."""
    found = []
    for order in ("ASC", "DESC"):
        cur.execute(f"SELECT span_id FROM span_rows WHERE run_id = {m} AND rank = {m} ORDER BY span_id {order} "
                    "LIMIT 1", (run_id, rank))
        row = cur.fetchone()
        if row is None:
            return None
        found.append(int(row[0]))
    return found[0], found[1]


def _unlisted_rank(cur: Any, m: str, run_id: int, ranks: list[int]) -> bool:
    """Whether the run has span rows of a rank not in ``ranks`` (one index seek per gap)."""
    gaps: list[tuple[str, tuple[int, ...]]] = []
    if not ranks:
        gaps.append(("1 = 1", ()))
    else:
        gaps.append((f"rank < {m}", (ranks[0],)))
        gaps += [(f"rank > {m} AND rank < {m}", (a, b)) for a, b in zip(ranks, ranks[1:], strict=False) if b > a + 1]
        gaps.append((f"rank > {m}", (ranks[-1],)))
    for where, params in gaps:
        cur.execute(f"SELECT 1 FROM span_rows WHERE run_id = {m} AND {where} LIMIT 1", (run_id, *params))
        if cur.fetchone() is not None:
            return True
    return False


def _parts(store: Store, run_id: int) -> list[tuple[int, int, int]] | None:
    """(rank, first span id, past the last) of each part to read; None when a rank the run does
    not list has span rows (the ordinary read takes those)."""
    m = mark(store)
    with driver_cursor(store) as cur:
        cur.execute(f"SELECT rank FROM run_ranks WHERE run_id = {m} UNION SELECT DISTINCT rank FROM modules "
                    f"WHERE run_id = {m}", (run_id, run_id))
        ranks = sorted(int(r[0]) for r in cur.fetchall())
        if _unlisted_rank(cur, m, run_id, ranks):
            return None
        parts = []
        for rank in ranks:
            bounds = _span_range(cur, m, run_id, rank)
            if bounds is None:
                continue
            low, high = bounds
            step = max(1, -(-(high - low + 1) // PARTS))
            parts += [(rank, start, min(start + step, high + 1)) for start in range(low, high + 1, step)]
    return parts


class SpanColumnsRead:
    """A read of a run's span columns under way (``start_span_columns``): each thread of it
    reads and parses its parts; ``result`` waits for them."""

    def __init__(self, columns: tuple[str, ...], parts: list[tuple[int, int, int]],
                 pending: list[Future[list[pl.DataFrame]]], threads: int) -> None:
        self._columns, self._parts, self._pending, self._threads = columns, parts, pending, threads

    def result(self) -> pl.DataFrame | None:
        """The run's stored span rows with only ``columns`` filled (the others null), in (rank,
        span_id) order, or None when the ordinary read must answer: a rank the run does not
        list, no spans, a value past 64 bits.  A reading thread's error is raised here."""
        found = [f.result() for f in self._pending]
        if not self._parts:
            return None
        # thread t read parts t, t + threads, ...: back into the parts' order
        frames = [found[i % self._threads][i // self._threads] for i in range(len(self._parts))]
        return _assemble(frames, self._parts, self._columns)


def start_span_columns(store: Store, run_id: int, columns: tuple[str, ...]) -> SpanColumnsRead:
    """Begin reading the run's stored span rows with only ``columns`` filled: the parts' queries
    run in threads from now on, each on its own connection."""
    ordered = tuple(c for c in SPAN_ROW.names if c in columns)
    stored = _stored_columns(ordered)
    parts = _parts(store, run_id) or []  # none: a rank the run does not list, or no spans
    if not parts:
        return SpanColumnsRead(ordered, [], [], 1)
    sqls = [_part_sql(store, run_id, rank, start, end, stored) for rank, start, end in parts]
    threads = min(THREADS, len(sqls))

    def read_every(first: int) -> list[pl.DataFrame]:
        """Parts first, first + threads, ...: on one connection of this thread's."""
        schema = {**SPAN_ROW.polars(), **SPAN_STORED_ROW.polars()}
        out = []
        with driver_cursor(store) as cur:
            for i in range(first, len(sqls), threads):
                cur.execute(sqls[i])
                out.append(_parse_part(cur.fetchone(), stored, schema))
        return out

    # One short-lived thread per reader: they end with their parts, so nothing is left to shut down.
    pool = ThreadPoolExecutor(threads, thread_name_prefix="modtrace-read")
    pending = [pool.submit(read_every, t) for t in range(threads)]
    pool.shutdown(wait=False)
    return SpanColumnsRead(ordered, parts, pending, threads)


def _assemble(frames: list[pl.DataFrame], parts: list[tuple[int, int, int]], columns: tuple[str, ...]) -> pl.DataFrame | None:
    import polars as pl

    span_row_schema = SPAN_ROW.polars()
    frame = pl.concat([f.with_columns(pl.lit(rank, dtype=pl.Int32).alias("rank"))
                       for (rank, _, _), f in zip(parts, frames, strict=True)])
    if not frame["span_id"].is_sorted() and not frame.select(pl.struct("rank", "span_id").is_sorted()).item():
        frame = frame.sort("rank", "span_id")  # group_concat's order is SQLite's to choose
    derived = _derive(frame, columns)
    if derived is None:
        return None
    missing = [pl.lit(None, dtype=span_row_schema[c]).alias(c) for c in SPAN_ROW.names if c not in columns]
    return derived.with_columns(missing).select(SPAN_ROW.names)


def _part_sql(store: Store, run_id: int, rank: int, start: int, end: int, stored: list[str]) -> str:
    """The query of one part: its row count and each stored column as one text, a value a line."""
    where = f"run_id = {int(run_id)} AND rank = {int(rank)} AND span_id >= {int(start)} AND span_id < {int(end)}"
    if store.dialect == "sqlite":
        texts = ", ".join(f"group_concat(ifnull({c}, '{_NULL}'), '\n')" for c in stored)
        return f"SELECT count(*), {texts} FROM span_rows WHERE {where}"
    # one row of texts: a COPY sends a message per row, each a step of Python's
    texts = ", ".join(f"string_agg(coalesce({c}::text, '{_NULL}'), E'\\n')" for c in stored)
    return (f"SELECT count(*), {texts} FROM (SELECT {', '.join(stored)} FROM span_rows WHERE {where} "
            "ORDER BY span_id) AS part")
