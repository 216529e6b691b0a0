"""``runs.analysis``: a run not analysed yet is told from one with nothing in it.

Real recordings (the CLI, ``modtrace.Recorder`` with its writer process, a
recording killed with SIGKILL) on SQLite and PostgreSQL.  The state is read
from the ``runs`` table with plain SQL; the module names a query must list
come from torch (``named_modules``); ``modtrace query`` either answers from
stored spans or refuses in one line that names ``modtrace analyze``, never
printing an empty table that reads as an answer.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

import modtrace
from tests.helpers.database import db_rows
from tests.helpers.models import tiny_model_and_opt, train_step

# Three steps of Sequential(Linear, ReLU, Linear); waits on stdin when asked, its events flushed.
TARGET = textwrap.dedent(
    """
    import sys
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.ones(3, 4)).sum().backward()
        opt.step()
    if sys.argv[1:] == ["wait"]:
        print("ready", flush=True)
        sys.stdin.readline()
    """
)
# The fully qualified names the target's modules get: root class name, then torch's attribute path.
TARGET_FQNS = {"Sequential", "Sequential.0", "Sequential.1", "Sequential.2"}


def state(db: str, name: str) -> str:
    return str(db_rows(db, "SELECT analysis FROM runs WHERE name = :n", n=name)[0][0])


def rank_states(db: str, name: str) -> list[tuple[int, str]]:
    return [(int(r), str(a)) for r, a in db_rows(
        db, "SELECT k.rank, k.analysis FROM run_ranks k JOIN runs r ON r.id = k.run_id WHERE r.name = :n "
            "ORDER BY k.rank", n=name)]


def n_events(db: str, name: str) -> int:
    return int(db_rows(db, "SELECT count(*) FROM event_log e JOIN runs r ON r.id = e.run_id WHERE r.name = :n",
                       n=name)[0][0])


def assert_refused(run_cli: Any, db: str, name: str, why: str) -> None:
    """``query top_self_time --run NAME`` fails with one line naming ``modtrace analyze NAME``, in every format."""
    for fmt in ("table", "json", "csv"):
        res = run_cli("query", "top_self_time", "--run", name, "--db", db, "--format", fmt)
        assert (res.code, res.out) == (1, ""), res
        assert res.err.count("\n") == 1 and res.err.startswith(f"modtrace: error: run {name!r} {why} "), res.err
        assert res.err.endswith(f"modtrace analyze {name}\n"), res.err


def top_fqns(run_cli: Any, db: str, name: str) -> set[str]:
    res = run_cli("query", "top_self_time", "--run", name, "--db", db, "--format", "json")
    assert res.code == 0, res
    return {r["fqn"] for r in json.loads(res.out)}


def listed_state(run_cli: Any, db: str, name: str) -> tuple[str, str]:
    """(the run's analysis in ``runs --format json``, in ``show --format json``)."""
    listed = {r["name"]: r for r in json.loads(run_cli("runs", "--db", db, "--format", "json").out)}
    shown = json.loads(run_cli("show", name, "--db", db, "--format", "json").out)
    return listed[name]["analysis"], shown["analysis"]


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "work"
    d.mkdir()
    (d / "target.py").write_text(TARGET)
    monkeypatch.chdir(d)
    return d


def test_a_run_recorded_with_no_analyze_is_not_analysed_until_modtrace_analyze(
    run_cli: Any, work: Path, any_db: str
) -> None:
    assert run_cli("record", "-q", "--no-analyze", "--db", any_db, "--run", "bare", "target.py").code == 0
    assert n_events(any_db, "bare") == 3 * 4 * 2 * 2  # 3 steps, 4 modules, forward and backward, enter and exit
    assert state(any_db, "bare") == "none"
    assert rank_states(any_db, "bare") == [(0, "none")]
    assert listed_state(run_cli, any_db, "bare") == ("none", "none")
    shown = run_cli("show", "bare", "--db", any_db).out.splitlines()
    assert any(line.split()[:2] == ["analysis", "none"] and "modtrace analyze" in line for line in shown)
    assert_refused(run_cli, any_db, "bare", "is not analysed yet (runs.analysis = none)")
    # A query over the events alone answers: they are stored.
    counted = run_cli("query", "SELECT count(*) AS n FROM event_log WHERE run_id = :run_id", "--run", "bare",
                      "--db", any_db, "--format", "json")
    assert (counted.code, json.loads(counted.out)) == (0, [{"n": 48}])

    assert run_cli("analyze", "bare", "--db", any_db).code == 0
    assert state(any_db, "bare") == "stored"
    assert rank_states(any_db, "bare") == [(0, "stored")]
    assert listed_state(run_cli, any_db, "bare") == ("stored", "stored")
    assert top_fqns(run_cli, any_db, "bare") == TARGET_FQNS


def test_a_run_with_nothing_in_it_answers_empty_once_analysed(run_cli: Any, work: Path, any_db: str) -> None:
    """Nothing there: a run without events, analysed, answers with no rows (and exit 0)."""
    (work / "empty.py").write_text("x = 1\n")
    assert run_cli("record", "-q", "--db", any_db, "--run", "empty", "empty.py").code == 0
    assert (n_events(any_db, "empty"), state(any_db, "empty")) == (0, "stored")
    res = run_cli("query", "top_self_time", "--run", "empty", "--db", any_db, "--format", "json")
    assert (res.code, res.out, res.err) == (0, "[]\n", "")


def _spawn(cwd: Path, db: str, name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "modtrace", "record", "-q", "--db", db, "--run", name, "target.py", "wait"],
        cwd=cwd, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}, start_new_session=True,
    )


