"""Recording under SIGKILL, SIGTERM, Ctrl-C and an exception: real processes, real databases.

Every target keeps its own count of forward calls with global module hooks
of its own (``register_module_forward_pre_hook`` / ``register_module_forward_hook``,
independent of modtrace's) and writes it to a file when it ends -- or, for
SIGKILL, when it is ready to be killed.  The tests compare those counts with
the rows in the database: zero events lost means equal counts.

All processes start together in one module fixture (each pays for importing
torch; paying at once is cheaper), then each test signals its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.database import db_rows
from tests.helpers.postgres import PG_URL, fresh_schema, unavailable

TARGET = textwrap.dedent(
    """
    import json, sys, time
    import sqlalchemy as sa
    import torch
    import torch.nn.modules.module as module_hooks
    from torch import nn

    mode, db, run_name, count_path = sys.argv[1:5]
    STOP_STEP = 3

    counts = {"enter": 0, "exit": 0}

    def count_enter(module, args):
        counts["enter"] += 1

    def count_exit(module, args, output):
        counts["exit"] += 1

    module_hooks.register_module_forward_pre_hook(count_enter)
    module_hooks.register_module_forward_hook(count_exit, always_call=True)

    def save():
        with open(count_path, "w") as fh:
            json.dump(counts, fh)

    def gate_enter_flushed():
        url = db if "://" in db else f"sqlite:///file:{db}?mode=ro&uri=true"
        engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
        try:
            with engine.connect() as conn:
                return conn.execute(sa.text(
                    "SELECT count(*) FROM event_log e JOIN runs r ON r.id = e.run_id "
                    "WHERE r.name = :name AND e.fqn = 'Net.gate' AND e.kind = 'enter'"), {"name": run_name}).scalar()
        finally:
            engine.dispose()

    class Gate(nn.Module):
        def forward(self, x):
            if mode == "raise":
                raise RuntimeError("loss is nan at step 3")
            if mode == "kill":
                # Wait, inside an open call, until the recorder has flushed this
                # enter (and so everything before it); then be killed here.
                while not gate_enter_flushed():
                    time.sleep(0.05)
                save()
                print("READY", flush=True)
                time.sleep(600)
            return x

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(4, 16)
            self.body = nn.Sequential(nn.ReLU(), nn.Linear(16, 16), nn.Tanh())
            self.gate = Gate()
            self.out = nn.Linear(16, 2)
            self.step = 0

        def forward(self, x):
            h = self.body(self.inp(x))
            if self.step == STOP_STEP and mode in ("raise", "kill"):
                h = self.gate(h)
            return self.out(h)

    torch.manual_seed(0)
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    steps = 200 if mode == "wait" else 8
    try:
        for step in range(steps):
            net.step = step
            net(torch.randn(8, 4)).sum().backward()
            opt.step()
        if mode == "wait":
            print("READY", flush=True)
            sys.stdin.readline()
            print("not reached")
    finally:
        save()
    """
)

# Forward calls per step of Net without the gate: Net, inp, body, body.0-2, out.
FORWARD_PER_STEP = 7


class Proc:
    def __init__(self, key: str, mode: str, db: str, run: str, base: Path) -> None:
        self.key, self.mode, self.db, self.run = key, mode, db, run
        self.count_path = base / f"{key}.count.json"
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "modtrace", "record", "-q", "--db", db, "--run", run,
             "target.py", mode, db, run, str(self.count_path)],
            cwd=base, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            # A shell without job control starts background jobs with SIGINT
            # ignored, and Python then installs no handler: restore the default.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )

    def wait_ready(self) -> None:
        assert self.popen.stdout is not None
        for line in self.popen.stdout:
            if line == "READY\n":
                return
        raise AssertionError(f"{self.key}: never ready: {self.popen.communicate()}")

    def counts(self) -> dict[str, int]:
        return dict(json.loads(self.count_path.read_text()))


@pytest.fixture(scope="module")
def procs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Proc]]:
    base = tmp_path_factory.mktemp("kill")
    (base / "target.py").write_text(TARGET)
    sqlite_db = str(base / "trace.db")
    # (mode, backend): kill also gets a completed run in the same database to diff against.
    plan = {
        "kill": ("kill", "sqlite"), "complete": ("ok", "sqlite"), "sigterm": ("wait", "sqlite"),
        "sigint": ("wait", "sqlite"), "raise": ("raise", "sqlite"),
        "kill-pg": ("kill", "postgres"), "sigterm-pg": ("wait", "postgres"), "raise-pg": ("raise", "postgres"),
    }
    schemas = contextlib.ExitStack()
    pg_db = schemas.enter_context(fresh_schema()) if PG_URL else None
    started = {
        key: Proc(key, mode, sqlite_db if backend == "sqlite" else pg_db, key, base)  # type: ignore[arg-type]
        for key, (mode, backend) in plan.items()
        if backend == "sqlite" or pg_db is not None
    }
    try:
        for proc in started.values():
            if proc.mode in ("kill", "wait"):
                proc.wait_ready()
        yield started
    finally:
        for proc in started.values():
            if proc.popen.poll() is None:
                proc.popen.kill()
            proc.popen.communicate()
        schemas.close()


def get(procs: dict[str, Proc], key: str) -> Proc:
    if key not in procs:
        unavailable("MODTRACE_TEST_PG_URL is not set")
    return procs[key]


def run_facts(db: str, run: str) -> dict[str, Any]:
    """What the database holds for one run, counted independently of modtrace's code."""
    ((run_id, status, error),) = db_rows(db, "SELECT id, status, error FROM runs WHERE name = :n", n=run)
    ((counted, rank_status),) = db_rows(db, "SELECT event_count, status FROM run_ranks WHERE run_id = :r", r=run_id)
    ((n, lo, hi),) = db_rows(db, "SELECT count(*), min(seq), max(seq) FROM events WHERE run_id = :r", r=run_id)
    by_kind = dict(db_rows(
        db, "SELECT kind || ' ' || phase, count(*) FROM event_log WHERE run_id = :r GROUP BY kind, phase", r=run_id))
    unpaired = db_rows(
        db,
        "SELECT call_id, phase, sum(CASE WHEN kind = 0 THEN 1 ELSE 0 END), sum(CASE WHEN kind = 1 THEN 1 ELSE 0 END) "
        "FROM events WHERE run_id = :r GROUP BY call_id, phase "
        "HAVING sum(CASE WHEN kind = 0 THEN 1 ELSE 0 END) <> 1 OR sum(CASE WHEN kind = 1 THEN 1 ELSE 0 END) <> 1",
        r=run_id,
    )
    errors = db_rows(db, "SELECT fqn FROM event_log WHERE run_id = :r AND status = 'error' ORDER BY seq", r=run_id)
    return {
        "id": run_id, "status": status, "error": error, "rank_status": rank_status, "event_count": counted,
        "rows": n, "dense": n == 0 or (lo == 0 and hi == n - 1), "by_kind": by_kind,
        "unpaired": unpaired, "error_exits": [e[0] for e in errors],
    }


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "modtrace", *args], capture_output=True, text=True, timeout=120)


