"""Reads for ``modtrace memory`` (``api._memory``): a run's counted ranges and the recorder's
storage rows and forward returns (``mem_storages``, ``mem_returns``), as frames."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from modtrace.store.base import Store
from modtrace.store.cursor import driver_cursor, mark

if TYPE_CHECKING:
    import polars as pl

STORAGE_COLUMNS = ("rank", "first_seq", "sid", "device", "nbytes", "alloc_seq", "free_seq", "free_order")
RETURN_COLUMNS = ("rank", "call_id", "sid")


def _rows(store: Store, sql: str, run_id: int) -> list[tuple[Any, ...]]:
    with driver_cursor(store) as cur:
        cur.execute(sql, (run_id,))
        return [tuple(r) for r in cur.fetchall()]


def counted_ranges(store: Store, run_id: int) -> list[tuple[int, int, int]]:
    """(rank, first_seq, last_seq) of the run's counted ranges, in order."""
    sql = f"SELECT rank, first_seq, last_seq FROM counted_ranges WHERE run_id = {mark(store)} ORDER BY rank, first_seq"
    return [(int(a), int(b), int(c)) for a, b, c in _rows(store, sql, run_id)]


def has_storages(store: Store, run_id: int) -> bool:
    """Whether the recorder tracked tensor storages on some counted step of the run."""
    with driver_cursor(store) as cur:
        cur.execute(f"SELECT 1 FROM mem_storages WHERE run_id = {mark(store)} LIMIT 1", (run_id,))
        return cur.fetchone() is not None


def read_storages(store: Store, run_id: int) -> pl.DataFrame:
    """``STORAGE_COLUMNS`` of the run's tracked storages, the device by its name (``devices.name``,
    as torch prints it; its id as text where the name is missing)."""
    import polars as pl

    picked = ", ".join(f"ms.{c}" if c != "device" else "COALESCE(d.name, CAST(ms.device AS VARCHAR(20)))"
                       for c in STORAGE_COLUMNS)
    sql = (f"SELECT {picked} FROM mem_storages ms LEFT JOIN devices d ON d.run_id = ms.run_id AND d.rank = ms.rank "
           f"AND d.device_id = ms.device WHERE ms.run_id = {mark(store)} ORDER BY ms.rank, ms.first_seq, ms.sid")
    schema = {c: pl.Int64 for c in STORAGE_COLUMNS} | {"rank": pl.Int32, "device": pl.String}
    rows = _rows(store, sql, run_id)
    return pl.DataFrame(rows, schema=schema, orient="row")


def read_returns(store: Store, run_id: int) -> pl.DataFrame:
    """``RETURN_COLUMNS``: the storages each forward call of a counted step returned."""
    import polars as pl

    sql = f"SELECT {', '.join(RETURN_COLUMNS)} FROM mem_returns WHERE run_id = {mark(store)}"
    return pl.DataFrame(_rows(store, sql, run_id), schema={"rank": pl.Int32, "call_id": pl.Int64, "sid": pl.Int64},
                        orient="row")
