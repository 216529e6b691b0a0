"""No descriptor of a SQLite database but SQLite's own (issue 25, point 1).

Closing any descriptor of a file drops every POSIX lock the process holds on
it, SQLite's included.  A process that opened and closed the database file
itself (a header read, a lock taken on the file) left its SQLite connections
believing they held a read lock the kernel no longer had: another process's
last connection then checkpointed and deleted the write-ahead log under them,
and they read a stale or torn database ("database disk image is malformed").

The oracles are outside modtrace: the kernel's lock table (``/proc/locks``),
SQLite's documented WAL behaviour (the last connection to close deletes the
``-wal`` file, which it cannot do while another process holds a read lock),
plain ``sqlite3`` connections, torch's own module hooks for the calls a
program made, and Python's audit hooks, which see every file a process opens
from Python (SQLite's own opens, in C, are not Python's, so they are not seen).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.modules.module as module_hooks
from torch import nn

import modtrace
from tests.helpers.training import train

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not Path("/proc/locks").exists(), reason="reads the kernel's lock table (Linux)")

# Installed (as sitecustomize) in every Python process the tests start, the writer
# process included: logs each Python-level open, removal, rename or copy of the
# watched database or its -wal, -shm or -journal file.
SITECUSTOMIZE = textwrap.dedent(
    """
    import os, sys, traceback
    _db = os.environ.get("MODTRACE_TEST_WATCH_DB")
    if _db:
        _names = {_db + s for s in ("", "-wal", "-shm", "-journal")}
        _log = os.environ["MODTRACE_TEST_WATCH_LOG"]
        _busy = []

        def _hook(event, args):
            if _busy or event not in ("open", "os.remove", "os.rename", "shutil.copyfile", "os.truncate"):
                return
            for arg in args[:2]:
                if isinstance(arg, (str, bytes, os.PathLike)) and os.path.abspath(os.fsdecode(arg)) in _names:
                    _busy.append(1)
                    try:
                        where = "".join(traceback.format_stack(limit=8)[:-1])
                        with open(_log, "a") as fh:
                            fh.write(f"{os.getpid()} {event} {os.fsdecode(arg)}\\n{where}\\n")
                    finally:
                        _busy.pop()

        sys.addaudithook(_hook)
    """
)

# The same watch in this (the test) process: audit hooks cannot be removed, so it
# watches the paths in WATCHED while a test sets them.
WATCHED: set[str] = set()
OPENED: list[str] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if not WATCHED or event not in ("open", "os.remove", "os.rename", "shutil.copyfile", "os.truncate"):
        return
    for arg in args[:2]:
        if isinstance(arg, (str, bytes, os.PathLike)) and os.path.abspath(os.fsdecode(arg)) in WATCHED:
            OPENED.append(f"{event} {os.fsdecode(arg)}")


sys.addaudithook(_audit)


@pytest.fixture
def watch(tmp_path: Path) -> Iterator[Path]:
    """The database path, watched in this process and in every Python process started with ``child_env``."""
    db = tmp_path / "t.db"
    WATCHED.update(str(db) + s for s in ("", "-wal", "-shm", "-journal"))
    OPENED.clear()
    try:
        yield db
    finally:
        WATCHED.clear()
    assert OPENED == [], OPENED


def child_env(tmp_path: Path, db: Path) -> dict[str, str]:
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)]), "OMP_NUM_THREADS": "1",
            "MODTRACE_TEST_WATCH_DB": str(db), "MODTRACE_TEST_WATCH_LOG": str(tmp_path / "opened.log")}


def opened_by_children(tmp_path: Path) -> str:
    log = tmp_path / "opened.log"
    return log.read_text() if log.exists() else ""


def held_locks(path: Path, pid: int | None = None) -> list[str]:
    """The POSIX locks process ``pid`` (default: this one) holds on ``path``, as the kernel lists them."""
    st = os.stat(path)
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    pid = os.getpid() if pid is None else pid
    with open("/proc/locks") as fh:
        rows = [line.split() for line in fh]
    # "1: POSIX  ADVISORY  READ 1234 fe:00:5678 1073741826 1073742335" (blocked waiters have "->")
    return sorted(" ".join((r[3], r[6], r[7])) for r in rows
                  if len(r) >= 8 and r[1] == "POSIX" and r[4] == str(pid) and r[5] == inode)


def other_process_reads_and_closes(db: Path) -> None:
    """A read from another process: its connection, the last one open there, closes after it."""
    subprocess.run([sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                    "c.execute('SELECT count(*) FROM runs').fetchall(); c.close()", str(db)], check=True, timeout=60)


def other_process_writes(db: Path, rows: int) -> None:
    subprocess.run([sys.executable, "-c", "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
                    "c.execute('CREATE TABLE scratch (a INTEGER)'); "
                    "c.executemany('INSERT INTO scratch VALUES (?)', ((i,) for i in range(int(sys.argv[2])))); "
                    "c.commit(); c.close()", str(db), str(rows)], check=True, timeout=60)


class CallCounter:
    """Forward calls counted by torch's own global module hooks."""

    def __init__(self) -> None:
        self.calls = 0
        self._handles: list[Any] = []

    def __enter__(self) -> CallCounter:
        self._handles = [module_hooks.register_module_forward_pre_hook(self._count)]
        return self

    def _count(self, module: nn.Module, args: Any) -> None:
        self.calls += 1

    def __exit__(self, *exc: object) -> None:
        for h in self._handles:
            h.remove()


