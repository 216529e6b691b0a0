"""``modtrace record`` end to end: real targets, real databases, real processes.

In-process tests go through the real entry point (``run_cli``); whatever a
test needs a process for (exact stdout/stderr against ``python``, signals,
SIGKILL, a terminal) runs ``python -m modtrace record`` as a subprocess.
Tests taking ``any_db`` also run on PostgreSQL when it is configured.
"""

from __future__ import annotations

import contextlib
import json
import os
import pty
import re
import shlex
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from modtrace.store.engine import open_store
from modtrace.store.runs import resolve_run, run_details
from tests.helpers.database import db_rows
from tests.helpers.postgres import PG_URL, fresh_schema, unavailable

# Builds a little graph, reports its argv, and optionally ends in a chosen way.
TARGET = textwrap.dedent(
    """
    import json, sys
    import torch
    from torch import nn

    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(2):
        model(torch.ones(3, 4)).sum().backward()
        opt.step()
    print(json.dumps({"argv": sys.argv, "name": __name__, "path0": sys.path[0]}))
    print("to stderr", file=sys.stderr)
    if __name__ == "__main__":
        end = sys.argv[1] if len(sys.argv) > 1 else "ok"
        if end == "raise":
            raise RuntimeError("loss is nan at step 2")
        if end == "exit3":
            sys.exit(3)
        if end == "wait":
            print("ready", flush=True)
            sys.stdin.readline()
            print("not reached")
    """
)


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory holding the target script (and nothing of modtrace's)."""
    d = tmp_path / "work"
    d.mkdir()
    (d / "target.py").write_text(TARGET)
    monkeypatch.chdir(d)
    return d


def record_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "modtrace", "record", *args]


def run(cmd: list[str], cwd: Path, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120, **kw)


def details(db: str, ref: str = "@") -> dict[str, Any]:
    store = open_store(db)
    try:
        return run_details(store, resolve_run(store, ref).id)
    finally:
        store.dispose()


def summary_re(name: str, status: str) -> str:
    return rf"modtrace: run '{re.escape(name)}' \(id \d+\) {status}"


# --- point 1: the target runs as under python --------------------------------
# (tests/test_runner.py compares the runner with real ``python`` in detail.)


def test_script_output_and_exit_code_pass_through(work: Path, db_path: Path) -> None:
    got = run(record_cmd("target.py", "ok", "--lr", "3"), work)
    assert got.returncode == 0
    assert json.loads(got.stdout) == {"argv": ["target.py", "ok", "--lr", "3"], "name": "__main__", "path0": str(work)}
    info = details(str(db_path))
    # stderr is not a terminal: the target's line, then one summary line, no progress.
    assert re.fullmatch(r"to stderr\n" + summary_re(info["name"], "completed") + r": [\d,]+ events, 2 steps\n", got.stderr)
    assert info["status"] == "completed"
    assert info["events"] > 0 and info["steps"] == 2


