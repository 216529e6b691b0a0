"""A recorder whose start fails once its hooks are in leaves nothing behind."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
import torch
import torch.nn.modules.module as module_hooks
import torch.optim.optimizer as optimizer_hooks
from torch import nn

import modtrace
from modtrace.recording.reserve import RESERVE_BYTES
from modtrace.store.engine import open_store
from modtrace.store.runs import list_runs, run_details

DEAD_PID = 2**22 + 12345  # above Linux's pid_max: no such process


def _hooks() -> tuple[int, ...]:
    return (len(module_hooks._global_forward_pre_hooks), len(module_hooks._global_forward_hooks),
            len(optimizer_hooks._global_optimizer_post_hooks))


def test_a_start_that_fails_after_the_tracker_started_leaves_no_hook_and_marks_the_run_failed(db_path: Path) -> None:
    # A stale reserve entry of a dead recorder that cannot be removed (a directory, not
    # the file a recorder leaves) makes the start fail after the tracker and the rank are in.
    stale = db_path.with_name(f"{db_path.name}-reserve-{DEAD_PID}")
    stale.mkdir()
    (stale / "x").write_text("x")
    before, sigterm = _hooks(), signal.getsignal(signal.SIGTERM)
    threads = set(threading.enumerate())
    rec = modtrace.Recorder(db=str(db_path), run="broken", handle_sigterm=True)
    with pytest.raises(OSError):
        with rec:
            raise AssertionError("the body must not run")
    assert _hooks() == before
    assert not rec.active
    assert signal.getsignal(signal.SIGTERM) == sigterm
    assert set(threading.enumerate()) <= threads
    nn.Linear(2, 2)(torch.ones(1, 2))  # no hook records this
    store = open_store(str(db_path))
    try:
        (run,) = list_runs(store)
        details = run_details(store, run["id"])
    finally:
        store.dispose()
    assert run["name"] == "broken" and run["status"] == "failed" and run["events"] == 0
    assert details["rank_details"][0]["status"] == "failed"
    assert details["error"].startswith("the recorder failed to start: IsADirectoryError")
    assert not list(db_path.parent.glob(f"{db_path.name}-reserve-{os.getpid()}"))


def test_the_disk_reserve_works_without_posix_fallocate(db_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "posix_fallocate")  # as on macOS
    reserve = db_path.with_name(f"{db_path.name}-reserve-{os.getpid()}")
    with modtrace.Recorder(db=str(db_path), run="mac", handle_sigterm=False) as rec:
        nn.Linear(2, 2)(torch.ones(1, 2))
        assert reserve.stat().st_size == RESERVE_BYTES
    rec.wait_analyzed()  # the writer process analyses the run after the with
    assert rec.status == "completed" and not reserve.exists()


def test_recording_works_where_fcntl_and_termios_do_not_exist(tmp_path: Path) -> None:
    """The non-POSIX paths (no flock, no pipe sizing) run: a whole recording through the
    writer process in an interpreter where importing fcntl and termios fails."""
    import subprocess
    import sys

    db = tmp_path / "nofcntl.db"
    code = f"""
import sys
sys.modules["fcntl"] = None
sys.modules["termios"] = None
import torch
from torch import nn
import modtrace
with modtrace.Recorder(db={str(db)!r}, run="nofcntl", writer="process", handle_sigterm=False, analyze=False) as rec:
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    for _ in range(3):
        net(torch.ones(1, 2)).sum().backward()
        rec.step()
import modtrace.store.engine, modtrace.recording.writer_process
assert modtrace.store.engine.fcntl is None and modtrace.recording.writer_process.termios is None
print(rec.status, rec.events_recorded)
"""
    env = {**os.environ, "PYTHONPATH": str(Path(modtrace.__file__).resolve().parent.parent)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    status, n = done.stdout.split()
    assert status == "completed" and int(n) > 0
    assert not db.with_name(f"{db.name}.lock").exists()
    store = open_store(str(db))
    try:
        (run,) = list_runs(store)
    finally:
        store.dispose()
    assert run["status"] == "completed" and run["events"] == int(n)