def small_model() -> nn.Module:
    return nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(10)])


def record(db: Path, run: str, model: nn.Module, steps: int) -> tuple[modtrace.Recorder, int]:
    """Record ``steps`` steps (the writer process writes them); the forward calls torch counted."""
    with CallCounter() as counter, modtrace.Recorder(db=str(db), run=run, writer="process") as rec:
        train(model, steps, inputs=torch.randn(4, 16), lr=1e-3)
    return rec, counter.calls


def recorded(db: Path, run: str, model: nn.Module, steps: int) -> int:
    """``record``, and its analysis waited for (no writer process outlives the test)."""
    rec, calls = record(db, run, model, steps)
    assert rec.wait_analyzed(120) and rec.analysis_stored
    return calls


def forward_enters(conn: sqlite3.Connection, run: str) -> int:
    """The run's forward enter rows (kind 0, phase 0), counted in SQL."""
    return int(conn.execute("SELECT count(*) FROM events e JOIN runs r ON r.id = e.run_id "
                            "WHERE r.name = ? AND e.kind = 0 AND e.phase = 0", (run,)).fetchone()[0])


def assert_wal_kept_under(conn: sqlite3.Connection, db: Path) -> None:
    """This process's open connection still holds its read lock, as SQLite believes: another
    process's last close leaves the write-ahead log alone, and what that process writes next
    is what ``conn`` reads."""
    assert held_locks(db), "this process holds no lock on the database although a connection of it is open"
    other_process_reads_and_closes(db)
    assert Path(f"{db}-wal").exists(), "another process deleted the write-ahead log under this process's connection"
    other_process_writes(db, 5000)
    assert conn.execute("SELECT count(*), sum(a) FROM scratch").fetchone() == (5000, 5000 * 4999 // 2)
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


# -- the issue's reproduction ---------------------------------------------------------


def test_the_issue_reproduction_reads_the_run_while_the_writer_process_analyses_it(watch: Path) -> None:
    db = watch
    torch.manual_seed(0)
    m = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(100)])
    with CallCounter() as counter:
        with modtrace.Recorder(db=str(db), run="r") as rec:
            train(m, 150, inputs=torch.randn(4, 16), lr=1e-3)
    assert rec.status == "completed"
    spans = 0
    t = time.time()
    while time.time() - t < 3:  # while the writer process analyses the run (or after it did)
        with modtrace.open(str(db)) as database:
            frame = database.spans("r")
            spans = frame.filter(frame["phase"] == "forward").height
    assert rec.wait_analyzed(120)
    assert spans == counter.calls == 150 * 301
    with modtrace.open(str(db)) as database:
        frame = database.spans("r")
        assert frame.filter(frame["phase"] == "forward").height == counter.calls
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)


# -- plain sqlite3 connections of the program's own -----------------------------------


def test_a_plain_sqlite3_connection_opened_before_a_recording_keeps_its_lock(watch: Path) -> None:
    db = watch
    recorded(db, "first", small_model(), 3)
    conn = sqlite3.connect(db)
    try:
        assert forward_enters(conn, "first") == 3 * 31
        before = held_locks(db)
        assert before  # a WAL connection holds a read lock on the database for its lifetime
        with modtrace.open(str(db)) as database:  # a read while the connection is open
            assert database.spans("first").height > 0
        assert held_locks(db) == before
        rec, calls = record(db, "second", small_model(), 5)  # the recorder opens the database again
        assert rec.wait_analyzed(120) and rec.analysis_stored
        assert held_locks(db) == before
        assert forward_enters(conn, "second") == calls == 5 * 31
        assert_wal_kept_under(conn, db)
    finally:
        conn.close()


