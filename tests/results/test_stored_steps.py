"""A run's steps stored with its analysis (tables step_rows and step_starts, revision 0014): the
``steps`` and ``span_steps`` views read a run's rows by key, equal the polars step table however
the spans were analysed (held, or read back from the store in rounds; a database upgraded from
revision 0013), are replaced with the spans and deleted with the run; PostgreSQL plans from
fresh statistics.  Real threads and models on CPU, real SQLite files and PostgreSQL."""

from __future__ import annotations

import shutil
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl
import torch
from torch import nn

import modtrace
from modtrace.analysis.step_time import STEP_COLUMNS, step_table
from modtrace.results.materialize import materialize
from modtrace.store.engine import open_store
from tests.helpers.database import db_rows

FROZEN = Path(__file__).resolve().parents[1] / "data" / "frozen"


def _serve(db: str, run: str, requests: int) -> None:
    """A pool of two worker threads serving requests: steps follow root calls, on two threads."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).eval()

    def serve(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            out: torch.Tensor = m(x)
            return out

    with modtrace.Recorder(db=db, run=run, analyze=False, handle_sigterm=False):
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(serve, [torch.randn(1, 8) for _ in range(requests)]))


def _assert_views_equal_polars(db: str, run: str) -> None:
    from modtrace.api._cli import restep

    with modtrace.open(db) as database:
        frame = restep(database, run, database.spans(run), None).frame
    py = step_table(frame)
    (run_id,) = db_rows(db, f"SELECT id FROM runs WHERE name = '{run}'")[0]
    cols = ", ".join(STEP_COLUMNS)
    sql = pl.DataFrame(db_rows(db, f"SELECT {cols} FROM steps WHERE run_id = {run_id} ORDER BY rank, step"),
                       schema=py.schema, orient="row")
    assert sql.height > 0 and sql.equals(py), (sql, py)
    spans = frame.select(pl.col("rank").cast(pl.Int64), pl.col("span_id"), pl.col("step").cast(pl.Int64)).sort(
        "rank", "span_id")
    view = pl.DataFrame(db_rows(db, f"SELECT rank, span_id, step FROM span_steps WHERE run_id = {run_id}"),
                        schema=spans.schema, orient="row").sort("rank", "span_id")
    assert view.equals(spans)


def test_steps_read_back_from_the_store_equal_the_polars_step_table(any_db: str) -> None:
    """A rank analysed in rounds larger than it holds: its steps come from the spans the
    transaction wrote, read back on its own connection."""
    _serve(any_db, "serve", requests=6)
    store = open_store(any_db)
    try:
        assert materialize(store, 1, round_rows=7, chunk_rows=7).spans.height == 0  # not held
    finally:
        store.dispose()
    _assert_views_equal_polars(any_db, "serve")
    assert {r[0] for r in db_rows(any_db, "SELECT step_rule FROM steps")} == {"root"}


def test_the_step_views_read_one_run_by_key(db_path: Path, run_cli: Any) -> None:
    _serve(str(db_path), "serve", requests=2)
    assert run_cli("analyze", "serve", "--db", str(db_path)).code == 0
    conn = sqlite3.connect(db_path)
    try:
        for view in ("steps", "span_steps"):
            plan = [r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN SELECT * FROM {view} WHERE run_id = 1")]
            tables = [p for p in plan if p.startswith(("SCAN", "SEARCH")) and "subquery" not in p]
            # every table is searched by its key from run_id; no scan of every run's spans
            assert all(p.startswith("SEARCH") or p in ("SCAN c",) for p in tables), (view, plan)
            assert any("(run_id=?" in p for p in tables), (view, plan)
    finally:
        conn.close()


def test_steps_are_replaced_with_the_spans_and_deleted_with_the_run(any_db: str, run_cli: Any) -> None:
    _serve(any_db, "serve", requests=3)
    _serve(any_db, "other", requests=2)
    for _ in range(2):
        for run in ("serve", "other"):
            assert run_cli("analyze", run, "--db", any_db).code == 0
    count = "SELECT (SELECT count(*) FROM step_rows WHERE run_id = {0}), (SELECT count(*) FROM step_starts WHERE run_id = {0})"
    assert db_rows(any_db, count.format(1)) == [(3, 3)]  # each request a step, each step a start on its thread
    _assert_views_equal_polars(any_db, "serve")
    store = open_store(any_db)  # modtrace's connections keep SQLite's foreign keys on
    try:
        with store.engine.begin() as conn:
            conn.exec_driver_sql("DELETE FROM runs WHERE id = 1")
    finally:
        store.dispose()
    assert db_rows(any_db, count.format(1)) == [(0, 0)]
    assert db_rows(any_db, count.format(2)) == [(2, 2)]


def test_a_database_upgraded_from_0013_has_the_steps_its_views_computed(tmp_path: Path, run_cli: Any) -> None:
    db = tmp_path / "0013.db"
    shutil.copyfile(FROZEN / "0013.db", db)
    before = db_rows(str(db), "SELECT * FROM steps ORDER BY run_id, rank, step")
    spans_before = db_rows(str(db), "SELECT run_id, rank, span_id, step FROM span_steps ORDER BY run_id, rank, span_id")
    assert run_cli("db", "upgrade", "--db", str(db)).code == 0
    assert before and db_rows(str(db), "SELECT * FROM steps ORDER BY run_id, rank, step") == before
    assert db_rows(str(db), "SELECT run_id, rank, span_id, step FROM span_steps ORDER BY run_id, rank, span_id") == spans_before
    _assert_views_equal_polars(str(db), "frozen-ddp")


def test_postgres_plans_a_fresh_analysis_from_statistics(pg_url: str, run_cli: Any) -> None:
    _serve(pg_url, "serve", requests=2)
    assert run_cli("analyze", "serve", "--db", pg_url).code == 0
    analysed = dict(db_rows(pg_url, "SELECT relname, last_analyze IS NOT NULL FROM pg_stat_user_tables "
                                    "WHERE relname IN ('span_rows', 'modules', 'step_rows', 'step_starts') "
                                    "AND schemaname = current_schema()"))
    assert analysed == {"span_rows": True, "modules": True, "step_rows": True, "step_starts": True}