def test_a_killed_recording_is_not_analysed_until_modtrace_analyze(run_cli: Any, work: Path, any_db: str) -> None:
    proc = _spawn(work, any_db, "killed")
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n", proc.communicate()
        deadline = time.monotonic() + 60
        while n_events(any_db, "killed") < 48 and time.monotonic() < deadline:  # every event flushed
            time.sleep(0.1)
        assert n_events(any_db, "killed") == 48
        os.killpg(proc.pid, signal.SIGKILL)  # the recording and its writer process
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert db_rows(any_db, "SELECT status FROM runs WHERE name = 'killed'") == [("running",)]
    assert state(any_db, "killed") == "none"
    assert_refused(run_cli, any_db, "killed", "is not analysed yet (runs.analysis = none)")
    assert run_cli("analyze", "killed", "--db", any_db).code == 0
    assert state(any_db, "killed") == "stored"
    assert top_fqns(run_cli, any_db, "killed") == TARGET_FQNS


@contextmanager
def _analysis_held(db: str) -> Iterator[None]:
    """PostgreSQL: no analysis can write its spans until this ends (the recording itself never
    writes ``span_rows``, so it goes on)."""
    engine = sa.create_engine(db, poolclass=sa.pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.exec_driver_sql("LOCK TABLE span_rows IN SHARE MODE")
            yield
    finally:
        engine.dispose()


@pytest.mark.postgres
@pytest.mark.parametrize("killed", [False, True], ids=["under_way", "writer_killed"])
def test_a_background_analysis_under_way_reads_as_not_analysed(run_cli: Any, pg_url: str, killed: bool) -> None:
    model, opt = tiny_model_and_opt()
    fqns = {f"Sequential.{n}" if n else "Sequential" for n, _ in model.named_modules()}
    assert run_cli("db", "upgrade", "--db", pg_url).code == 0  # the tables, to hold one
    with _analysis_held(pg_url):
        with modtrace.Recorder(db=pg_url, run="bg", writer="process", handle_sigterm=False) as rec:
            for _ in range(3):
                train_step(model, opt)
            rec.flush()
            writer = rec.writer_pid
        assert rec.status == "completed" and writer is not None
        assert not rec.wait_analyzed(timeout=1)  # the writer process is at it, held
        assert state(pg_url, "bg") == "none"
        assert listed_state(run_cli, pg_url, "bg") == ("none", "none")
        assert_refused(run_cli, pg_url, "bg", "is not analysed yet (runs.analysis = none)")
        if killed:
            os.kill(writer, signal.SIGKILL)
    assert rec.wait_analyzed(timeout=120)
    assert rec.analysis_stored is (not killed)
    if killed:
        assert state(pg_url, "bg") == "none"
        assert_refused(run_cli, pg_url, "bg", "is not analysed yet (runs.analysis = none)")
        assert run_cli("analyze", "bg", "--db", pg_url).code == 0
    assert state(pg_url, "bg") == "stored"
    assert top_fqns(run_cli, pg_url, "bg") == fqns


def test_a_reader_sees_none_then_stored_with_the_spans(any_db: str) -> None:
    """While the writer process analyses the run, a reader polling the run sees it not analysed
    (its spans appear as the rounds that follow the recording commit them,
    ``results.incremental``; readers go by ``runs.analysis``), then stored with all of them:
    never stored with some."""
    model, opt = tiny_model_and_opt()
    seen: list[tuple[str, int]] = []
    stop = threading.Event()
    sql = ("SELECT r.analysis, (SELECT count(*) FROM span_rows s WHERE s.run_id = r.id) FROM runs r "
           "WHERE r.name = 'polled'")

    def poll() -> None:
        engine = sa.create_engine(any_db if "://" in any_db else f"sqlite:///{any_db}", poolclass=sa.pool.NullPool)
        try:
            while not stop.is_set():
                with engine.connect() as conn:
                    row = conn.exec_driver_sql(sql).first()
                if row is not None and (not seen or seen[-1] != (row[0], row[1])):
                    seen.append((str(row[0]), int(row[1])))
                if row is not None and row[0] == "stored":
                    return
        finally:
            engine.dispose()

    poller = threading.Thread(target=poll)
    with modtrace.Recorder(db=any_db, run="polled", writer="process", handle_sigterm=False) as rec:
        for _ in range(3):
            train_step(model, opt)
        rec.flush()
        poller.start()
    try:
        assert rec.wait_analyzed(timeout=120) and rec.analysis_stored is True
        poller.join(timeout=60)
    finally:
        stop.set()
        poller.join()
    spans = 3 * 4 * 2  # 3 steps, 4 modules, forward and backward
    assert seen[0] == ("none", 0) and seen[-1] == ("stored", spans), seen
    assert all(state == "none" for state, _ in seen[:-1]), seen


def test_ranks_analysed_one_by_one_read_partial_until_the_last(run_cli: Any, any_db: str) -> None:
    model, opt = tiny_model_and_opt()
    for rank in (0, 1):
        with modtrace.Recorder(db=any_db, run="ddp", rank=rank, world_size=2, writer="thread",
                               handle_sigterm=False) as rec:
            train_step(model, opt)
        assert rec.analysis_stored is True
        if rank == 0:  # rank 0 analysed as it ended; rank 1 not begun
            assert (state(any_db, "ddp"), rank_states(any_db, "ddp")) == ("partial", [(0, "stored")])
            assert listed_state(run_cli, any_db, "ddp") == ("partial", "partial")
            assert_refused(run_cli, any_db, "ddp", "is analysed for only some of its ranks (runs.analysis = partial)")
    assert (state(any_db, "ddp"), rank_states(any_db, "ddp")) == ("stored", [(0, "stored"), (1, "stored")])
    assert top_fqns(run_cli, any_db, "ddp") == {"Sequential", "Sequential.0", "Sequential.1", "Sequential.2"}


@pytest.mark.parametrize("analyze", [False, True], ids=["no_analyze", "analyze"])
def test_an_analysis_of_a_live_run_is_stale_once_the_run_goes_on(run_cli: Any, any_db: str, analyze: bool) -> None:
    model, opt = tiny_model_and_opt()
    with modtrace.Recorder(db=any_db, run="live", writer="thread", analyze=analyze, handle_sigterm=False) as rec:
        train_step(model, opt)
        rec.flush()
        assert run_cli("analyze", "live", "--db", any_db).code == 0
        assert state(any_db, "live") == "stored"  # every event so far
        train_step(model, opt)
    if analyze:  # the recorder's own analysis, after the end, replaced the early one
        assert rec.analysis_stored is True and state(any_db, "live") == "stored"
    else:
        assert (state(any_db, "live"), rank_states(any_db, "live")) == ("stale", [(0, "stale")])
        assert listed_state(run_cli, any_db, "live") == ("stale", "stale")
        assert_refused(run_cli, any_db, "live", "was analysed before its recording ended (runs.analysis = stale)")
        assert run_cli("analyze", "live", "--db", any_db).code == 0
        assert state(any_db, "live") == "stored"
    spans = db_rows(any_db, "SELECT count(*) FROM spans s JOIN runs r ON r.id = s.run_id WHERE r.name = 'live'")
    assert spans == [(2 * 4 * 2,)]  # both steps
