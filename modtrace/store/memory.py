"""Memory on counted steps in the store: ``mem_storages`` and ``mem_returns`` (the recorder's,
written when a rank's recording ends), ``span_memory_rows`` and ``step_memory`` (written by the
analysis; ``modtrace.analysis.memory`` computes them)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from modtrace.store.base import Store
from modtrace.store.counters import _insert
from modtrace.store.cursor import driver_cursor, mark

if TYPE_CHECKING:
    import polars as pl

STORAGE_COLUMNS = ("run_id", "rank", "first_seq", "sid", "device", "nbytes", "alloc_seq", "free_seq", "free_order",
                   "call_id", "phase", "graph_task")
RETURN_COLUMNS = ("run_id", "rank", "call_id", "sid")
SPAN_MEMORY_COLUMNS = ("run_id", "rank", "span_id", "kept_mem_bytes", "kept_mem_bytes_self", "peak_mem_bytes",
                       "peak_mem_bytes_self")
STEP_MEMORY_COLUMNS = ("run_id", "rank", "first_seq", "step", "device", "base_bytes", "peak_bytes")


def write_memory(store: Store, run_id: int, rank: int, storages: Sequence[tuple[Any, ...]],
                 returns: Sequence[tuple[Any, ...]]) -> None:
    """One rank's storages (``STORAGE_COLUMNS`` rows) and returned storages (``RETURN_COLUMNS``
    rows), replacing any it had, in one transaction."""
    where = f"run_id = {int(run_id)} AND rank = {int(rank)}"
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM mem_storages WHERE {where}")
        conn.exec_driver_sql(f"DELETE FROM mem_returns WHERE {where}")
        _insert(conn, store, "mem_storages", STORAGE_COLUMNS, list(storages))
        _insert(conn, store, "mem_returns", RETURN_COLUMNS, list(returns))


def has_memory(store: Store, run_id: int) -> bool:
    """Whether the run recorded storages on any counted step."""
    with driver_cursor(store) as cur:
        cur.execute(f"SELECT 1 FROM mem_storages WHERE run_id = {mark(store)} LIMIT 1", (run_id,))
        return cur.fetchone() is not None


def _frame(store: Store, table: str, columns: Sequence[str], run_id: int, rank: int | None) -> pl.DataFrame:
    import polars as pl

    where = f"run_id = {mark(store)}" + ("" if rank is None else f" AND rank = {int(rank)}")
    with driver_cursor(store) as cur:
        cur.execute(f"SELECT {', '.join(columns)} FROM {table} WHERE {where}", (run_id,))
        rows = cur.fetchall()
    dtypes = {"rank": pl.Int32, "device": pl.Int32, "phase": pl.Int8, "step": pl.Int32}
    return pl.DataFrame(rows, schema={c: dtypes.get(c, pl.Int64) for c in columns}, orient="row")


def read_storages(store: Store, run_id: int, rank: int | None = None) -> pl.DataFrame:
    """The run's (rank's) ``mem_storages`` rows without run_id, as ``analysis.memory`` reads them."""
    return _frame(store, "mem_storages", STORAGE_COLUMNS[1:], run_id, rank).sort("rank", "first_seq", "sid")


def read_returns(store: Store, run_id: int, rank: int | None = None) -> pl.DataFrame:
    """The run's (rank's) ``mem_returns`` rows: rank, call_id, sid."""
    return _frame(store, "mem_returns", RETURN_COLUMNS[1:], run_id, rank).sort("rank", "call_id", "sid")


def write_span_memory(store: Store, run_id: int, rank: int, frame: pl.DataFrame) -> None:
    """Replace one rank's span memory rows with ``frame`` (rank, span_id and the four columns)."""
    import polars as pl

    rows = frame.with_columns(pl.lit(run_id, dtype=pl.Int64).alias("run_id")).select(SPAN_MEMORY_COLUMNS).rows()
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM span_memory_rows WHERE run_id = {int(run_id)} AND rank = {int(rank)}")
        _insert(conn, store, "span_memory_rows", SPAN_MEMORY_COLUMNS, rows)


def read_span_memory(store: Store, run_id: int) -> pl.DataFrame:
    """The run's span memory rows: rank, span_id and the four columns (only spans of counted steps)."""
    return _frame(store, "span_memory_rows", SPAN_MEMORY_COLUMNS[1:], run_id, None).sort("rank", "span_id")


def write_step_memory(store: Store, run_id: int, rank: int, frame: pl.DataFrame) -> None:
    """Replace one rank's ``step_memory`` rows with ``frame`` (``STEP_MEMORY_COLUMNS`` but run_id)."""
    import polars as pl

    rows = frame.with_columns(pl.lit(run_id, dtype=pl.Int64).alias("run_id")).select(STEP_MEMORY_COLUMNS).rows()
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM step_memory WHERE run_id = {int(run_id)} AND rank = {int(rank)}")
        _insert(conn, store, "step_memory", STEP_MEMORY_COLUMNS, rows)


def read_step_memory(store: Store, run_id: int) -> pl.DataFrame:
    """The run's stored ``step_memory`` rows (without run_id), by rank, first_seq and device."""
    import polars as pl

    columns = STEP_MEMORY_COLUMNS[1:]
    with driver_cursor(store) as cur:
        cur.execute(f"SELECT {', '.join(columns)} FROM step_memory WHERE run_id = {mark(store)}", (run_id,))
        rows = cur.fetchall()
    schema = {c: pl.Int32 if c in ("rank", "step") else pl.String if c == "device" else pl.Int64 for c in columns}
    return pl.DataFrame(rows, schema=schema, orient="row").sort("rank", "first_seq", "device")


def range_steps(store: Store, run_id: int, rank: int, first_seqs: Sequence[int]) -> dict[int, int]:
    """first_seq -> its step under the run's step rule, for the stored spans: as ``span_steps``
    has it (the step of the latest ``step_starts`` row of the span's thread at or before it), read
    by key for these spans only (the view counts every span of the run)."""
    if not first_seqs:
        return {}
    m = mark(store)
    seqs = ", ".join(str(int(s)) for s in first_seqs)
    sql = ("SELECT s.span_id, (SELECT a.step FROM step_starts a WHERE a.run_id = s.run_id AND a.rank = s.rank "
           "AND a.thread_id = s.thread_id AND a.span_id <= s.span_id ORDER BY a.span_id DESC LIMIT 1) "
           f"FROM span_rows s WHERE s.run_id = {m} AND s.rank = {int(rank)} AND s.span_id IN ({seqs})")
    with driver_cursor(store) as cur:
        cur.execute(sql, (run_id,))
        return {int(s): int(step) for s, step in cur.fetchall() if step is not None}
