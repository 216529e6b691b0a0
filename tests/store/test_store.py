"""The storage layer on real databases: engines, creation on first write,
refusals that leave files untouched, runs, batched writes and event_log.

Tests taking ``any_db`` run on a SQLite file and, when MODTRACE_TEST_PG_URL is
set, on a fresh PostgreSQL schema: same schema, same behaviour.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from modtrace.core.codes import Kind, Phase, Status
from modtrace.core.contracts import Batch
from modtrace.core.errors import RunNotFound, StoreError, UsageError
from modtrace.results.materialize import materialize
from modtrace.store.engine import DEFAULT_DB, open_store, read_revision, resolve_db
from modtrace.store.runs import (
    RunNameTaken,
    add_rank,
    create_run,
    finish_rank,
    list_runs,
    resolve_run,
    run_details,
)
from modtrace.store.schema import HEAD, events, modules, nesting_issues, runs, span_rows
from modtrace.store.writer import EVENT_COLUMNS, ROWS_PER_STATEMENT, RankWriter
from tests.helpers.harness import update_rank_progress


def _siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


# --- resolving and opening ---------------------------------------------------


def test_db_resolution_prefers_option_then_env_then_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODTRACE_DB", "/from/env.db")
    assert resolve_db("given.db") == "given.db"
    assert resolve_db(None) == "/from/env.db"
    monkeypatch.delenv("MODTRACE_DB")
    assert resolve_db(None) == DEFAULT_DB == "modtrace.db"


def test_default_db_is_modtrace_db_in_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MODTRACE_DB")
    monkeypatch.chdir(tmp_path)
    store = open_store(create=True)
    store.dispose()
    assert store.path == tmp_path / "modtrace.db"
    assert (tmp_path / "modtrace.db").is_file()


def test_sqlite_connections_use_wal_busy_timeout_and_foreign_keys(db_path: Path) -> None:
    store = open_store(str(db_path), create=True)
    try:
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 60_000
    finally:
        store.dispose()


def test_sqlite_url_is_the_same_file_as_the_path(db_path: Path) -> None:
    open_store(f"sqlite:///{db_path}", create=True).dispose()
    store = open_store(str(db_path))
    store.dispose()
    assert store.path == db_path and not store.created


def test_in_memory_sqlite_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="in-memory SQLite"):
        open_store("sqlite://", create=True)


def test_first_write_creates_the_database_at_head(any_db: str) -> None:
    store = open_store(any_db, create=True)
    try:
        assert store.created
        assert read_revision(store.engine) == (HEAD, True)
    finally:
        store.dispose()
    again = open_store(any_db, create=True)
    again.dispose()
    assert not again.created


def test_read_open_of_missing_file_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "missing.db"
    with pytest.raises(StoreError, match="no modtrace database at"):
        open_store(str(path))
    assert _siblings(path) == []
    with pytest.raises(StoreError, match="no modtrace database at"):
        open_store(str(tmp_path / "no" / "such" / "dir.db"))
    assert _siblings(path) == []


def test_read_open_of_empty_postgres_schema_creates_nothing(pg_url: str) -> None:
    with pytest.raises(StoreError, match="has no modtrace schema yet"):
        open_store(pg_url)
    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            assert sa.inspect(conn).get_table_names() == []
    finally:
        engine.dispose()


@pytest.mark.parametrize("create", [False, True], ids=["read", "write"])
def test_non_sqlite_file_is_refused_untouched(tmp_path: Path, create: bool, digest) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database\n" * 50)
    before = digest(path)
    with pytest.raises(StoreError, match="is not a SQLite database; refusing to touch it"):
        open_store(str(path), create=create)
    assert digest(path) == before
    assert _siblings(path) == ["notes.db"]


@pytest.mark.parametrize("create", [False, True], ids=["read", "write"])
def test_other_applications_sqlite_is_refused_untouched(tmp_path: Path, create: bool, digest) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO customers (name) VALUES ('ada')")
    before = digest(path)
    with pytest.raises(StoreError, match="SQLite database of another application"):
        open_store(str(path), create=create)
    assert digest(path) == before
    assert _siblings(path) == ["app.db"]


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="is a directory"):
        open_store(str(tmp_path), create=True)
    assert list(tmp_path.iterdir()) == []


def test_empty_file_is_refused_by_reads_and_initialised_by_writes(tmp_path: Path) -> None:
    path = tmp_path / "empty.db"
    path.touch()
    with pytest.raises(StoreError, match="is empty, not a modtrace database"):
        open_store(str(path))
    assert path.stat().st_size == 0
    store = open_store(str(path), create=True)
    store.dispose()
    assert store.created and read_revision(store.engine)[0] == HEAD


def _set_revision(url: str, rev: str) -> None:
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE alembic_version SET version_num = :v"), {"v": rev})
    finally:
        engine.dispose()


def _url(any_db: str) -> str:
    return any_db if "://" in any_db else f"sqlite:///{any_db}"


@pytest.mark.parametrize("create", [False, True], ids=["read", "write"])
def test_newer_revision_is_refused(any_db: str, create: bool) -> None:
    open_store(any_db, create=True).dispose()
    _set_revision(_url(any_db), "ffff")
    with pytest.raises(StoreError, match=r"schema revision ffff, newer than this modtrace knows .*; upgrade modtrace"):
        open_store(any_db, create=create)


def test_postgres_tables_of_another_application_are_not_ours(pg_url: str) -> None:
    engine = sa.create_engine(pg_url)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE runs (id int primary key, what text)")
            conn.exec_driver_sql("INSERT INTO runs VALUES (1, 'a marathon')")
        with pytest.raises(StoreError, match="has no modtrace schema"):
            open_store(pg_url)
        with pytest.raises(StoreError, match="already has tables named runs that modtrace did not create"):
            open_store(pg_url, create=True)
        with engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT * FROM runs").all() == [(1, "a marathon")]
            assert sa.inspect(conn).get_table_names() == ["runs"]
    finally:
        engine.dispose()


_RACE_CHILD = """
import sys
from modtrace.store.engine import Store, open_store
print("ready", flush=True)
sys.stdin.readline()
store = open_store(sys.argv[1], create=True)
store.dispose()
print("created" if store.created else "opened", flush=True)
"""


@pytest.mark.slow
def test_processes_racing_to_create_the_database_all_succeed(any_db: str) -> None:
    # Ranks of one launch start together and may all find the database
    # missing; each must end up with a usable database at head.
    procs = [
        subprocess.Popen([sys.executable, "-c", _RACE_CHILD, any_db], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    for p in procs:  # release all of them at once
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(out.strip())
    assert set(results) <= {"created", "opened"} and "created" in results
    store = open_store(any_db)
    try:
        assert read_revision(store.engine)[0] == HEAD
    finally:
        store.dispose()


# --- runs ---------------------------------------------------------------------


def test_run_names_are_unique_unless_joining(any_db: str) -> None:
    store = open_store(any_db, create=True)
    try:
        run_id, created = create_run(store, "exp", {"command": "python train.py", "tags": {"lr": "0.1"}})
        assert created
        with pytest.raises(RunNameTaken, match="a run named 'exp' already exists") as info:
            create_run(store, "exp", {})
        assert info.value.exit_code == 2
        assert create_run(store, "exp", {}, join=True) == (run_id, False)
        details = run_details(store, run_id)
        assert details["tags"] == {"lr": "0.1"} and details["command"] == "python train.py"
    finally:
        store.dispose()


def test_a_rank_is_recorded_once(any_db: str) -> None:
    store = open_store(any_db, create=True)
    try:
        run_id, _ = create_run(store, "r", {})
        add_rank(store, run_id, 0, wall_anchor_ns=1)
        with pytest.raises(UsageError, match="rank 0 of run .* is already recorded"):
            add_rank(store, run_id, 0, wall_anchor_ns=2)
    finally:
        store.dispose()


def test_run_status_is_the_worst_of_its_ranks_once_all_ended(any_db: str) -> None:
    store = open_store(any_db, create=True)
    try:
        run_id, _ = create_run(store, "ddp", {"world_size": 2})
        add_rank(store, run_id, 0, wall_anchor_ns=0)
        add_rank(store, run_id, 1, wall_anchor_ns=0)
        update_rank_progress(store, run_id, 0, event_count=10, step_count=3)
        update_rank_progress(store, run_id, 1, event_count=12, step_count=2)
        finish_rank(store, run_id, 0, "completed")
        (row,) = list_runs(store)
        assert row["status"] == "running" and row["ended_at"] is None
        finish_rank(store, run_id, 1, "failed", error="RuntimeError: boom")
        (row,) = list_runs(store)
        assert row["status"] == "failed" and row["ended_at"] is not None
        assert (row["events"], row["steps"], row["ranks"]) == (22, 3, 2)
        assert row["error"] == "RuntimeError: boom"
        assert row["duration_s"] is not None and row["duration_s"] >= 0
    finally:
        store.dispose()


def test_run_references(any_db: str) -> None:
    store = open_store(any_db, create=True)
    try:
        ids = [create_run(store, name, {})[0] for name in ("baseline", "tuned", "7")]
        assert resolve_run(store, "baseline").id == ids[0]
        assert resolve_run(store, str(ids[1])).name == "tuned"
        assert resolve_run(store, "7").id == ids[2]  # a name wins over an id
        assert resolve_run(store, "@").name == "7"
        assert resolve_run(store, "@~2").name == "baseline"
        with pytest.raises(RunNotFound, match=r"@~3 refers to no run: .* has 3 run\(s\)"):
            resolve_run(store, "@~3")
        with pytest.raises(RunNotFound, match="no run 'basline' in .*; did you mean 'baseline'"):
            resolve_run(store, "basline")
    finally:
        store.dispose()


# --- writes and event_log -----------------------------------------------------


def _event(seq: int, ts: int, kind: Kind, module: int, phase: Phase = Phase.FORWARD,
           status: Status = Status.OK, graph_task: int | None = None) -> tuple[object, ...]:
    values = {
        "seq": seq, "ts_ns": ts, "kind": int(kind), "module_id": module, "phase": int(phase),
        "call_id": module, "step": 0, "thread_id": 0, "device_id": 0, "stream": None,
        "status": int(status), "graph_task": graph_task, "tie": 0,
    }
    return tuple(values[c] for c in EVENT_COLUMNS)


def test_written_events_read_back_with_names_in_event_log(any_db: str) -> None:
    store = open_store(any_db, create=True)
    try:
        run_id, _ = create_run(store, "r", {})
        add_rank(store, run_id, 0, wall_anchor_ns=5_000)
        writer = RankWriter(store, run_id, 0)
        writer.write(Batch(
            [_event(0, 10, Kind.ENTER, 0), _event(1, 20, Kind.ENTER, 1), _event(2, 30, Kind.EXIT, 1),
             _event(3, 40, Kind.EXIT, 0, status=Status.ERROR)],
            modules=[(0, "Net", "Net", None), (1, "Net.fc", "Linear", 0)],
            threads=[(0, 123, "MainThread")],
            devices=[(0, "cpu")],
            progress=(4, 0),
        ))
        writer.write(Batch([_event(4, 50, Kind.ENTER, 1, Phase.BACKWARD, graph_task=9),
                      _event(5, 60, Kind.EXIT, 1, Phase.BACKWARD, Status.CLOSED_AT_END_OF_BACKWARD, 9)],
                     progress=(6, 1)))
        with store.engine.connect() as conn:
            rows = conn.execute(sa.text(
                "SELECT seq, kind, fqn, module_type, phase, status, device, graph_task, wall_ns"
                " FROM event_log WHERE run_id = :r ORDER BY seq"), {"r": run_id}).all()
        assert [tuple(r) for r in rows] == [
            (0, "enter", "Net", "Net", "forward", "ok", "cpu", None, 5_010),
            (1, "enter", "Net.fc", "Linear", "forward", "ok", "cpu", None, 5_020),
            (2, "exit", "Net.fc", "Linear", "forward", "ok", "cpu", None, 5_030),
            (3, "exit", "Net", "Net", "forward", "error", "cpu", None, 5_040),
            (4, "enter", "Net.fc", "Linear", "backward", "ok", "cpu", 9, 5_050),
            (5, "exit", "Net.fc", "Linear", "backward", "closed_at_end_of_backward", "cpu", 9, 5_060),
        ]
        (listed,) = list_runs(store)
        assert (listed["events"], listed["steps"]) == (6, 1)
    finally:
        store.dispose()


def test_a_failed_batch_writes_nothing(any_db: str) -> None:
    store = open_store(any_db, create=True)
    try:
        run_id, _ = create_run(store, "r", {})
        add_rank(store, run_id, 0, wall_anchor_ns=0)
        writer = RankWriter(store, run_id, 0)
        writer.write(Batch([_event(0, 1, Kind.ENTER, 0)], modules=[(0, "Net", "Net", None)]))
        with pytest.raises(IntegrityError):  # seq 0 again: the whole batch must roll back
            writer.write(Batch([_event(1, 2, Kind.EXIT, 0), _event(0, 3, Kind.EXIT, 0)],
                         modules=[(1, "Net.fc", "Linear", 0)]))
        with store.engine.connect() as conn:
            assert conn.execute(sa.select(sa.func.count()).select_from(events)).scalar() == 1
            assert conn.execute(sa.select(sa.func.count()).select_from(modules)).scalar() == 1
    finally:
        store.dispose()


@pytest.mark.parametrize("n", [1, ROWS_PER_STATEMENT - 1, ROWS_PER_STATEMENT, ROWS_PER_STATEMENT + 1, 3 * ROWS_PER_STATEMENT + 7])
def test_batches_of_any_size_are_written_whole_and_in_order(any_db: str, n: int) -> None:
    # Events go as multi-row statements plus a remainder: every size around
    # the statement's row count must come back exactly, value for value.
    store = open_store(any_db, create=True)
    writer = None
    try:
        run_id, _ = create_run(store, "r", {})
        add_rank(store, run_id, 0, wall_anchor_ns=0)
        writer = RankWriter(store, run_id, 0)
        rows = [_event(i, 10 * i + 1, Kind(i % 2), i % 5, Phase(i % 3), Status(i % 4), None if i % 3 == 0 else 100 + i)
                for i in range(n)]
        writer.write(Batch(rows[: n // 2], modules=[(m, f"Net.m{m}", "Linear", None) for m in range(5)]))
        writer.write(Batch(rows[n // 2:], progress=(n, 0)))
        cols = ", ".join(EVENT_COLUMNS)
        with store.engine.connect() as conn:
            back = conn.exec_driver_sql(f"SELECT {cols} FROM events WHERE run_id = {run_id} ORDER BY seq").all()
        assert [tuple(r) for r in back] == rows
    finally:
        if writer is not None:
            writer.close()
        store.dispose()


def test_a_writer_goes_on_after_a_failed_batch(any_db: str) -> None:
    store = open_store(any_db, create=True)
    writer = None
    try:
        run_id, _ = create_run(store, "r", {})
        add_rank(store, run_id, 0, wall_anchor_ns=0)
        writer = RankWriter(store, run_id, 0)
        first = [_event(i, i, Kind.ENTER, 0) for i in range(100)]
        writer.write(Batch(first, modules=[(0, "Net", "Net", None)]))
        with pytest.raises(IntegrityError):  # seq 99 again, in the multi-row part
            writer.write(Batch([_event(i, i, Kind.EXIT, 0) for i in range(99, 199)]))
        writer.write(Batch([_event(i, i, Kind.EXIT, 0) for i in range(100, 200)], progress=(200, 0)))
        with store.engine.connect() as conn:
            seqs = [r[0] for r in conn.exec_driver_sql(f"SELECT seq FROM events WHERE run_id = {run_id} ORDER BY seq")]
        assert seqs == list(range(200))
    finally:
        if writer is not None:
            writer.close()
        store.dispose()


def test_foreign_keys_are_enforced_and_deleting_a_run_cascades(any_db: str) -> None:
    store = open_store(any_db, create=True)
    try:
        with pytest.raises(IntegrityError):
            RankWriter(store, 999, 0).write(Batch([], modules=[(0, "Net", "Net", None)]))
        run_id, _ = create_run(store, "r", {})
        add_rank(store, run_id, 0, wall_anchor_ns=0)
        RankWriter(store, run_id, 0).write(Batch([_event(0, 1, Kind.ENTER, 0)], modules=[(0, "Net", "Net", None)]))
        other, _ = create_run(store, "kept", {})
        add_rank(store, other, 0, wall_anchor_ns=0)
        RankWriter(store, other, 0).write(Batch([_event(0, 1, Kind.ENTER, 0)], modules=[(0, "Net", "Net", None)]))
        for run in (run_id, other):
            materialize(store, run, complete=False)  # one unclosed span each
        with store.engine.begin() as conn:
            conn.execute(sa.delete(runs).where(runs.c.id == run_id))
        with store.engine.connect() as conn:
            for table in (events, modules, span_rows, nesting_issues):
                counts = dict(conn.execute(sa.select(table.c.run_id, sa.func.count()).group_by(table.c.run_id)).all())
                assert counts == {other: 1}, table.name  # the deleted run's rows are gone, the other's kept
    finally:
        store.dispose()