def test_a_plain_sqlite3_connection_opened_after_a_recording_reads_while_it_is_analysed(watch: Path) -> None:
    db = watch
    model = small_model()
    rec, calls = record(db, "r", model, 20)
    conn = sqlite3.connect(db)  # opened while the writer process analyses the run
    try:
        assert forward_enters(conn, "r") == calls == 20 * 31
        before = held_locks(db)
        assert before
        for _ in range(5):
            with modtrace.open(str(db)) as database:
                database.spans("r")
                database.runs()
        assert rec.wait_analyzed(120) and rec.analysis_stored
        assert held_locks(db) == before
        stored = conn.execute("SELECT count(*) FROM span_rows s JOIN runs r ON r.id = s.run_id WHERE r.name = 'r'")
        assert stored.fetchone()[0] == 2 * 20 * 31  # a forward and a backward span per call
        assert_wal_kept_under(conn, db)
    finally:
        conn.close()


# -- modtrace record, the writer process ----------------------------------------------

# Run under ``modtrace record``: holds a connection of its own, reads the database through
# the API while it is being recorded into, and reports the kernel's locks of this process.
TARGET = textwrap.dedent(
    """
    import json, os, sqlite3, sys
    import torch
    import torch.nn.modules.module as module_hooks
    from torch import nn
    import modtrace

    db, out = sys.argv[1], sys.argv[2]

    def held_locks():
        st = os.stat(db)
        inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
        with open("/proc/locks") as fh:
            rows = [line.split() for line in fh]
        return sorted(" ".join((r[3], r[6], r[7])) for r in rows
                      if len(r) >= 8 and r[1] == "POSIX" and r[4] == str(os.getpid()) and r[5] == inode)

    calls = [0]
    module_hooks.register_module_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))
    conn = sqlite3.connect(db)
    conn.execute("SELECT count(*) FROM runs").fetchall()
    before = held_locks()
    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(10)])
    opt, x = torch.optim.SGD(model.parameters(), lr=1e-3), torch.randn(4, 16)
    seen = []
    for step in range(30):
        opt.zero_grad(); model(x).sum().backward(); opt.step()
        if step % 10 == 9:
            with modtrace.open(db) as database:  # read the run being recorded, and the baseline
                seen.append(database.runs()["name"].to_list())
                database.spans("baseline")
    after = held_locks()
    json.dump({"calls": calls[0], "before": before, "after": after, "seen": seen}, open(out, "w"))
    """
)


