"""modtrace.Recorder end to end: real models, real databases, the public relations."""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from pathlib import Path

import pytest
import torch
import torch.nn.modules.module as module_hooks
import torch.optim.optimizer as optimizer_hooks
from torch import nn

import modtrace
from modtrace.core.errors import UsageError
from tests.helpers.database import db_rows
from tests.helpers.models import mlp
from tests.helpers.recording import FakeClock
from tests.helpers.training import train


def test_recorder_writes_runs_modules_and_event_log(any_db: str) -> None:
    model = mlp()
    with modtrace.Recorder(db=any_db, run="base", tags={"lr": "0.01"}, clock=FakeClock()) as rec:
        train(model, 3)
    rec.wait_analyzed()  # the writer process analyses the run after the with
    assert rec.run_name == "base" and rec.run_id > 0
    assert rec.status == "completed"
    (run,) = db_rows(any_db, "SELECT name, status, world_size, tags, modtrace_version, ended_at FROM runs")
    assert run[:3] == ("base", "completed", 1)
    assert json.loads(str(run[3])) == {"lr": "0.01"}
    assert run[4] == modtrace.__version__ and run[5] is not None
    mods = db_rows(any_db, "SELECT fqn, module_type, parent_module_id FROM modules WHERE run_id = :r ORDER BY module_id", r=rec.run_id)
    assert mods == [("Sequential", "Sequential", None), ("Sequential.0", "Linear", 0), ("Sequential.1", "ReLU", 0), ("Sequential.2", "Linear", 0)]
    ev = db_rows(any_db, "SELECT seq, kind, fqn, phase, step, rank, device, stream, status, ts_ns FROM event_log WHERE run_id = :r ORDER BY seq", r=rec.run_id)
    assert len(ev) == 3 * 16 == rec.events_recorded
    assert [e[0] for e in ev] == list(range(len(ev)))
    assert [e[4] for e in ev] == [0] * 16 + [1] * 16 + [2] * 16  # the optimizer step advances the step
    assert {e[5] for e in ev} == {0} and {e[6] for e in ev} == {"cpu"} and {e[7] for e in ev} == {None}
    assert {e[3] for e in ev} == {"forward", "backward"}
    ts = [int(e[9]) for e in ev]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)  # the injected clock ticks once per read
    assert db_rows(any_db, "SELECT event_count, step_count, status FROM run_ranks") == [(48, 3, "completed")]


def test_manual_steps_and_rank_from_environment(db_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "1")
    model = mlp()
    with modtrace.Recorder(run="manual") as rec:
        for _ in range(2):
            with torch.no_grad():
                model(torch.randn(1, 8))
            rec.step()
    rec.wait_analyzed()  # the writer process analyses the run after the with
    assert rec.rank == 3
    assert db_rows(str(db_path), "SELECT DISTINCT step, rank FROM event_log ORDER BY step") == [(0, 3), (1, 3)]


def test_run_names_are_unique(db_path: object) -> None:
    with modtrace.Recorder(run="same") as _rec:
        pass
    _rec.wait_analyzed()  # the writer process analyses the run after the with
    with pytest.raises(UsageError, match="a run named 'same' already exists"):
        with modtrace.Recorder(run="same") as _rec:
            pass
        _rec.wait_analyzed()  # the writer process analyses the run after the with
    assert db_rows(str(db_path), "SELECT name, status FROM runs") == [("same", "completed")]


def test_exception_marks_failed_and_keeps_events(db_path: object) -> None:
    model = mlp()
    with pytest.raises(ZeroDivisionError):
        with modtrace.Recorder(run="boom") as _rec:
            train(model, 2)
            raise ZeroDivisionError("division by zero")
        _rec.wait_analyzed()  # the writer process analyses the run after the with
    assert db_rows(str(db_path), "SELECT status, error FROM runs") == [("failed", "ZeroDivisionError: division by zero")]
    assert db_rows(str(db_path), "SELECT COUNT(*) FROM event_log") == [(32,)]


