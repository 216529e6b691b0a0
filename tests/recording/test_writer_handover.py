"""The batches' way to the writer process, on real recordings: what is stored
is the same whichever process writes it, packed batches keep only their
frames, and frames cross a real pipe whole whatever its reads return."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import threading
import time

import pytest
import sqlalchemy as sa
import torch
from sqlalchemy.exc import IntegrityError
from torch import nn

import modtrace
from modtrace.core.contracts import Batch
from modtrace.recording.config import PendingBatch
from modtrace.recording.writer_messages import HEADER, Inbox, frame, pack_batch
from modtrace.store.engine import open_store
from modtrace.store.runs import add_rank, create_run
from modtrace.store.schema import runs
from modtrace.store.writer import RankWriter
from modtrace.tracking.tracker import Tracker
from tests.helpers.database import db_rows
from tests.helpers.models import Net
from tests.helpers.recording import FakeClock
from tests.helpers.training import train

# NULLs read back as NULLs, not as a value an adapter made of None (e.g. 'None').
EVENT_SQL = ("SELECT seq, ts_ns, kind, module_id, phase, call_id, step, thread_id, device_id, device_id IS NULL,"
             " stream, stream IS NULL, status, graph_task, graph_task IS NULL, tie FROM events"
             " WHERE run_id = :r ORDER BY seq")


class Constant(nn.Module):
    """A module with no tensor input, parameter or buffer: its events have no device (NULL)."""

    def forward(self, n: int) -> torch.Tensor:
        return torch.ones(2, n)


class WithNulls(nn.Module):
    """Every nullable event column NULL somewhere: no device (Constant), no graph task
    (forward), no stream (CPU); backward and checkpoint recompute events carry a graph task."""

    def __init__(self) -> None:
        super().__init__()
        self.constant = Constant()
        self.net = Net()

    def forward(self) -> torch.Tensor:
        return self.net(self.constant(4))


def _loss(model: nn.Module) -> torch.Tensor:
    return model().sum()  # WithNulls takes no input




def test_the_writer_process_stores_the_same_rows_and_nulls_as_this_process(any_db: str) -> None:
    recorded = {}
    for writer in ("process", "thread"):
        torch.manual_seed(0)
        model = WithNulls()
        with modtrace.Recorder(db=any_db, run=writer, clock=FakeClock(), writer=writer, analyze=False,
                               step_on="manual") as rec:
            train(model, 2, loss=_loss, lr=None, each_step=rec.step)
            rec.flush()
            assert (rec.writer_pid is not None) == (writer == "process")
            train(model, 3, loss=_loss, lr=None, each_step=rec.step)
        events = db_rows(any_db, EVENT_SQL, r=rec.run_id)
        tasks: dict[object, int] = {}  # torch's own graph task ids: compared by order of appearance
        recorded[writer] = [e[:13] + (None if e[13] is None else tasks.setdefault(e[13], len(tasks)),) + e[14:]
                            for e in events]
    process, thread = recorded["process"], recorded["thread"]
    assert process == thread and len(process) == rec.events_recorded
    assert any(e[9] for e in process) and not all(e[9] for e in process)  # device_id: NULL and not
    assert all(e[11] for e in process)  # stream: NULL on CPU
    assert any(e[14] for e in process) and not all(e[14] for e in process)  # graph_task: NULL and not


def test_the_writer_childs_none_adapter_binds_null() -> None:
    # In a fresh interpreter, as the writer process is: the adapter is that process's own.
    code = ("import sqlite3; from modtrace.recording.writer_child import _bind_none_fast; _bind_none_fast(); "
            "c = sqlite3.connect(':memory:'); c.execute('CREATE TABLE t (a INTEGER, b TEXT)'); "
            "c.executemany('INSERT INTO t VALUES (?, ?)', [(None, 'x'), (2, None)]); "
            "print(c.execute('SELECT typeof(a), typeof(b), a, b FROM t').fetchall())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[('null', 'text', None, 'x'), ('integer', 'null', 2, None)]"


def _step_events() -> list[tuple[object, ...]]:
    events: list[tuple[object, ...]] = []
    tracker = Tracker(events.append)
    torch.manual_seed(0)
    model = WithNulls()
    tracker.start()
    try:
        model().sum().backward()
    finally:
        tracker.stop()
    return events


def test_a_packed_batch_keeps_only_its_frame_and_unpacks_to_the_same_events() -> None:
    events = _step_events()
    copy = list(events)
    taken = PendingBatch(Batch(events, [(0, "m", "M", None)], [], [], (len(events), 1)))
    assert taken.count == len(copy) and taken.rows().events is events
    taken.packed(pack_batch(taken.rows()))
    assert taken.batch is None and taken.frame is not None
    assert taken.count == len(copy) and taken.progress == (len(copy), 1)
    assert taken.rows() == Batch(copy, [(0, "m", "M", None)], [], [], (len(copy), 1), [], [])
    message = pickle.loads(taken.frame[HEADER.size:])  # the pipe carries the batch's fields as a tuple
    assert message == ("write", copy, [(0, "m", "M", None)], [], [], (len(copy), 1), [], [])


def test_batches_waiting_for_a_stopped_writer_hold_frames_and_are_all_written(db_path: object) -> None:
    # The writer process is stopped while steps hand it batches: they wait packed (no event
    # tuples kept), and once it goes on every event is written, in order, once.
    model = WithNulls()
    with modtrace.Recorder(run="stopped", writer="process", analyze=False, step_on="manual") as rec:
        train(model, 2, loss=_loss, lr=None, each_step=rec.step)
        rec.flush()
        pid = rec.writer_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        try:
            train(model, 4, loss=_loss, lr=None, each_step=rec.step)
            # The flusher thread may be waiting for the stopped writer's answers (holding the
            # flush lock, everything it took sent, the last steps' events left in the buffer);
            # else it is kept out while the batches are counted.
            idle = rec._flush_lock.acquire(timeout=5)
            try:
                with rec._take_lock:
                    sent = list(rec._in_flight)
                    assert sent and all(b.batch is None and b.frame is not None for b in sent)
                    waiting = sum(b.count for b in (*sent, *rec._pending)) + len(rec._buf)
                    assert waiting == rec.events_recorded - rec._written
            finally:
                if idle:
                    rec._flush_lock.release()
        finally:
            os.kill(pid, signal.SIGCONT)
        train(model, 1, loss=_loss, lr=None, each_step=rec.step)
    assert rec.status == "completed"
    seqs = [r[0] for r in db_rows(str(db_path), "SELECT seq FROM events ORDER BY seq")]
    assert seqs == list(range(rec.events_recorded))


def test_frames_cross_a_pipe_whole_whatever_its_reads_return() -> None:
    # Frames smaller and far larger than the inbox's read buffer, written while it reads.
    events = _step_events()
    messages = [("ok",), ("write", events * 50, [], [], [], (1, 1), [], []), ("closed",), ("error", "x" * 100_000)]
    read_end, write_end = os.pipe()
    frames = [pack_batch(Batch(m[1], progress=m[5])) if m[0] == "write" else frame(m) for m in messages]

    def feed() -> None:
        with os.fdopen(write_end, "wb", buffering=0) as out:
            for f in frames:
                view = memoryview(f)
                while view:  # small writes: frames arrive in many pieces
                    n = out.write(view[:7_919])
                    view = view[n or 0:]
                    time.sleep(0)

    writer = threading.Thread(target=feed)
    writer.start()
    try:
        inbox = Inbox(read_end, chunk=4096)
        got = [inbox.next() for _ in messages]
        assert inbox.next() is None and inbox.closed
    finally:
        writer.join()
        os.close(read_end)
    assert got == messages


def test_a_run_deleted_while_its_writer_is_open_refuses_the_next_batch_and_leaves_no_rows(any_db: str) -> None:
    # SQLite's writer checks the run once a batch, PostgreSQL every row: the same refusal.
    events = _step_events()
    store = open_store(any_db, create=True)
    try:
        run_id, _ = create_run(store, "doomed", {})
        add_rank(store, run_id, 0, wall_anchor_ns=0)
        kept, _ = create_run(store, "kept", {})
        add_rank(store, kept, 0, wall_anchor_ns=0)
        writer, other = RankWriter(store, run_id, 0), RankWriter(store, kept, 0)
        try:
            writer.write(Batch(events, progress=(len(events), 1)))
            other.write(Batch(events, progress=(len(events), 1)))
            with store.engine.begin() as conn:
                conn.execute(sa.delete(runs).where(runs.c.id == run_id))
            later = [(len(events) + e[0], *e[1:]) for e in events]
            with pytest.raises(IntegrityError):
                writer.write(Batch(later, modules=[(0, "m", "M", None)], progress=(2 * len(events), 2)))
            other.write(Batch(later, progress=(2 * len(events), 2)))
        finally:
            writer.close()
            other.close()
        with store.engine.connect() as conn:
            for table in ("events", "modules", "run_ranks"):
                counts = dict(conn.exec_driver_sql(f"SELECT run_id, COUNT(*) FROM {table} GROUP BY run_id").all())
                assert run_id not in counts, table
            assert conn.exec_driver_sql(f"SELECT COUNT(*) FROM events WHERE run_id = {kept}").scalar() == 2 * len(events)
    finally:
        store.dispose()