def test_modtrace_record_of_a_script_that_reads_the_database_it_records_into(watch: Path, tmp_path: Path) -> None:
    db = watch
    recorded(db, "baseline", small_model(), 2)
    (tmp_path / "target.py").write_text(TARGET)
    env = child_env(tmp_path, db)
    proc = subprocess.run([sys.executable, "-m", "modtrace", "record", "--db", str(db), "--run", "rec", "target.py",
                           str(db), str(tmp_path / "out.json")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "malformed" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    got = json.loads((tmp_path / "out.json").read_text())
    assert got["before"] and got["after"] == got["before"], got  # the script's connection kept its lock
    assert got["seen"][-1] == ["rec", "baseline"]
    assert opened_by_children(tmp_path) == ""  # neither the CLI nor the writer process opened the files
    with sqlite3.connect(db) as conn:
        assert forward_enters(conn, "rec") == got["calls"] == 30 * 31
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT count(*) FROM span_rows s JOIN runs r ON r.id = s.run_id "
                            "WHERE r.name = 'rec'").fetchone()[0] == 2 * got["calls"]


def test_the_writer_process_and_the_recorder_open_no_database_file_of_their_own(watch: Path, tmp_path: Path) -> None:
    """A new database (created, with the schema's lock) and an existing one (its header
    judged), each recorded into by a program whose writer process writes and analyses."""
    db = watch
    script = textwrap.dedent(
        """
        import sys, torch, modtrace
        from torch import nn
        model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
        for run in ("one", "two"):
            with modtrace.Recorder(db=sys.argv[1], run=run, writer="process") as rec:
                for _ in range(5):
                    model(torch.randn(2, 8)).sum().backward()
            assert rec.wait_analyzed(120) and rec.analysis_stored, rec.analysis_stored
            with modtrace.open(sys.argv[1]) as database:
                spans = database.spans(run)
                assert spans.filter(spans["phase"] == "forward").height == 4 * 5
        """
    )
    proc = subprocess.run([sys.executable, "-c", script, str(db)], env=child_env(tmp_path, db), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert opened_by_children(tmp_path) == ""
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("t.db")) == ["t.db"]  # no lock left


# -- four processes at once -------------------------------------------------------------

# Records short runs into the shared file for ``seconds`` while a thread reads the file
# through the API; a plain connection held open all along reads each run back.  Reports the
# forward calls torch counted per run, and every error met.
STRESS = textwrap.dedent(
    """
    import json, sqlite3, sys, threading, time, traceback
    import torch
    import torch.nn.modules.module as module_hooks
    from torch import nn
    import modtrace

    db, name, seconds, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    calls = [0]
    module_hooks.register_module_forward_pre_hook(lambda m, a: calls.__setitem__(0, calls[0] + 1))
    errors, runs, reads = [], {}, [0]
    stop = threading.Event()

    def reader():
        while not stop.is_set():
            try:
                with modtrace.open(db) as database:
                    for row in database.runs().to_dicts():
                        if row["status"] != "running":
                            database.spans(row["name"])
                reads[0] += 1
            except Exception as exc:
                errors.append("read: " + "".join(traceback.format_exception(exc))[-2000:])
            time.sleep(0.05)

    model = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.ReLU()) for _ in range(5)])
    opt, x = torch.optim.SGD(model.parameters(), lr=1e-3), torch.randn(4, 16)
    thread = threading.Thread(target=reader)
    conn = None
    end = time.monotonic() + seconds
    i = 0
    try:
        while time.monotonic() < end:
            run = f"{name}-{i}"
            calls[0] = 0
            with modtrace.Recorder(db=db, run=run, writer="process") as rec:
                if i == 0:
                    thread.start()  # the database exists from here on
                for _ in range(10):
                    opt.zero_grad(); model(x).sum().backward(); opt.step()
            runs[run] = calls[0]
            if conn is None:
                conn = sqlite3.connect(db)
            got = conn.execute("SELECT count(*) FROM events e JOIN runs r ON r.id = e.run_id "
                               "WHERE r.name = ? AND e.kind = 0 AND e.phase = 0", (run,)).fetchone()[0]
            if got != calls[0]:
                errors.append(f"{run}: {got} forward enters read back, {calls[0]} calls")
            i += 1
    except Exception as exc:
        errors.append("record: " + "".join(traceback.format_exception(exc))[-2000:])
    finally:
        stop.set()
        if thread.is_alive():
            thread.join()
    json.dump({"runs": runs, "errors": errors, "reads": reads[0]}, open(out, "w"))
    """
)


@pytest.mark.slow
def test_four_processes_record_and_read_one_file_for_a_minute(tmp_path: Path) -> None:
    db = tmp_path / "shared.db"
    (tmp_path / "stress.py").write_text(STRESS)
    env = child_env(tmp_path, db)
    procs = {f"p{i}": subprocess.Popen([sys.executable, "stress.py", str(db), f"p{i}", "60", f"p{i}.json"],
                                       cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       text=True) for i in range(4)}
    outs = {name: p.communicate(timeout=400) for name, p in procs.items()}
    runs: dict[str, int] = {}
    for name, p in procs.items():
        assert p.returncode == 0, outs[name][1][-3000:]
        report = json.loads((tmp_path / f"{name}.json").read_text())
        assert report["errors"] == [], "\n".join(report["errors"])
        assert report["runs"] and report["reads"] > 0, report
        runs.update(report["runs"])
    assert opened_by_children(tmp_path) == ""
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("SELECT count(*) FROM runs WHERE status = 'completed'").fetchone()[0] == len(runs)
        for run, calls in runs.items():
            assert forward_enters(conn, run) == calls == 10 * 16, run
        # every event the recorders said they wrote is there
        lost = conn.execute("SELECT count(*) FROM run_ranks k WHERE k.event_count != "
                            "(SELECT count(*) FROM events e WHERE e.run_id = k.run_id AND e.rank = k.rank)")
        assert lost.fetchone()[0] == 0


# -- export and report never write over the database ----------------------------------------


def digest_elsewhere(path: Path) -> str:
    """sha256 of the file's bytes, read by another process (one here would open the database)."""
    return subprocess.run([sys.executable, "-c", "import hashlib, sys; "
                           "print(hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())", str(path)],
                          check=True, capture_output=True, text=True, timeout=60).stdout


def test_export_and_report_refuse_to_write_over_the_database(watch: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = watch
    recorded(db, "r", small_model(), 2)
    before = digest_elsewhere(db)
    for target in (str(db), f"{db}-wal", f"{db.parent}/./{db.name}"):
        for command in (("export", "r", "--format", "perfetto"), ("export", "r", "--format", "csv", "--what", "spans"),
                        ("report", "r")):
            result = run_cli(*command, "--db", str(db), "-o", target)
            assert (result.code, result.out) == (2, ""), (command, target, result)
            assert result.err == (f"modtrace: error: -o {target}: is the database being read (or a file of SQLite's "
                                  "beside it); refusing to write over it\n")
    assert digest_elsewhere(db) == before
    with sqlite3.connect(db) as conn:
        assert forward_enters(conn, "r") == 2 * 31