def test_keyboard_interrupt_inside_a_forward_marks_interrupted_and_closes_the_open_calls(db_path: object) -> None:
    class Stop(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise KeyboardInterrupt

    model = nn.Sequential(nn.Linear(8, 8), Stop())
    with pytest.raises(KeyboardInterrupt):
        with modtrace.Recorder(run="ctrl-c") as _rec:
            model(torch.randn(1, 8))
        _rec.wait_analyzed()  # the writer process analyses the run after the with
    assert db_rows(str(db_path), "SELECT status FROM runs") == [("interrupted",)]
    ev = db_rows(str(db_path), "SELECT kind, fqn, status FROM event_log ORDER BY seq")
    # KeyboardInterrupt skips torch's always_call hooks; the recorder closes what was open
    assert ev[-2:] == [("exit", "Sequential.1", "error"), ("exit", "Sequential", "error")]


def test_leaving_the_context_removes_every_hook_and_later_backward_records_nothing(db_path: object) -> None:
    before = (dict(module_hooks._global_forward_pre_hooks), dict(module_hooks._global_forward_hooks),
              dict(module_hooks._global_forward_hooks_always_called), dict(module_hooks._global_forward_hooks_with_kwargs),
              dict(optimizer_hooks._global_optimizer_post_hooks))
    model = mlp()
    with modtrace.Recorder(run="r") as _rec:
        out = model(torch.randn(2, 8, requires_grad=True)).sum()
    _rec.wait_analyzed()  # the writer process analyses the run after the with
    after = (dict(module_hooks._global_forward_pre_hooks), dict(module_hooks._global_forward_hooks),
             dict(module_hooks._global_forward_hooks_always_called), dict(module_hooks._global_forward_hooks_with_kwargs),
             dict(optimizer_hooks._global_optimizer_post_hooks))
    assert before == after
    out.backward()
    train(model, 1)
    assert db_rows(str(db_path), "SELECT COUNT(*), MAX(phase) FROM event_log") == [(8, "forward")]


def test_long_recording_keeps_memory_flat(db_path: object) -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(2, 8, requires_grad=True)  # one leaf input reused every step

    def steps(n: int) -> None:
        for _ in range(n):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()

    with modtrace.Recorder(run="long", flush_every=500, analyze=False) as rec:
        steps(100)
        rec.flush()
        gc.collect()
        tracemalloc.start()
        base, _ = tracemalloc.get_traced_memory()
        steps(900)
        rec.flush()
        gc.collect()
        grown, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        tracker = rec._tracker
        assert tracker is not None
        assert len(tracker._bw) == 0 and len(tracker._recomputed) == 0
        assert len(tracker._leaf_handles) <= 1
    assert rec.step_count == 1000
    # 900 steps x 16 events went to the database; what stays in memory must not grow with them
    assert grown - base < 200_000, f"memory grew by {grown - base} bytes over 900 steps"
    assert db_rows(str(db_path), "SELECT COUNT(*) FROM events") == [(16_000,)]


def test_unflushed_window_goes_out_in_batches(db_path: object) -> None:
    model = mlp()
    with modtrace.Recorder(run="batches", flush_every=100, analyze=False) as rec:
        with torch.no_grad():
            for _ in range(50):
                model(torch.randn(1, 8))
        written_inside = rec.flush()
        assert written_inside >= 0
        assert db_rows(str(db_path), "SELECT COUNT(*) FROM events") == [(400,)]


# -- where batches are written: a writer process, or a thread ------------------

EVENT_SQL = ("SELECT seq, ts_ns, kind, module_id, phase, call_id, step, thread_id, device_id, stream, status,"
             " graph_task, tie FROM events WHERE run_id = :r ORDER BY seq")


def _pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] in ("Z", "X")  # a zombie has exited
    except FileNotFoundError:
        return True


