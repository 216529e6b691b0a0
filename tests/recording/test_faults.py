"""Faults of a real cluster, injected for real: PostgreSQL backends terminated
from an admin connection (what an idle-connection killer, a restart or a
failover does) and a SQLite file locked exclusively by another connection
past the busy timeout.  The recording resumes on a new connection: the
stored events equal the program's own count of module calls (plain global
forward hooks of the test's own), ``check`` is clean, the run completed,
and the run's metadata counts the reconnects.
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import torch
from torch import nn

from modtrace import Recorder
from modtrace.store.retry import ResumingWriter, is_transient, retry_seconds
from tests.helpers.harness import counted_calls
from tests.helpers.postgres import PG_URL


def model() -> nn.Module:
    return nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(40)])


def run_steps(rec: Recorder, net: nn.Module, until: threading.Event | None, min_steps: int) -> int:
    """Forward steps until ``until`` is set (None: at once) and at least ``min_steps`` ran."""
    x = torch.ones(2, 8)
    steps = 0
    with torch.no_grad():
        while steps < min_steps or (until is not None and not until.is_set()):
            net(x)
            rec.step()
            steps += 1
            if steps > 100_000:
                raise AssertionError("the fault injector never finished")
    return steps


def stored(url: str, run_id: int) -> dict[str, Any]:
    engine = sa.create_engine(url if "://" in url else f"sqlite:///{url}", poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        n, distinct, top = conn.exec_driver_sql(
            f"SELECT COUNT(*), COUNT(DISTINCT seq), MAX(seq) FROM events WHERE run_id = {run_id}").one()
        rank = conn.exec_driver_sql(
            f"SELECT event_count, reconnects, dropped_events, dropped_steps, status FROM run_ranks WHERE run_id = {run_id}"
        ).one()
        status = conn.exec_driver_sql(f"SELECT status FROM runs WHERE id = {run_id}").scalar()
    engine.dispose()
    return {"events": n, "distinct_seq": distinct, "max_seq": top, "event_count": rank[0], "reconnects": rank[1],
            "dropped_events": rank[2], "dropped_steps": rank[3], "rank_status": rank[4], "status": status}


def assert_whole(url: str, rec: Recorder, calls: int, run_cli: Any) -> dict[str, Any]:
    got = stored(url, rec.run_id)
    assert got["events"] == 2 * calls, got  # one enter and one exit per call: none lost, none twice
    assert got["distinct_seq"] == got["events"] == got["event_count"] == got["max_seq"] + 1, got
    assert (got["status"], got["rank_status"], got["dropped_events"]) == ("completed", "completed", 0), got
    result = run_cli("check", rec.run_name, "--db", url)
    assert result.code == 0 and "no nesting issues" in (result.out + result.err).lower(), result
    return got


# --- SQLite: another connection holds the file exclusively past the busy timeout


@contextmanager
def exclusive_lock(path: Path, hold_s: float, after_s: float = 0.0) -> Iterator[threading.Event]:
    """Another connection takes the write lock ``after_s`` into the block and
    holds it ``hold_s``; the event is set once it has let go."""
    released = threading.Event()
    taken = threading.Event()

    def hold() -> None:
        time.sleep(after_s)
        conn = sqlite3.connect(path, timeout=60, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        taken.set()
        time.sleep(hold_s)
        conn.execute("COMMIT")
        conn.close()
        released.set()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    try:
        assert taken.wait(30)
        yield released
    finally:
        thread.join()


@pytest.mark.parametrize("writer", ["process", "thread", "inline"])
def test_sqlite_locked_past_the_busy_timeout_resumes_and_loses_nothing(
    writer: str, db_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli: Any,
) -> None:
    monkeypatch.setenv("MODTRACE_BUSY_TIMEOUT_MS", "100")
    net = model()
    with counted_calls() as calls:
        with Recorder(db=str(db_path), run="locked", writer=writer, retry_s=60) as rec:
            run_steps(rec, net, None, 5)  # the writer is running
            rec.flush()
            steps_before = rec.step_count
            with exclusive_lock(db_path, hold_s=1.5) as released:
                run_steps(rec, net, released, 20)
                during = rec.step_count - steps_before
            run_steps(rec, net, None, 5)
        rec.wait_analyzed()  # the writer process analyses the run after the with
    got = assert_whole(str(db_path), rec, calls[0], run_cli)
    assert got["reconnects"] >= 1, got
    assert during > 20, "the program waited for the locked database"


def test_a_lock_outliving_the_deadline_stops_recording_as_before(db_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MODTRACE_BUSY_TIMEOUT_MS", "100")
    net = model()
    with Recorder(db=str(db_path), run="gone", writer="thread", retry_s=0.5) as rec:
        run_steps(rec, net, None, 3)
        rec.flush()
        with exclusive_lock(db_path, hold_s=3.0) as released:
            run_steps(rec, net, released, 3)
    rec.wait_analyzed()  # the writer process analyses the run after the with
    assert rec.status == "failed"
    err = capsys.readouterr().err
    assert "database is locked" in err and "recording stopped" in err
    assert stored(str(db_path), rec.run_id)["status"] == "failed"


def test_over_the_memory_bound_whole_steps_are_dropped_and_the_run_says_which(
    db_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("MODTRACE_BUSY_TIMEOUT_MS", "100")
    net = model()
    per_step = 2 * 121  # enter and exit of 1 + 40 + 80 modules
    with counted_calls() as calls:
        with Recorder(db=str(db_path), run="shed", writer="thread", retry_s=60, max_buffered=10 * per_step) as rec:
            run_steps(rec, net, None, 3)
            rec.flush()
            with exclusive_lock(db_path, hold_s=1.5) as released:
                run_steps(rec, net, released, 40)
        rec.wait_analyzed()  # the writer process analyses the run after the with
    got = stored(str(db_path), rec.run_id)
    assert got["status"] == "completed" and got["dropped_events"] > 0, got
    assert got["events"] + got["dropped_events"] == 2 * calls[0], got
    assert got["dropped_events"] % per_step == 0, "only whole steps are dropped"
    dropped: set[int] = set()
    for part in got["dropped_steps"].split(","):
        first, _, last = part.partition("-")
        dropped |= set(range(int(first), int(last or first) + 1))
    assert len(dropped) * per_step == got["dropped_events"] and min(dropped) >= 3, got
    with sa.create_engine(f"sqlite:///{db_path}").connect() as conn:
        kept = {r[0] for r in conn.exec_driver_sql("SELECT DISTINCT step FROM events")}
    assert not kept & dropped and kept | dropped == set(range(rec.step_count))
    assert "dropped while the database was unreachable" in capsys.readouterr().err


# --- PostgreSQL: backends terminated from an admin connection


def _killer(admin_url: str, app: str, kills: int, done: threading.Event, hits: list[str]) -> None:
    """Terminate our backends ``kills`` times at random moments, the first
    ones while a batch is being written (a backend of ours active or idle in
    its transaction)."""
    engine = sa.create_engine(admin_url, poolclass=sa.pool.NullPool)
    rng = random.Random()
    try:
        with engine.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT")
            deadline = time.monotonic() + 60
            while len(hits) < kills and time.monotonic() < deadline:
                inside = len(hits) < kills // 2
                states = "('active', 'idle in transaction')" if inside else "('active', 'idle in transaction', 'idle')"
                if not inside:
                    time.sleep(rng.uniform(0.02, 0.3))
                rows = conn.exec_driver_sql(
                    "SELECT pid, state, pg_terminate_backend(pid) FROM pg_stat_activity "
                    f"WHERE application_name = '{app}' AND state IN {states} AND pid <> pg_backend_pid()").all()
                hits += [str(r[1]) for r in rows if r[2]]
    finally:
        engine.dispose()
        done.set()


@pytest.mark.postgres
@pytest.mark.parametrize("writer", ["process", "thread"])
def test_postgres_backend_terminated_again_and_again_resumes_and_loses_nothing(
    writer: str, pg_url: str, run_cli: Any,
) -> None:
    app = f"mtfault_{uuid.uuid4().hex[:10]}"
    url = f"{pg_url}&application_name={app}"
    net = model()
    hits: list[str] = []
    done = threading.Event()
    with counted_calls() as calls:
        with Recorder(db=url, run="blips", writer=writer, retry_s=60) as rec:
            run_steps(rec, net, None, 5)
            killer = threading.Thread(target=_killer, args=(PG_URL, app, 6, done, hits), daemon=True)
            killer.start()
            run_steps(rec, net, done, 60)
            killer.join()
        rec.wait_analyzed()  # the writer process analyses the run after the with
    assert len(hits) >= 6 and {"active", "idle in transaction"} & set(hits), hits
    got = assert_whole(url, rec, calls[0], run_cli)
    assert got["reconnects"] >= 1, got


@pytest.mark.postgres
def test_postgres_restart_mid_run_resumes(pg_url: str, run_cli: Any) -> None:
    """Restarts the server: only where MODTRACE_TEST_PG_RESTART names the
    command that does it (the server must be this test's alone)."""
    restart = os.environ.get("MODTRACE_TEST_PG_RESTART")
    if not restart:
        pytest.skip("MODTRACE_TEST_PG_RESTART not set: restarting a shared server is not safe")
    net = model()
    done = threading.Event()

    def do_restart() -> None:
        time.sleep(0.5)
        subprocess.run(restart, shell=True, check=True, timeout=120)
        done.set()

    with counted_calls() as calls:
        with Recorder(db=pg_url, run="restart", retry_s=120) as rec:
            thread = threading.Thread(target=do_restart, daemon=True)
            thread.start()
            run_steps(rec, net, done, 60)
            thread.join()
        rec.wait_analyzed()  # the writer process analyses the run after the with
    assert assert_whole(pg_url, rec, calls[0], run_cli)["reconnects"] >= 1


# --- telling transient faults from the rest, on real errors


def test_transient_faults_are_told_by_type_and_code_not_text(tmp_path: Path) -> None:
    path = tmp_path / "x.db"
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("CREATE TABLE t (x)")
    holder.execute("BEGIN EXCLUSIVE")
    other = sqlite3.connect(path, timeout=0.05)
    with pytest.raises(sqlite3.OperationalError) as busy:
        other.execute("INSERT INTO t VALUES (1)")
    assert is_transient(busy.value)
    holder.execute("ROLLBACK")
    with pytest.raises(sqlite3.OperationalError) as missing:
        other.execute("SELECT * FROM no_such_table")
    assert not is_transient(missing.value)  # the same exception type, another result code
    assert not is_transient(ValueError("database is locked"))  # the text alone says nothing


@pytest.mark.postgres
def test_postgres_terminated_backend_is_transient_a_constraint_is_not(pg_url: str) -> None:
    engine = sa.create_engine(pg_url, poolclass=sa.pool.NullPool)
    admin = sa.create_engine(PG_URL, poolclass=sa.pool.NullPool)  # type: ignore[arg-type]
    with engine.connect() as conn:
        pid = conn.exec_driver_sql("SELECT pg_backend_pid()").scalar()
        conn.rollback()
        with admin.connect() as a:
            a.exec_driver_sql(f"SELECT pg_terminate_backend({int(pid)})")
            a.commit()
        with pytest.raises(sa.exc.DBAPIError) as killed:
            conn.exec_driver_sql("SELECT 1")
    assert is_transient(killed.value)
    with engine.connect() as conn:
        with pytest.raises(sa.exc.DBAPIError) as unique:
            conn.exec_driver_sql("CREATE TEMP TABLE u (x int primary key); INSERT INTO u VALUES (1), (1)")
    assert not is_transient(unique.value)
    engine.dispose()
    admin.dispose()


def test_retry_deadline_comes_from_the_argument_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from modtrace.core.errors import UsageError

    monkeypatch.delenv("MODTRACE_RETRY_S", raising=False)
    assert retry_seconds() == 120.0 and retry_seconds(3) == 3.0
    monkeypatch.setenv("MODTRACE_RETRY_S", "7.5")
    assert retry_seconds() == 7.5 and retry_seconds(1) == 1.0
    monkeypatch.setenv("MODTRACE_RETRY_S", "soon")
    with pytest.raises(UsageError, match="MODTRACE_RETRY_S"):
        retry_seconds()
    assert ResumingWriter.__init__.__defaults__ is not None