# --- SIGKILL ------------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["kill", pytest.param("kill-pg", marks=pytest.mark.postgres)])
def test_sigkill_keeps_every_flushed_event_and_the_run_stays_analysable(procs: dict[str, Proc], key: str) -> None:
    proc = get(procs, key)
    counts_at_ready = proc.counts()  # written by the target once its last enter was flushed
    proc.popen.kill()
    proc.popen.communicate(timeout=60)
    assert proc.popen.returncode == -signal.SIGKILL

    if "://" not in proc.db:
        conn = sqlite3.connect(f"file:{proc.db}?mode=ro", uri=True)
        try:
            assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        finally:
            conn.close()
    facts = run_facts(proc.db, proc.run)
    # Batches are written with their count in one transaction: the count and the rows agree.
    assert facts["event_count"] == facts["rows"] > 0 and facts["dense"]
    # Every forward call the program had made when the kill came is in the database.
    assert facts["by_kind"]["enter forward"] == counts_at_ready["enter"] == 4 * FORWARD_PER_STEP
    assert (facts["status"], facts["rank_status"], facts["error"]) == ("running", "running", None)

    listed = json.loads(cli("runs", "--db", proc.db, "--format", "json").stdout)
    assert {r["name"]: r["status"] for r in listed}[proc.run] == "incomplete"

    # Read commands compute on the fly without writing; check reports the calls the kill left open as warnings.
    checked = cli("check", proc.run, "--db", proc.db, "--format", "json")
    assert checked.returncode == 0, checked.stderr
    issues = json.loads(checked.stdout)
    unclosed = sorted((i["fqn"], i["severity"]) for i in issues if i["kind"] == "unclosed")
    assert unclosed == [("Net", "warning"), ("Net.gate", "warning")]
    assert all(i["message"].endswith("was never exited; the run did not finish") for i in issues if i["kind"] == "unclosed")
    assert not [i for i in issues if i["severity"] == "error"]

    tree = cli("tree", proc.run, "--db", proc.db, "--full-names")
    assert tree.returncode == 0, tree.stderr
    assert re.search(r"^Net\s+Net\s+forward\s+4\s", tree.stdout, re.M), tree.stdout  # 3 whole steps and the open one
    assert re.search(r"^  Net\.inp\s+Linear\s+forward\s+4\s", tree.stdout, re.M), tree.stdout

    analysed = cli("analyze", proc.run, "--db", proc.db)
    assert analysed.returncode == 0, analysed.stderr
    assert re.fullmatch(rf"run {proc.run} \(id {facts['id']}\): \d+ spans, \d+ nesting issue\(s\): 0 error\(s\), 2 warning\(s\), \d+ info\n",
                        analysed.stdout), analysed.stdout

    base = "complete" if key == "kill" else proc.run
    diffed = cli("diff", base, proc.run, "--db", proc.db, "--skip-steps", "0", "--fail-on", "never", "--format", "json")
    assert diffed.returncode == 0, diffed.stderr
    doc = json.loads(diffed.stdout)
    assert (doc["base"]["run"], doc["cand"]["run"]) == (base, proc.run)


