"""The batches' way from the program's buffer to the store.

Inside a recording every module call appends a tuple to an in-memory list
(the tracker's hot path).  The list goes to the store in batches: at each
step boundary (handed to the writer process by the program itself, between
steps, without waiting), and from a background thread whenever
``flush_every`` events are waiting (``EAGER_BATCH`` once a writer process
takes them) and at least once a second; the last batch is written when the
recording ends.  Batches are written by a writer process
(``modtrace.recording.writer_process``) once it is ready, else by a thread of
the program (``writer=`` chooses).  A process killed with SIGKILL loses at
most the window not yet handed over: about ``flush_every`` events or one
second of events, whichever is smaller (up to ``WRITER_START_WAIT_S`` while
the writer process starts).

``Flushing`` is the recorder's part that does this: a mixin over the
attributes ``Recorder.__init__`` sets, listed below.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from typing import Any

from modtrace.core.contracts import Batch
from modtrace.core.errors import StoreError, one_line
from modtrace.core.secrets import mask
from modtrace.recording import forking
from modtrace.recording.config import (
    EAGER_BATCH,
    FLUSH_INTERVAL_S,
    POLL_S,
    WRITER_START_WAIT_S,
    PendingBatch,
    drain,
    ranges,
)
from modtrace.recording.writer_process import WriterProcess, WriterProcessError
from modtrace.store.engine import Store
from modtrace.store.retry import ResumingWriter, is_transient
from modtrace.tracking.tracker import Tracker


class Flushing:
    """Taking the buffer into batches and writing them, in order."""

    run_id: int
    rank: int
    run_name: str
    writer_mode: str
    flush_every: int
    _buf: list[tuple[Any, ...]]
    _taken: int
    _pending: deque[PendingBatch]
    _in_flight: deque[PendingBatch]
    _last_handoff: float
    _written: int
    _store: Store | None
    _writer: ResumingWriter | None
    _proc: WriterProcess | None
    _tracker: Tracker | None
    _take_lock: threading.Lock
    _flush_lock: threading.Lock
    _wake: threading.Event
    _stopping: threading.Event
    _flush_error: StoreError | None
    _dropped: int
    _shed: int
    _shed_steps: set[int]
    _last_taken_step: int | None
    _forked_child: bool
    _started: float
    max_buffered: int
    _device_rows: list[tuple[Any, ...]]
    _forks: forking.ForkCounter | None

    def flush(self) -> int:
        """Write buffered events and names now; returns the number of events written."""
        return self._flush(take=True)

    def _flush(self, take: bool, retry: bool = True, wait: bool = True) -> int:
        """Write the pending batches, after taking the buffer into one
        (``take``), and wait until all are written.  ``retry=False``: a
        transient fault leaves them pending for the flusher thread to resume;
        ``wait=False``: nothing happens while another thread writes."""
        if self._tracker is None or self._writer is None or self._forked_child:
            return 0
        if not self._flush_lock.acquire(blocking=wait):
            return 0
        try:
            if self._flush_error is not None:
                return 0  # recording stopped at a failed write
            if take:
                with self._take_lock:
                    self._take()
            before = self._written
            proc = self._usable_proc()
            if proc is not None:
                try:
                    while self._pending:
                        batch = self._pending[0]
                        proc.send(self._frame(proc, batch))
                        self._in_flight.append(self._pending.popleft())
                    self._settle(proc.replies(len(self._in_flight)))
                except WriterProcessError:
                    self._recover()
            writer = self._writer
            while self._pending:  # no writer process, or it is gone
                batch = self._pending[0]
                try:
                    writer.write(batch.rows(), retry=retry)
                except Exception as exc:  # the batch stays pending for another try
                    if not retry and is_transient(exc) and not writer.expired:
                        self._wake.set()  # the flusher thread resumes it
                        break
                    raise StoreError(f"writing events to {writer.store.label} failed: {one_line(exc)}") from exc
                self._pending.popleft()
                self._written += batch.count
        finally:
            self._flush_lock.release()
        return self._written - before

    def _take(self, pack: WriterProcess | None = None) -> None:
        """Move what is buffered into a pending batch (the caller holds _take_lock)."""
        tracker = self._tracker
        assert tracker is not None
        buf = self._buf
        n = len(buf)
        # Device times that resolved by now (polled here: at step boundaries and by the flusher).
        timer = tracker.device_timer
        device_rows = timer.poll() if timer is not None else []
        if self._device_rows:
            device_rows, self._device_rows = self._device_rows + device_rows, []
        if not n and not device_rows:
            return  # names travel with the events that name them
        events = buf[:n]
        del buf[:n]
        # Events first, then names: every name an event refers to was
        # registered before the event, so it is in this batch or an earlier one.
        batch = PendingBatch(Batch(events, drain(tracker.new_modules), drain(tracker.new_threads),
                                   drain(tracker.new_devices), (self._taken + n, tracker.step),
                                   drain(tracker.new_roots), device_rows))
        self._taken += n
        if n:
            self._last_taken_step = events[-1][6]
        if pack is not None:
            del events  # the batch's list is the last reference: packing frees the tuples
            self._frame(pack, batch)
        self._pending.append(batch)

    @staticmethod
    def _frame(proc: WriterProcess, batch: PendingBatch) -> bytes:
        """The batch packed for the writer process (packed once; its tuples are freed then)."""
        if batch.frame is None:
            batch.packed(proc.pack(batch.rows()))
        assert batch.frame is not None
        return batch.frame

    def _handoff(self, proc: WriterProcess) -> None:
        """Pending batches to the writer process as far as its pipe has room,
        and the answers that have arrived; never waits (holds _flush_lock)."""
        try:
            while self._pending:
                batch = self._pending[0]
                if not proc.send_nowait(self._frame(proc, batch)):
                    break
                self._in_flight.append(self._pending.popleft())
            self._settle(proc.replies())
        except WriterProcessError:
            self._recover()

    def _settle(self, replies: list[tuple[Any, ...]]) -> None:
        """Account for the writer process's answers, oldest batch first."""
        for reply in replies:
            batch = self._in_flight[0]
            if reply[0] != "ok":
                # Refused: it and every batch after it are not written (the
                # writer process skips them); they are pending again.
                assert self._writer is not None
                self._pending.extendleft(reversed(self._in_flight))
                self._in_flight.clear()
                why = reply[1] if reply[0] == "error" else "an earlier batch failed"
                raise StoreError(f"writing events to {self._writer.store.label} failed: {why}")
            self._in_flight.popleft()
            self._written += batch.count

    def _recover(self) -> None:
        """The writer process is gone (killed, out of memory, or it could not
        open the database): this process writes from now on.  Batches it was
        given and did not answer for may be committed: the rank's event count,
        written in the same transaction as each batch, tells which."""
        self._proc = None
        if not self._in_flight:
            return
        assert self._store is not None
        with self._store.engine.connect() as conn:
            committed = conn.exec_driver_sql(
                f"SELECT event_count FROM run_ranks WHERE run_id = {int(self.run_id)} AND rank = {int(self.rank)}").scalar()
        committed = int(committed or 0)
        while self._in_flight and self._in_flight[0].progress[0] <= committed:
            self._written += self._in_flight.popleft().count
        self._pending.extendleft(reversed(self._in_flight))
        self._in_flight.clear()

    def _usable_proc(self) -> WriterProcess | None:
        """The writer process when batches should go to it: once it is ready
        (``writer="auto"``: until then this process writes, so a short
        recording never waits for it) or always (``writer="process"``)."""
        proc = self._proc
        if proc is None:
            return None
        try:
            if proc.alive and (self.writer_mode == "process" or proc.ready()):
                return proc
        except WriterProcessError:  # it could not open the database: write from here
            pass
        if not proc.alive:
            self._proc = None
        return None

    def _writer_starting(self, now: float) -> bool:
        """writer="auto" and its process is still starting (not for longer
        than WRITER_START_WAIT_S since the recording began)."""
        proc = self._proc
        if proc is None or self.writer_mode != "auto" or now - self._started >= WRITER_START_WAIT_S:
            return False
        try:
            return proc.alive and not proc.ready()
        except WriterProcessError:
            return False

    def _close_writers(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.close()
        if self._writer is not None:
            self._writer.close()

    def _flush_loop(self) -> None:
        last = time.monotonic()
        while not self._stopping.is_set():
            woken = self._wake.wait(POLL_S)
            self._wake.clear()
            if self._stopping.is_set():
                break
            now = time.monotonic()
            waiting = len(self._buf)
            last = max(last, self._last_handoff)  # a step handed its events over
            if (woken or self._pending or waiting >= self.flush_every or now - last >= FLUSH_INTERVAL_S
                    or (waiting >= EAGER_BATCH and self._usable_proc() is not None)):
                if waiting < self.flush_every and self._writer_starting(now):
                    continue
                if not self._buf and not self._pending and not woken:
                    last = now
                    continue
                try:
                    # Batches packed at step boundaries go as they are; the few
                    # events of the step now running wait for its end.
                    self._flush(take=not self._pending or waiting >= EAGER_BATCH or now - last >= FLUSH_INTERVAL_S)
                except StoreError as exc:
                    self._write_failed(exc)
                    return
                last = now

    def _write_failed(self, exc: StoreError) -> None:
        """Stop recording after a failed write; the program itself goes on."""
        if self._flush_error is not None:
            return
        self._flush_error = exc
        if self._tracker is not None:
            self._tracker._append = self._drop  # later events are counted, not kept
            self._tracker.device_timer = None
        print(mask(f"modtrace: error: {exc}; recording stopped (run {self.run_name!r} will be marked failed)"), file=sys.stderr)

    def _report_faults(self) -> None:
        """One line on stderr when the recording met faults it got past."""
        assert self._store is not None
        with self._store.engine.connect() as conn:
            reconnects = conn.exec_driver_sql(
                f"SELECT reconnects FROM run_ranks WHERE run_id = {int(self.run_id)} AND rank = {int(self.rank)}").scalar()
        parts = []
        if reconnects:
            parts.append(f"resumed after {reconnects} lost connection(s) or lock timeout(s), nothing lost")
        if self._shed:
            parts.append(f"{self._shed:,} event(s) of step(s) {ranges(self._shed_steps)} dropped while the database "
                         f"was unreachable (more than {self.max_buffered:,} waited)")
        if parts:
            print(mask(f"modtrace: warning: run {self.run_name!r}: " + "; ".join(parts)), file=sys.stderr)
        forked = self._forks.total() if self._forks is not None else 0
        if forked:
            print(mask(f"modtrace: note: run {self.run_name!r}: {forked:,} module call(s) ran in forked child "
                       "processes (e.g. DataLoader workers) and were not recorded"), file=sys.stderr)

    def _drop(self, event: tuple[Any, ...]) -> None:
        self._dropped += 1

    def _shed_step(self) -> None:
        """Over the memory bound while writes wait: the buffered steps go."""
        with self._take_lock:
            buf = self._buf
            n = len(buf)
            start = 0  # a step partly taken already stays whole: its rest is kept
            while start < n and buf[start][6] == self._last_taken_step:
                start += 1
            steps = {event[6] for event in buf[start:n]}
            del buf[start:n]
            n -= start
        self._shed += n
        self._shed_steps |= steps