def _wait_gone(pid: int, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _pid_gone(pid):
            return True
        time.sleep(0.05)
    return False


def test_every_writer_writes_the_same_rows(any_db: str) -> None:
    recorded = {}
    for writer in ("process", "thread", "inline"):
        torch.manual_seed(0)
        model = mlp()
        with modtrace.Recorder(db=any_db, run=writer, clock=FakeClock(), writer=writer, analyze=False) as rec:
            train(model, 2)
            rec.flush()
            pid = rec.writer_pid
            train(model, 3)
        if writer == "process":
            assert pid is not None and pid != os.getpid()
            assert _wait_gone(pid, 0.0) or _pid_gone(pid)  # the recording ended: so did its writer
        else:
            assert pid is None
        # graph task ids come from torch's own counter: compare them by order of appearance
        events = db_rows(any_db, EVENT_SQL, r=rec.run_id)
        tasks: dict[object, int] = {}
        recorded[writer] = [e[:11] + (None if e[11] is None else tasks.setdefault(e[11], len(tasks)),) + e[12:] for e in events]
        assert db_rows(any_db, "SELECT event_count, step_count, status FROM run_ranks WHERE run_id = :r", r=rec.run_id) == [
            (80, 5, "completed")]
    assert len(recorded["process"]) == 80 and recorded["process"] == recorded["thread"] == recorded["inline"]


def test_the_inline_writer_writes_each_step_at_its_boundary(db_path: object) -> None:
    model = mlp()
    with modtrace.Recorder(run="inline", writer="inline", analyze=False) as rec:
        for step in range(1, 4):
            train(model, 1)  # the optimizer step ends the step: its 16 events are written then
            assert db_rows(str(db_path), "SELECT COUNT(*), MAX(step) FROM events") == [(16 * step, step - 1)]
        assert rec.writer_pid is None


def test_the_writer_can_be_chosen_from_the_environment(db_path: object, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MODTRACE_WRITER", "thread")
    with modtrace.Recorder(run="env") as rec:
        assert rec.writer_mode == "thread" and rec._proc is None
    rec.wait_analyzed()  # the writer process analyses the run after the with
    monkeypatch.setenv("MODTRACE_WRITER", "bogus")
    with pytest.raises(UsageError, match="MODTRACE_WRITER must be one of auto, process, thread, inline, not 'bogus'"):
        modtrace.Recorder(run="env2")
    (tmp_path / "s.py").write_text("print('ran')\n")
    db = tmp_path / "new.db"
    proc = subprocess.run([sys.executable, "-m", "modtrace", "record", "--db", str(db), str(tmp_path / "s.py")],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "MODTRACE_WRITER": "bogus"})
    assert proc.returncode == 2 and proc.stdout == "" and not db.exists()
    assert proc.stderr == "modtrace: error: MODTRACE_WRITER must be one of auto, process, thread, inline, not 'bogus'\n"


def test_a_recording_shorter_than_the_writers_start_is_written_by_the_program(db_path: object) -> None:
    # writer="auto": batches go through this process until the writer process
    # is ready; one still starting at the end is stopped, not waited for.
    with modtrace.Recorder(run="short", analyze=False) as rec:
        proc = rec._proc
        assert proc is not None
        mlp()(torch.randn(1, 8))
    assert rec.status == "completed" and db_rows(str(db_path), "SELECT COUNT(*) FROM events") == [(8,)]
    assert proc.proc.returncode is not None  # reaped, whichever way it ended


def test_a_killed_writer_process_is_replaced_by_a_thread(db_path: object) -> None:
    model = mlp()
    with modtrace.Recorder(run="killed-writer", writer="process", analyze=False) as rec:
        train(model, 2)
        rec.flush()
        pid = rec.writer_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        train(model, 3)
        rec.flush()
        assert rec.writer_pid is None
        train(model, 1)
    assert rec.status == "completed"
    seqs = [r[0] for r in db_rows(str(db_path), "SELECT seq FROM events ORDER BY seq")]
    assert seqs == list(range(6 * 16)) == list(range(rec.events_recorded))


def test_batches_in_flight_when_the_writer_process_dies_are_written_once(db_path: object) -> None:
    # The writer is stopped (SIGSTOP) while steps hand it batches, then killed:
    # what it had not committed is written by this process, nothing twice.
    model = mlp()
    with modtrace.Recorder(run="in-flight", writer="process", analyze=False) as rec:
        train(model, 2)
        rec.flush()
        pid = rec.writer_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        train(model, 5)  # handed over, not answered
        assert rec._in_flight and rec._written == 2 * 16
        os.kill(pid, signal.SIGKILL)
        train(model, 3)
    assert rec.status == "completed" and rec.writer_pid is None
    seqs = [r[0] for r in db_rows(str(db_path), "SELECT seq FROM events ORDER BY seq")]
    assert seqs == list(range(10 * 16)) == list(range(rec.events_recorded))
    assert db_rows(str(db_path), "SELECT event_count, step_count FROM run_ranks") == [(160, 10)]


def test_batches_committed_but_unanswered_when_the_writer_process_dies_are_not_written_again(db_path: object) -> None:
    model = mlp()
    with modtrace.Recorder(run="committed", writer="process", analyze=False) as rec:
        train(model, 2)
        rec.flush()
        pid = rec.writer_pid
        assert pid is not None
        steps = 2
        # Each step hands its batch over; the scenario needs the last answer unread.  The
        # flusher thread may read it first (a busy machine can delay this thread past its
        # flush interval), or hold its lock while a step ends (the step then hands nothing
        # over): then take another step, with the flusher held out once it succeeds.
        for _ in range(50):
            train(model, 1)
            steps += 1
            rec._flush_lock.acquire()
            if rec._in_flight and not rec._pending and not rec._buf:  # every event handed over
                break
            rec._flush_lock.release()
        else:
            pytest.fail("every step's answer was read before the flusher could be held out")
        try:
            deadline = time.monotonic() + 30
            while db_rows(str(db_path), "SELECT event_count FROM run_ranks") != [(16 * steps,)]:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            # Committed, and then the answers are lost with the process (as when
            # it dies between its commit and its answer): swallow them here.
            proc = rec._proc
            assert proc is not None
            assert select.select([proc._in], [], [], 30)[0]
            time.sleep(0.1)
            assert os.read(proc._in, 1 << 16)
            os.kill(pid, signal.SIGKILL)
        finally:
            rec._flush_lock.release()
        train(model, 1)
    assert rec.status == "completed" and rec._flush_error is None
    seqs = [r[0] for r in db_rows(str(db_path), "SELECT seq FROM events ORDER BY seq")]
    assert seqs == list(range(16 * (steps + 1)))


PROGRAM = textwrap.dedent(
    """
    import os, signal, sys, torch
    from torch import nn
    import modtrace
    db, how = sys.argv[1:3]
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))
    with modtrace.Recorder(db=db, run="victim", writer="process", analyze=False) as rec:
        for step in range(20):
            model(torch.randn(4, 8)).sum().backward()
            rec.step()
        rec.flush()
        print(rec.writer_pid, rec.events_recorded, flush=True)
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        for step in range(20):
            model(torch.randn(4, 8)).sum().backward()
            rec.step()
        try:
            os.killpg(0, signal.SIGINT)  # Ctrl-C at a terminal reaches every process of the group
            signal.pause()
        except KeyboardInterrupt:
            print(rec.writer_pid, flush=True)  # the same writer process, still writing
            raise
    """
)


@pytest.mark.parametrize("how", ["kill", "group-sigint"])
def test_the_writer_process_ends_with_the_program(tmp_path: Path, how: str) -> None:
    db = tmp_path / "victim.db"
    (tmp_path / "victim.py").write_text(PROGRAM)
    proc = subprocess.run([sys.executable, str(tmp_path / "victim.py"), str(db), how], capture_output=True, text=True,
                          timeout=120, start_new_session=True, cwd=tmp_path)
    pid, flushed, *after = (int(v) for v in proc.stdout.split())
    assert _wait_gone(pid), "the writer process outlived the program"
    facts = db_rows(str(db), "SELECT r.status, k.event_count, (SELECT COUNT(*) FROM events) FROM runs r JOIN run_ranks k ON k.run_id = r.id")
    if how == "kill":
        assert proc.returncode == -signal.SIGKILL
        # everything flushed before the kill is there, and the count agrees with the rows
        assert facts == [("running", flushed, flushed)]
    else:
        # SIGINT reached the writer too; it ignores it and the program ends the recording itself
        assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr
        assert after == [pid]
        assert facts == [("interrupted", 2 * flushed, 2 * flushed)]


# -- ModuleTracker: torch's own expectations for its tracker hold for ours ------


def test_module_tracker_parents_in_forward_and_backward() -> None:
    from copy import copy

    seen_fw: list[tuple[set[str], bool]] = []
    seen_bw: list[tuple[set[str], bool]] = []

    class Foo(nn.Module):
        def forward(self, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            y = x["a"].relu_()
            seen_fw.append((copy(tracker.parents), tracker.is_bw))
            y.register_hook(lambda grad: seen_bw.append((copy(tracker.parents), tracker.is_bw)))
            return {"a": torch.mm(y, y)}

    class Mod(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = Foo()
            self.b = nn.ModuleDict({"nest": Foo()})
            self.c = nn.ModuleList([Foo()])

        def forward(self, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
            x = self.c[0](x)
            return self.b["nest"](self.a(x))

    mod = Mod()
    with modtrace.ModuleTracker() as tracker:
        for _ in range(2):
            mod({"a": torch.randn(10, 10, requires_grad=True).clone()})["a"].sum().backward()
        assert not tracker.is_bw and tracker.parents == {"Global"}
    assert seen_fw == [({"Global", "Mod", f"Mod.{n}"}, False) for n in ("c.0", "a", "b.nest")] * 2
    assert seen_bw == [({"Global", "Mod", f"Mod.{n}"}, True) for n in ("b.nest", "a", "c.0")] * 2


def test_module_tracker_self_calling_module_under_checkpoint_and_bw_detection() -> None:
    from torch.utils.checkpoint import checkpoint

    class MyMod(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = nn.Linear(2, 2)
            self.ran = False

        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            if not self.ran:
                self.ran = True
                return self(inp)
            self.ran = False
            return self.inner(inp)

    mod = MyMod()
    inp = torch.rand(1, 2, requires_grad=True)
    with modtrace.ModuleTracker() as tracker:
        mod(inp).sum().backward()
        assert tracker.parents == {"Global"}
    with modtrace.ModuleTracker() as tracker:
        checkpoint(lambda t: mod(t), inp, use_reentrant=False).sum().backward()
        assert tracker.parents == {"Global"}
    lin = nn.Linear(2, 2)
    with modtrace.ModuleTracker() as tracker:
        lin(torch.rand(2, requires_grad=True)).sum().backward()
        assert not tracker.is_bw
        assert tracker.parents == {"Global"}


def test_module_tracker_leaf_grad_does_not_crash() -> None:
    # torch's trackers crash here (PyTorch issue 131753)
    lin = nn.Linear(3, 3)
    x = torch.randn(2, 3, requires_grad=True)
    with modtrace.ModuleTracker() as tracker:
        (g,) = torch.autograd.grad(lin(x).sum(), x)
        assert g.shape == x.shape
        assert tracker.parents == {"Global"}


def test_ranks_of_one_launch_share_a_run_but_never_join_a_finished_one(any_db: str) -> None:
    model = mlp()
    with modtrace.Recorder(db=any_db, run="dist", rank=0, world_size=2, analyze=False) as r0:
        with modtrace.Recorder(db=any_db, run="dist", rank=1, world_size=2, analyze=False) as r1:
            train(model, 1)
        assert r0.run_id == r1.run_id
    assert db_rows(any_db, "SELECT status, world_size FROM runs") == [("completed", 2)]
    assert db_rows(any_db, "SELECT rank, status FROM run_ranks ORDER BY rank") == [(0, "completed"), (1, "completed")]
    with pytest.raises(UsageError, match="already exists"):
        with modtrace.Recorder(db=any_db, run="dist", rank=1, world_size=2) as _rec:
            pass
        _rec.wait_analyzed()  # the writer process analyses the run after the with