# --- SIGTERM, Ctrl-C, an exception: zero events lost --------------------------------------


@pytest.mark.parametrize(
    ("key", "sig", "code", "error"),
    [
        ("sigterm", signal.SIGTERM, 143, "SIGTERM"),
        ("sigint", signal.SIGINT, 130, "KeyboardInterrupt"),
        pytest.param("sigterm-pg", signal.SIGTERM, 143, "SIGTERM", marks=pytest.mark.postgres),
    ],
)
def test_signals_lose_no_event(procs: dict[str, Proc], key: str, sig: int, code: int, error: str) -> None:
    proc = get(procs, key)
    proc.popen.send_signal(sig)
    out, err = proc.popen.communicate(timeout=60)
    assert proc.popen.returncode == code, err
    assert "not reached" not in out
    counts = proc.counts()
    assert counts == {"enter": 200 * FORWARD_PER_STEP, "exit": 200 * FORWARD_PER_STEP}
    facts = run_facts(proc.db, proc.run)
    assert (facts["status"], facts["rank_status"], facts["error"]) == ("interrupted", "interrupted", error)
    assert facts["by_kind"]["enter forward"] == counts["enter"]
    assert facts["by_kind"]["exit forward"] == counts["exit"]
    assert facts["by_kind"]["enter backward"] == facts["by_kind"]["exit backward"] > 0
    assert facts["event_count"] == facts["rows"] and facts["dense"]
    assert facts["unpaired"] == []


@pytest.mark.parametrize("key", ["raise", pytest.param("raise-pg", marks=pytest.mark.postgres)])
def test_exception_in_the_target_loses_no_event(procs: dict[str, Proc], key: str) -> None:
    proc = get(procs, key)
    out, err = proc.popen.communicate(timeout=120)
    assert proc.popen.returncode == 1
    assert err.rstrip().endswith("RuntimeError: loss is nan at step 3"), err
    counts = proc.counts()
    # Three whole steps, then Net, inp, body and its three children, and the gate that raised (not out).
    assert counts == {"enter": 4 * FORWARD_PER_STEP, "exit": 4 * FORWARD_PER_STEP}
    facts = run_facts(proc.db, proc.run)
    assert (facts["status"], facts["rank_status"], facts["error"]) == ("failed", "failed", "RuntimeError: loss is nan at step 3")
    assert facts["by_kind"]["enter forward"] == counts["enter"]
    assert facts["by_kind"]["exit forward"] == counts["exit"]
    assert facts["error_exits"] == ["Net.gate", "Net"]  # the raising call and its caller, innermost first
    assert facts["event_count"] == facts["rows"] and facts["dense"]
    assert facts["unpaired"] == []
