"""Work counters in the store: ``call_counters`` and ``counted_ranges`` (the recorder's,
written when a rank's recording ends) and ``span_counter_rows`` (per span, written by
the analysis; ``modtrace.analysis.counters`` computes them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from modtrace.store.base import Store
from modtrace.store.cursor import driver_cursor, mark

if TYPE_CHECKING:
    import polars as pl

CALL_COUNTER_COLUMNS = ("run_id", "rank", "call_id", "phase", "graph_task", "flops", "bytes", "ops", "unknown_ops")
RANGE_COLUMNS = ("run_id", "rank", "first_seq", "last_seq", "flops", "bytes", "ops", "unknown_ops")
SPAN_COUNTER_ROW_COLUMNS = ("run_id", "rank", "span_id", "flops", "flops_self", "bytes", "bytes_self", "ops",
                            "ops_self", "unknown_ops", "unknown_ops_self")
_BATCH_ROWS = 50_000


def _insert(conn: Any, store: Store, table: str, columns: Sequence[str], rows: Sequence[tuple[Any, ...]]) -> None:
    sql = f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join(mark(store) for _ in columns)})"
    for start in range(0, len(rows), _BATCH_ROWS):
        conn.exec_driver_sql(sql, list(rows[start:start + _BATCH_ROWS]))


def write_counters(store: Store, run_id: int, rank: int, calls: Sequence[tuple[Any, ...]],
                   ranges: Sequence[tuple[Any, ...]]) -> None:
    """One rank's counters (``CALL_COUNTER_COLUMNS`` rows, graph_task None in forward, and
    ``RANGE_COLUMNS`` rows), replacing any it had, in one transaction."""
    rows = [(*r[:4], -1 if r[4] is None else r[4], *r[5:]) for r in calls]
    where = f"run_id = {int(run_id)} AND rank = {int(rank)}"
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM call_counters WHERE {where}")
        conn.exec_driver_sql(f"DELETE FROM counted_ranges WHERE {where}")
        _insert(conn, store, "call_counters", CALL_COUNTER_COLUMNS, rows)
        _insert(conn, store, "counted_ranges", RANGE_COLUMNS, list(ranges))


def has_counters(store: Store, run_id: int) -> bool:
    """Whether the run counted any step."""
    with driver_cursor(store) as cur:
        cur.execute(f"SELECT 1 FROM counted_ranges WHERE run_id = {mark(store)} LIMIT 1", (run_id,))
        return cur.fetchone() is not None


def read_counters(store: Store, run_id: int, rank: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """One rank's (call counters, counted ranges) frames."""
    import polars as pl

    out = []
    for table, columns in (("call_counters", CALL_COUNTER_COLUMNS), ("counted_ranges", RANGE_COLUMNS)):
        with driver_cursor(store) as cur:
            cur.execute(f"SELECT {', '.join(columns)} FROM {table} WHERE run_id = {mark(store)} AND rank = {mark(store)}",
                        (run_id, rank))
            rows = cur.fetchall()
        out.append(pl.DataFrame(rows, schema=dict.fromkeys(columns, pl.Int64), orient="row"))
    return out[0], out[1]


def write_span_counters(store: Store, run_id: int, rank: int, frame: pl.DataFrame) -> None:
    """Replace one rank's span counter rows with ``frame`` (rank, span_id and the counters)."""
    import polars as pl

    rows = frame.with_columns(pl.lit(run_id, dtype=pl.Int64).alias("run_id")).select(SPAN_COUNTER_ROW_COLUMNS).rows()
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM span_counter_rows WHERE run_id = {int(run_id)} AND rank = {int(rank)}")
        _insert(conn, store, "span_counter_rows", SPAN_COUNTER_ROW_COLUMNS, rows)


COUNTED_SPAN_COLUMNS = ("rank", "first_seq", "kind", "span_id", "parent_span_id", "depth", "fqn", "phase",
                        "flops_self", "bytes_self", "ops_self", "unknown_ops_self", "flops", "bytes", "unknown_ops")


def counted_span_rows(store: Store, run_id: int, rank: int | None = None) -> list[tuple[Any, ...]]:
    """The spans of each counted range of the run (``rank``'s only when given) with their
    counters, as ``COUNTED_SPAN_COLUMNS`` tuples ordered by rank and span_id (read without
    polars): rank, first_seq (the range), kind (``root_calls.kind`` of the root call that began
    it), span_id, parent_span_id, depth, fqn, phase (code), the self counts and the inclusive
    flops, bytes and unknown_ops."""
    m = mark(store)
    where = f"r.run_id = {m}" + ("" if rank is None else f" AND r.rank = {int(rank)}")
    sql = (
        "SELECT r.rank, r.first_seq, rc.kind, s.span_id, s.span_id - s.parent_gap, s.depth, m.fqn, s.phase, "
        "sc.flops_self, sc.bytes_self, sc.ops_self, sc.unknown_ops_self, sc.flops, sc.bytes, sc.unknown_ops "
        # CROSS JOIN: SQLite then reads the few counted ranges first and each one's spans by key
        # (it planned a scan of every span of the run otherwise); PostgreSQL plans it as a join
        "FROM counted_ranges r "
        "LEFT JOIN root_calls rc ON rc.run_id = r.run_id AND rc.rank = r.rank AND rc.seq = r.first_seq "
        "CROSS JOIN span_rows s "
        "JOIN span_counter_rows sc ON sc.run_id = s.run_id AND sc.rank = s.rank AND sc.span_id = s.span_id "
        "JOIN modules m ON m.run_id = s.run_id AND m.rank = s.rank AND m.module_id = s.module_id "
        "WHERE s.run_id = r.run_id AND s.rank = r.rank AND s.span_id BETWEEN r.first_seq AND r.last_seq "
        f"AND {where} ORDER BY r.rank, s.span_id"
    )
    with driver_cursor(store) as cur:
        cur.execute(sql, (run_id,))
        return [tuple(r) for r in cur.fetchall()]


def range_bounds(ranges: pl.DataFrame) -> list[tuple[int, int]]:
    """Counted ranges (``read_counters``' second frame) as (first, last) span id bounds, inclusive:
    the spans entered in them are the only ones counters and memory look at."""
    return [(int(a), int(b)) for a, b in ranges.select("first_seq", "last_seq").iter_rows()]


def read_counted_spans(store: Store, run_id: int, rank: int | None = None) -> pl.DataFrame:
    """``counted_span_rows`` as a frame."""
    import polars as pl

    dtypes = {"rank": pl.Int32, "first_seq": pl.Int64, "kind": pl.String, "depth": pl.Int32, "fqn": pl.String,
              "phase": pl.Int8}
    schema = {c: dtypes.get(c, pl.Int64) for c in COUNTED_SPAN_COLUMNS}
    return pl.DataFrame(counted_span_rows(store, run_id, rank), schema=schema, orient="row")


def read_span_counters(store: Store, run_id: int) -> pl.DataFrame:
    """The run's span counter rows: rank, span_id and ``SPAN_COUNTER_ROW_COLUMNS``' counters
    (only the spans of counted steps have one)."""
    import polars as pl

    columns = SPAN_COUNTER_ROW_COLUMNS[1:]
    with driver_cursor(store) as cur:
        cur.execute(f"SELECT {', '.join(columns)} FROM span_counter_rows WHERE run_id = {mark(store)} "
                    "ORDER BY rank, span_id", (run_id,))
        rows = cur.fetchall()
    schema = {c: pl.Int32 if c == "rank" else pl.Int64 for c in columns}
    return pl.DataFrame(rows, schema=schema, orient="row")