def test_module_target_with_dash_m(run_cli, work: Path, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    (work / "pkg").mkdir()
    (work / "pkg" / "__init__.py").write_text("")
    (work / "pkg" / "train.py").write_text(TARGET)
    res = run_cli("record", "-q", "-m", "pkg.train", "ok", "--run", "x")
    assert res.code == 0, res.err
    assert json.loads(res.out) == {"argv": [str(work / "pkg" / "train.py"), "ok", "--run", "x"], "name": "__main__", "path0": str(work)}
    assert res.err == "to stderr\n"
    assert details(str(db_path))["name"].startswith("train-")  # --run after -m MODULE was the module's


def test_options_after_script_belong_to_the_script(run_cli, work: Path, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("record", "--tag", "a=1", "target.py", "ok", "--run", "mine", "--tag", "b=2", "-q")
    assert res.code == 0, res.err
    assert json.loads(res.out.splitlines()[0])["argv"] == ["target.py", "ok", "--run", "mine", "--tag", "b=2", "-q"]
    info = details(str(db_path))
    assert info["name"] != "mine" and info["tags"] == {"a": "1"}
    assert re.fullmatch("to stderr\n" + summary_re(info["name"], "completed") + r": [\d,]+ events, 2 steps\n", res.err)
    assert "\r" not in res.err  # stderr is no terminal: no progress line even without --quiet


# --- point 2: run names -------------------------------------------------------


def test_default_name_is_script_and_start_time(run_cli, work: Path, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert run_cli("record", "-q", "target.py").code == 0
    assert re.fullmatch(r"target-\d{8}-\d{6}(-\d+)?", details(str(db_path))["name"])


def test_a_taken_default_name_gets_a_suffix(work: Path, db_path: Path) -> None:
    from modtrace.cli.record import _start_recorder

    recs = [
        _start_recorder("target-20260101-000000", True, db=str(db_path), tags={}, command="c", meta={}, analyze=False)
        for _ in range(2)
    ]
    for rec in recs:
        rec.finish("completed")
    assert [r.run_name for r in recs] == ["target-20260101-000000", "target-20260101-000000-2"]


def test_reusing_a_run_name_is_a_clear_error(run_cli, work: Path, any_db: str) -> None:  # type: ignore[no-untyped-def]
    first = run_cli("record", "--db", any_db, "--run", "base", "-q", "target.py")
    assert first.code == 0, first.err
    again = run_cli("record", "--db", any_db, "--run", "base", "-q", "target.py")
    assert again.code == 2
    assert again.err.startswith("modtrace: error: a run named 'base' already exists") and again.err.count("\n") == 1
    assert again.out == ""  # the target never ran
    assert db_rows(any_db, "SELECT count(*) FROM runs")[0][0] == 1


@pytest.mark.parametrize("name", ["@x", "123", " "])
def test_run_names_that_would_read_as_references_are_refused(run_cli, work: Path, db_path: Path, name: str) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("record", "--run", name, "target.py")
    assert res.code == 2 and res.err.startswith("modtrace: error: --run")
    assert not db_path.exists()


# --- point 3: metadata and show ----------------------------------------------


def test_run_metadata_and_show(run_cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, any_db: str) -> None:  # type: ignore[no-untyped-def]
    import torch

    from modtrace import _version

    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "target.py").write_text(TARGET)
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    for git in (["init", "-q"], ["add", "target.py"], ["commit", "-q", "-m", "m"]):
        subprocess.run(["git", "-C", str(repo), *git], check=True, env=env)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
    monkeypatch.chdir(repo)

    res = run_cli("record", "--db", any_db, "--run", "meta", "--tag", "lr=3e-4", "--tag", "note=a b", "-q", "target.py", "ok")
    assert res.code == 0, res.err
    info = details(any_db, "meta")
    assert info["command"] == shlex.join(["modtrace", "record", "--db", any_db, "--run", "meta", "--tag", "lr=3e-4", "--tag", "note=a b", "-q", "target.py", "ok"])
    assert info["cwd"] == str(repo)
    assert info["hostname"] == socket.gethostname() and info["pid"] == os.getpid()
    assert info["git_commit"] == head
    assert info["python_version"] == ".".join(map(str, sys.version_info[:3]))
    assert info["torch_version"] == torch.__version__
    assert info["modtrace_version"] == _version.__version__
    assert info["world_size"] == 1 and info["tags"] == {"lr": "3e-4", "note": "a b"}
    assert info["status"] == "completed" and info["ranks"] == 1 and info["steps"] == 2
    assert info["modules"] == 4  # Sequential, two Linear, ReLU
    assert info["events"] == db_rows(any_db, "SELECT count(*) FROM events")[0][0]
    assert info["duration_s"] is not None and info["duration_s"] >= 0

    shown = run_cli("show", "meta", "--db", any_db)
    assert shown.code == 0, shown.err
    for field, value in [
        ("command", "modtrace record"), ("cwd", str(repo)), ("hostname", socket.gethostname()),
        ("pid", str(os.getpid())), ("git_commit", head), ("python_version", info["python_version"]),
        ("torch_version", torch.__version__), ("modtrace_version", _version.__version__),
        ("world_size", "1"), ("tags", '"lr": "3e-4"'), ("status", "completed"), ("events", str(info["events"])),
        ("steps", "2"), ("ranks", "1"), ("modules", "4"), ("duration_s", ""),
    ]:
        line = next((ln for ln in shown.out.splitlines() if ln.split(" ", 1)[0] == field), None)
        assert line is not None and value in line, (field, shown.out)
    as_json = json.loads(run_cli("show", "meta", "--db", any_db, "--format", "json").out)
    assert as_json["git_commit"] == head and as_json["tags"] == {"lr": "3e-4", "note": "a b"}


# --- point 4: failure paths ---------------------------------------------------


def test_raising_target_prints_pythons_traceback_and_fails_the_run(run_cli, work: Path, any_db: str) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("record", "--db", any_db, "--run", "boom", "target.py", "raise")
    assert res.code == 1
    traceback = res.err[: res.err.index("RuntimeError: loss is nan at step 2\n") + len("RuntimeError: loss is nan at step 2\n")]
    assert traceback.startswith('to stderr\nTraceback (most recent call last):\n  File "' + str(work / "target.py") + '", line ')
    assert traceback.count("  File ") == 1  # no modtrace or runpy frames
    assert '\n    raise RuntimeError("loss is nan at step 2")\n' in traceback
    assert re.fullmatch(summary_re("boom", "failed") + r" \(RuntimeError: loss is nan at step 2\): [\d,]+ events, 2 steps\n",
                        res.err[len(traceback):])
    info = details(any_db, "boom")
    assert info["status"] == "failed" and info["error"] == "RuntimeError: loss is nan at step 2"
    assert info["events"] > 0 and db_rows(any_db, "SELECT count(*) FROM events")[0][0] == info["events"]


def test_system_exit_code_is_modtraces(run_cli, work: Path, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("record", "-q", "target.py", "exit3")
    assert res.code == 3
    info = details(str(db_path))
    assert (info["status"], info["error"]) == ("failed", "SystemExit: 3")


def _spawn_waiting(cwd: Path, db: str, run_name: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        # --no-analyze: what is under test is the recording; analysis has its own tests.
        record_cmd("-q", "--no-analyze", "--db", db, "--run", run_name, "target.py", "wait"), cwd=cwd, text=True,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        # A shell without job control starts background jobs with SIGINT
        # ignored, and Python then installs no handler: restore the default.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


@pytest.fixture(scope="module")
def waiting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, tuple[subprocess.Popen[str], str]]]:
    """``modtrace record`` processes paused inside their target, started together.

    Each process pays for importing torch; starting them at once lets the
    signal tests share that wait.  Keys: sigint, sigterm, sigkill (SQLite) and
    sigterm-pg (PostgreSQL, when configured).
    """
    base = tmp_path_factory.mktemp("signals")
    (base / "target.py").write_text(TARGET)
    dbs = {key: str(base / f"{key}.db") for key in ("sigint", "sigterm", "sigkill")}
    schemas = contextlib.ExitStack()
    if PG_URL:
        dbs["sigterm-pg"] = schemas.enter_context(fresh_schema())
    procs = {key: (_spawn_waiting(base, db, key), db) for key, db in dbs.items()}
    try:
        for key, (proc, _) in procs.items():
            assert proc.stdout is not None
            if not any(line == "ready\n" for line in proc.stdout):
                proc.kill()
                raise AssertionError(f"{key}: target never got ready: {proc.communicate()}")
        yield procs
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        schemas.close()


@pytest.mark.parametrize(
    ("sig", "code", "error", "backend"),
    [
        (signal.SIGINT, 130, "KeyboardInterrupt", "sqlite"),
        (signal.SIGTERM, 143, "SIGTERM", "sqlite"),
        pytest.param(signal.SIGTERM, 143, "SIGTERM", "postgres", marks=pytest.mark.postgres),
    ],
)
def test_interrupt_and_terminate_keep_all_events(
    waiting: dict[str, tuple[subprocess.Popen[str], str]], backend: str, sig: int, code: int, error: str
) -> None:
    key = ("sigint" if sig == signal.SIGINT else "sigterm") + ("-pg" if backend == "postgres" else "")
    if key not in waiting:
        unavailable("MODTRACE_TEST_PG_URL is not set")
    proc, db = waiting[key]
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "not reached" not in out
    info = details(db, key)
    assert (info["status"], info["error"]) == ("interrupted", error)
    # 2 steps through 4 modules: a forward and a backward span each, 2 events per span.
    assert info["events"] == 2 * 4 * 2 * 2 == db_rows(db, f"SELECT count(*) FROM events WHERE run_id = {info['id']}")[0][0]
    if sig == signal.SIGINT:
        assert err.endswith("KeyboardInterrupt\n") and "Traceback (most recent call last):" in err
    else:
        assert err == "to stderr\n"  # the target's own line; python prints nothing when terminated


def test_sigkill_leaves_a_running_run_shown_as_incomplete(run_cli, waiting: dict[str, tuple[subprocess.Popen[str], str]]) -> None:  # type: ignore[no-untyped-def]
    proc, db = waiting["sigkill"]
    running = run_cli("runs", "--db", db, "--format", "json")
    assert [(r["name"], r["status"]) for r in json.loads(running.out)] == [("sigkill", "running")]
    proc.kill()
    proc.communicate(timeout=60)
    with open_store(db).engine.connect() as conn:
        raw = conn.execute(sa.text("SELECT status, pid, hostname FROM runs")).one()
    assert tuple(raw) == ("running", proc.pid, socket.gethostname())
    table = run_cli("runs", "--db", db)
    assert re.search(r"sigkill\s+incomplete", table.out), table.out
    assert json.loads(run_cli("show", "sigkill", "--db", db, "--format", "json").out)["status"] == "incomplete"


# --- usage errors: one line, exit 2, nothing recorded -------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tag", "novalue", "target.py"], "--tag expects KEY=VALUE, got 'novalue'"),
        (["--tag", "=v", "target.py"], "--tag expects KEY=VALUE, got '=v'"),
        (["--tag", "k=1", "--tag", "k=2", "target.py"], "--tag k given twice"),
        (["missing.py"], "script not found: missing.py"),
        (["-m", "no_such_module_xyz"], "no module named no_such_module_xyz"),
        ([], "record needs SCRIPT or -m MODULE"),
    ],
)
def test_usage_errors_record_nothing(run_cli, work: Path, db_path: Path, args: list[str], message: str) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("record", *args)
    assert res.code == 2
    assert res.err.startswith(f"modtrace: error: {message}") and res.err.count("\n") == 1, res.err
    assert res.out == ""
    assert not db_path.exists()


