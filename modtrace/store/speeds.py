"""The speed probe's rows in the store (``step_speeds``): written by the recorder when a
rank's recording ends (``modtrace.recording.speed_probe``), read by the diff."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from modtrace.store.base import Store
from modtrace.store.cursor import driver_cursor, mark

if TYPE_CHECKING:
    import polars as pl

SPEED_COLUMNS = ("rank", "step", "seq", "ts_ns", "probe_ns", "cpu_ns", "real_ns", "threads", "work")
# One probe as the recorder keeps it: (step, seq, ts_ns, probe_ns, cpu_ns, real_ns, threads, work)
SpeedRow = tuple[int, int, int, int, int | None, int | None, int, int]


def write_speeds(store: Store, run_id: int, rank: int, rows: Sequence[SpeedRow]) -> None:
    """One rank's probes (``SpeedRow``), replacing any it had, in one transaction."""
    sql = (f"INSERT INTO step_speeds (run_id, rank, step, seq, ts_ns, probe_ns, cpu_ns, real_ns, threads, work) "
           f"VALUES ({', '.join(mark(store) for _ in range(10))})")
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM step_speeds WHERE run_id = {int(run_id)} AND rank = {int(rank)}")
        if rows:
            conn.exec_driver_sql(sql, [(run_id, rank, *r) for r in rows])


def read_speeds(store: Store, run_id: int, rank: int | None = None) -> pl.DataFrame:
    """The run's probes (``SPEED_COLUMNS``; of one rank when given), by rank and time; empty
    when it took none."""
    import polars as pl

    where = f"run_id = {mark(store)}" + ("" if rank is None else f" AND rank = {mark(store)}")
    params = (run_id,) if rank is None else (run_id, rank)
    with driver_cursor(store) as cur:
        cur.execute(f"SELECT {', '.join(SPEED_COLUMNS)} FROM step_speeds WHERE {where} ORDER BY rank, step", params)
        rows = cur.fetchall()
    schema = {"rank": pl.Int32, "step": pl.Int32, "seq": pl.Int64, "ts_ns": pl.Int64, "probe_ns": pl.Int64,
              "cpu_ns": pl.Int64, "real_ns": pl.Int64, "threads": pl.Int16, "work": pl.Int16}
    return pl.DataFrame(rows, schema=schema, orient="row")