# --- point 6: progress ---------------------------------------------------------


def test_progress_line_on_a_terminal_only(work: Path, db_path: Path) -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen(record_cmd("--run", "tty", "target.py"), cwd=work, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the process closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 0
    tty_err = b"".join(chunks).decode()
    assert re.search(r"\r\x1b\[Kmodtrace: tty  [\d,]+ events  \d+ steps  \d+\.\ds", tty_err), tty_err
    assert tty_err.count("\r\x1b[K") >= 2  # drawn, then cleared before the summary
    assert re.search(summary_re("tty", "completed"), tty_err)

    # Not a terminal (test_script_output_and_exit_code_pass_through) or --quiet
    # (the in-process tests, whose stderr is captured): no progress line.


def test_progress_line_draws_counts_and_clears() -> None:
    import io

    from modtrace.recording.status_line import CLEAR_LINE, ProgressLine

    ticks = iter([10.0, 10.0, 12.5])  # start, first draw, second draw
    counts = {"events": 0, "steps": 0}
    buf = io.StringIO()
    line = ProgressLine(buf, "base", lambda: (counts["events"], counts["steps"]), clock=lambda: next(ticks), interval=3600)
    line.start()
    counts.update(events=12345, steps=3)
    line.draw()
    line.stop()
    assert buf.getvalue() == (
        CLEAR_LINE + "modtrace: base  0 events  0 steps  0.0s"
        + CLEAR_LINE + "modtrace: base  12,345 events  3 steps  2.5s"
        + CLEAR_LINE
    )


# --- point 7: RUN references ----------------------------------------------------


def test_run_references_anywhere(run_cli, work: Path, any_db: str) -> None:  # type: ignore[no-untyped-def]
    (work / "quick.py").write_text("import torch\ntorch.nn.Linear(2, 2)(torch.ones(1, 2))\n")
    for name in ("first", "second", "third"):
        assert run_cli("record", "--db", any_db, "--run", name, "-q", "quick.py").code == 0
    ids = {name: details(any_db, name)["id"] for name in ("first", "second", "third")}
    for ref, name in [("@", "third"), ("@~1", "second"), ("@~2", "first"), (str(ids["first"]), "first"), ("second", "second")]:
        res = run_cli("show", ref, "--db", any_db, "--format", "json")
        assert res.code == 0, res.err
        assert json.loads(res.out)["name"] == name, ref
    missing = run_cli("show", "@~3", "--db", any_db)
    assert missing.code == 2 and missing.err.startswith("modtrace: error: @~3 refers to no run")
    typo = run_cli("show", "secnd", "--db", any_db)
    assert typo.code == 2 and "did you mean 'second'" in typo.err
