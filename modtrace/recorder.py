"""Recording session: a run in the database, a tracker, a buffer and a flusher.

``Recorder`` is a context manager.  Inside it, every module call appends a
tuple to an in-memory list (the tracker's hot path).  The list goes to the
store in batches: at each step boundary (handed to the writer process by the
program itself, between steps, without waiting), and from a background
thread whenever ``flush_every`` events are waiting (``EAGER_BATCH`` once a
writer process takes them) and at least once a second; the last batch is
written when the context exits (also from ``atexit`` and on SIGTERM).
Batches are written by a writer process (``modtrace.store.writer_process``)
once it is ready, else by a thread of the program (``writer=`` chooses).  A
process killed with SIGKILL loses at most the window not yet handed over:
about ``flush_every`` events or one second of events, whichever is smaller
(up to ``WRITER_START_WAIT_S`` while the writer process starts).
"""

from __future__ import annotations

import atexit
import os
import platform
import shlex
import signal
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from modtrace import forking
from modtrace._version import __version__
from modtrace.codes import Status
from modtrace.device_clock import DeviceClock, drain_rows
from modtrace.errors import StoreError, Terminated, UsageError, one_line
from modtrace.masking import mask
from modtrace.naming import default_run_name, shared_run_name
from modtrace.step_rules import STEP_RULES
from modtrace.store.engine import Store, open_store
from modtrace.store.retry import ResumingWriter, call_retrying, is_transient, retry_seconds
from modtrace.store.runs import _pid_alive, add_rank, create_run, finish_rank
from modtrace.store.writer_process import WriterProcess, WriterProcessError
from modtrace.tracker import Tracker

DEFAULT_FLUSH_EVERY = 20_000
FLUSH_INTERVAL_S = 1.0
_POLL_S = 0.1
# With a writer process, smaller batches go as soon as this many events wait
# (checked every _POLL_S): handing one over costs the program only the
# pickling, and the final flush, which the program waits for, is then short.
EAGER_BATCH = 4096
# While the writer process starts (about 0.3 s), batches wait for it rather
# than being written by the program for a while and then not: the program's
# timing stays the same from the first step to the last.  Up to this long,
# and up to flush_every events.
WRITER_START_WAIT_S = 5.0
WRITERS = ("auto", "process", "thread", "inline")
# While the database is unreachable events wait in memory; beyond this many
# (about 250 bytes each), whole steps are dropped at step boundaries and the
# run says which (run_ranks.dropped_steps).
MAX_BUFFERED_EVENTS = 1_000_000


@dataclass
class _Batch:
    """Events and names taken from the buffers, not yet written."""

    events: list[tuple[Any, ...]]
    modules: list[tuple[Any, ...]]
    threads: list[tuple[Any, ...]]
    devices: list[tuple[Any, ...]]
    roots: list[tuple[Any, ...]]
    progress: tuple[int, int]  # (event_count, step_count) once this batch is written
    frame: bytes | None = None  # packed for the writer process
    device_rows: list[tuple[Any, ...]] = field(default_factory=list)  # resolved device times (device_clock.DeviceRow)


def _dist_rank_world() -> tuple[int, int]:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
    except Exception:  # pragma: no cover - a broken distributed setup still records rank 0
        pass
    return int(os.environ.get("RANK", "0") or 0), int(os.environ.get("WORLD_SIZE", "1") or 1)


def recorder_run_name(world_size: int) -> str:
    """The default name of a run recorded from Python: the program's name and
    start time, or for ranks of one launch the name they all derive."""
    stem = Path(sys.argv[0] or "python").stem or "python"
    if world_size > 1:
        shared = shared_run_name(stem, os.environ, os.getppid())
        if shared is not None:
            return shared
    return default_run_name(stem, datetime.now())


class Recorder:
    """Record every ``nn.Module`` call inside a ``with`` block into a database.

    >>> with modtrace.Recorder(db="trace.db", run="baseline") as rec:
    ...     for batch in data:
    ...         loss = model(batch).sum(); loss.backward(); opt.step()

    Steps advance after every optimizer step and on ``rec.step()``;
    ``step_on`` chooses: ``"auto"`` (optimizer steps when the run makes any,
    else every root call: each outermost module call on the main thread, as
    ``generate()`` makes one per token), ``"optimizer"``, ``"root"`` or
    ``"manual"`` (``rec.step()`` only).  Root calls are always recorded, so
    ``modtrace tree``, ``diff`` and ``report`` can choose again later.

    A write failing on a transient database fault is retried on a new
    connection for up to ``retry_s`` seconds (default ``MODTRACE_RETRY_S`` or
    120) while the program goes on; past ``max_buffered`` waiting events,
    whole steps are dropped and the run records which (``store.retry``).
    """

    def __init__(
        self,
        db: str | None = None,
        run: str | None = None,
        tags: Mapping[str, str] | None = None,
        *,
        command: str | None = None,
        join: bool | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        clock: Callable[[], int] | None = None,
        flush_every: int = DEFAULT_FLUSH_EVERY,
        analyze: bool = True,
        meta: Mapping[str, Any] | None = None,
        handle_sigterm: bool = True,
        writer: str | None = None,
        step_on: str = "auto",
        retry_s: float | None = None,
        max_buffered: int = MAX_BUFFERED_EVENTS,
        device_time: bool | None = None,
        device_clock: DeviceClock | None = None,
    ) -> None:
        if step_on not in STEP_RULES:
            raise ValueError(f"step_on must be one of {', '.join(STEP_RULES)}, not {step_on!r}")
        if writer is None:
            writer = os.environ.get("MODTRACE_WRITER") or "auto"
            if writer not in WRITERS:
                raise UsageError(f"MODTRACE_WRITER must be one of {', '.join(WRITERS)}, not {writer!r}")
        if writer not in WRITERS:
            raise ValueError(f"writer must be one of {', '.join(WRITERS)}, not {writer!r}")
        if writer == "auto" and _usable_cpus() < 2:
            writer = "inline"  # a writer process could only take turns with the program
        env_rank, env_world = _dist_rank_world()
        self.rank = env_rank if rank is None else rank
        self.world_size = env_world if world_size is None else world_size
        self.db = db
        self.run_name = run or recorder_run_name(self.world_size)
        self.tags = dict(tags or {})
        self.command = mask(command if command is not None else shlex.join([sys.executable, *sys.argv]))
        self.join = (self.world_size > 1) if join is None else join
        self.flush_every = flush_every
        self.analyze = analyze
        self.meta = dict(meta or {})
        self.handle_sigterm = handle_sigterm
        self.writer_mode = writer
        self.step_on = step_on
        self.retry_s = retry_seconds(retry_s)
        self.max_buffered = max_buffered
        # Device time (modtrace.device_clock): None or True = on once a CUDA
        # device is seen, False = off; ``device_clock`` replaces CUDA (tests).
        self.device_time = device_time
        self._device_clock = device_clock
        self._device_rows: list[tuple[Any, ...]] = []  # drained at the end, for the last batch
        self.run_id: int = 0
        self.status: str | None = None
        self._clock = clock
        self._buf: list[tuple[Any, ...]] = []
        self._taken = 0  # events moved from _buf into batches
        self._pending: deque[_Batch] = deque()  # taken, not yet handed over, oldest first
        self._in_flight: deque[_Batch] = deque()  # handed to the writer process, not yet answered
        self._last_handoff = 0.0
        self._written = 0
        self._store: Store | None = None
        self._writer: ResumingWriter | None = None
        self._proc: WriterProcess | None = None
        self._tracker: Tracker | None = None
        self._take_lock = threading.Lock()  # taking from the buffers (short)
        self._flush_lock = threading.Lock()  # writing batches, in order
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._flusher: threading.Thread | None = None
        self._flush_error: StoreError | None = None
        self._dropped = 0  # events after recording stopped
        self._shed = 0  # events dropped over the memory bound while writes wait
        self._shed_steps: set[int] = set()
        self._last_taken_step: int | None = None
        self._forks: forking.ForkCounter | None = None
        self._forked_child = False  # this is a child forked while recording (see modtrace.forking)
        self._started = 0.0
        self._prev_sigterm: Any = None
        self._atexit_registered = False

    # -- public ------------------------------------------------------------------

    @property
    def events_recorded(self) -> int:
        return self._taken + len(self._buf)

    @property
    def step_count(self) -> int:
        """Steps so far under ``step_on`` (root calls under ``auto`` until an optimizer step)."""
        tracker = self._tracker
        if tracker is None:
            return 0
        roots = self.step_on == "root" or (self.step_on == "auto" and tracker.step == 0)
        return tracker.roots if roots else tracker.step

    @property
    def writer_pid(self) -> int | None:
        """The pid of the writer process while batches go through one, else None
        (they are written by a thread of this process)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.alive and proc.ready() else None

    @property
    def active(self) -> bool:
        return self._tracker is not None and self._tracker.active

    def step(self) -> None:
        """Mark a step boundary: later events carry the next step number."""
        tracker = self._tracker
        if tracker is None or self._forked_child:
            return
        tracker.step += 1
        if self._taken - self._written + len(self._buf) > self.max_buffered:
            self._shed_step()
        if self.writer_mode == "inline" and self._flush_error is None and self._writer is not None:
            try:
                # One try, never waiting: while the flusher thread retries a
                # fault, the events wait in the buffer.
                self._flush(take=True, retry=False, wait=False)
            except StoreError as exc:
                self._write_failed(exc)
            return
        proc = self._proc
        if proc is not None and proc.is_ready and self._flush_error is None and self._flush_lock.acquire(blocking=False):
            # Hand the step's events to the writer process here, between
            # steps, where the time is no module's: pack them, write them to
            # its pipe if it has room, note the answers that came.  Nothing
            # here waits; the flusher thread stays asleep.
            try:
                with self._take_lock:
                    self._take(pack=proc)
                self._handoff(proc)
            except StoreError as exc:
                self._write_failed(exc)
            finally:
                self._flush_lock.release()
            if not self._pending:
                self._last_handoff = time.monotonic()
                return
        self._wake.set()

    def start(self) -> Recorder:
        store = open_store(self.db, create=True)
        try:
            meta = {
                "command": self.command,
                "cwd": os.getcwd(),
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "world_size": self.world_size,
                "python_version": platform.python_version(),
                "torch_version": _torch_version(),
                "modtrace_version": __version__,
                "tags": self.tags,
                "step_on": self.step_on,
            }
            meta.update(self.meta)
            self.run_id, _created = create_run(store, self.run_name, meta, join=self.join)
            tracker = Tracker(self._buf.append, clock=self._clock,
                              on_optimizer_step=None if self.step_on == "manual" else self.step,
                              device_time=self.device_time is not False, device_clock=self._device_clock)
            wall = time.time_ns()
            tracker.start()
            try:
                add_rank(store, self.run_id, self.rank, wall)
            except BaseException:
                tracker.stop()
                raise
        except BaseException:
            store.dispose()
            raise
        self._store = store
        try:
            self._take_reserve()
            self._writer = ResumingWriter(store, self.run_id, self.rank, self.retry_s)
            if self.writer_mode in ("auto", "process"):
                try:
                    self._proc = WriterProcess(store, self.run_id, self.rank, self.retry_s)
                except Exception:  # no usable interpreter to start: write from this process
                    self._proc = None
            self._tracker = tracker
            self._forks = forking.ForkCounter()
            forking.watch(self, self._in_forked_child)
            self._started = time.monotonic()
            self._flusher = threading.Thread(target=self._flush_loop, name="modtrace-flush", daemon=True)
            self._flusher.start()
            self._install_signal_handlers()
        except BaseException as exc:
            self._abort_start(tracker, exc)
            raise
        return self

    def _abort_start(self, tracker: Tracker, exc: BaseException) -> None:
        """Undo a start that failed once the hooks were in: none is left, the rank is marked failed."""
        tracker.stop()
        self._tracker = None
        self._stopping.set()
        self._wake.set()
        if self._flusher is not None and self._flusher.is_alive():
            self._flusher.join()
        self._restore_signal_handlers()
        self._close_writers()
        self.status = "failed"
        assert self._store is not None
        try:
            finish_rank(self._store, self.run_id, self.rank, "failed", f"the recorder failed to start: {_summary(exc)}")
        except Exception:  # the original error is the one to report
            pass
        finally:
            self._store.dispose()
            self._release_reserve()

    def finish(self, status: str = "completed", error: str | None = None) -> None:
        """Stop recording, write what is buffered and mark the run ``status``."""
        tracker = self._tracker
        if tracker is None or self.status is not None or self._forked_child:
            return
        forking.unwatch(self)
        tracker.stop()
        if status != "completed":
            tracker.close_open_forward(int(Status.ERROR))
        if tracker.device_timer is not None:  # the one wait for the device, after the last mark
            with self._take_lock:
                self._device_rows += drain_rows(tracker.device_timer)
        self._stopping.set()
        self._wake.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join()
        self._restore_signal_handlers()
        if self._flush_error is None:
            try:
                self.flush()
            except StoreError as exc:
                self._write_failed(exc)
        self._close_writers()
        if self._flush_error is not None:
            lost = self._dropped + len(self._buf) + sum(len(b.events) for b in (*self._in_flight, *self._pending))
            status = "failed"
            error = f"{self._flush_error}; {lost} event(s) not written" + (f" (the program: {error})" if error else "")
        assert self._store is not None
        self.status = status
        if self._flush_error is not None:
            self._release_reserve()  # room for the status update on a full disk
            _checkpoint(self._store)
        store = self._store
        faults = {"dropped_events": self._shed, "dropped_steps": _ranges(self._shed_steps),
                  "fork_calls": self._forks.total() if self._forks is not None else 0}
        try:
            call_retrying(lambda: finish_rank(store, self.run_id, self.rank, status, error, faults),
                          0.0 if self._flush_error is not None else self.retry_s)
            self._report_faults()
            if self.analyze and self._flush_error is None:
                self._materialize()
        except Exception as exc:  # e.g. the disk is still full: what was written stays readable
            print(f"modtrace: error: could not mark run {self.run_name!r} {status}: {one_line(exc)}", file=sys.stderr)
        finally:
            self._store.dispose()
            self._release_reserve()

    # A SQLite database on a full disk cannot even record that it is full: the
    # recorder keeps a small reserve file beside it and gives the space back
    # when a write fails, so the run can still be marked failed.
    _RESERVE_BYTES = 512 * 1024

    def _reserve_path(self) -> Path | None:
        if self._store is None or self._store.path is None:
            return None
        return self._store.path.with_name(f"{self._store.path.name}-reserve-{os.getpid()}")

    def _take_reserve(self) -> None:
        path = self._reserve_path()
        if path is None:
            return
        for stale in path.parent.glob(f"{self._store.path.name}-reserve-*"):  # type: ignore[union-attr]
            pid = stale.name.rsplit("-", 1)[-1]
            if pid.isdigit() and int(pid) != os.getpid() and not _pid_alive(int(pid)):
                stale.unlink(missing_ok=True)
        fallocate = getattr(os, "posix_fallocate", None)  # not on macOS or Windows
        try:
            with open(path, "wb") as fh:
                if fallocate is not None:
                    fallocate(fh.fileno(), 0, self._RESERVE_BYTES)
                else:
                    fh.write(bytes(self._RESERVE_BYTES))
        except OSError:
            path.unlink(missing_ok=True)

    def _release_reserve(self) -> None:
        path = self._reserve_path()
        if path is not None:
            path.unlink(missing_ok=True)

    def _write_failed(self, exc: StoreError) -> None:
        """Stop recording after a failed write; the program itself goes on."""
        if self._flush_error is not None:
            return
        self._flush_error = exc
        if self._tracker is not None:
            self._tracker._append = self._drop  # later events are counted, not kept
            self._tracker.device_timer = None
        print(mask(f"modtrace: error: {exc}; recording stopped (run {self.run_name!r} will be marked failed)"), file=sys.stderr)

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
            parts.append(f"{self._shed:,} event(s) of step(s) {_ranges(self._shed_steps)} dropped while the database "
                         f"was unreachable (more than {self.max_buffered:,} waited)")
        if parts:
            print(mask(f"modtrace: warning: run {self.run_name!r}: " + "; ".join(parts)), file=sys.stderr)
        forked = self._forks.total() if self._forks is not None else 0
        if forked:
            print(mask(f"modtrace: note: run {self.run_name!r}: {forked:,} module call(s) ran in forked child "
                       "processes (e.g. DataLoader workers) and were not recorded"), file=sys.stderr)

    def _in_forked_child(self) -> None:
        """In a child forked while recording, right after the fork: let go of
        the parent's hooks, pipes and connection without a word to them;
        count the child's module calls instead (see modtrace.forking)."""
        self._forked_child = True
        if self._tracker is not None:
            self._tracker.stop()
        if self._forks is not None:
            self._forks.count_calls_here()
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.forget()
        if self._writer is not None:
            self._writer.forget()
        if self._store is not None:
            self._store.engine.dispose(close=False)
        if self._atexit_registered:
            atexit.unregister(self._atexit)
            self._atexit_registered = False
        if self._prev_sigterm is not None:
            try:
                signal.signal(signal.SIGTERM, self._prev_sigterm)
            except ValueError:  # forked from a thread other than the main one
                pass

    def __enter__(self) -> Recorder:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if exc_type is None:
            self.finish("completed")
        elif issubclass(exc_type, (KeyboardInterrupt, Terminated)):
            self.finish("interrupted", "KeyboardInterrupt" if issubclass(exc_type, KeyboardInterrupt) else "SIGTERM")
        elif issubclass(exc_type, SystemExit):
            code = exc.code if isinstance(exc, SystemExit) else None
            ok = code in (None, 0)
            self.finish("completed" if ok else "failed", None if ok else f"SystemExit: {code}")
        else:
            self.finish("failed", _summary(exc))

    # -- writing -----------------------------------------------------------------

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
                    writer.write(batch.events, batch.modules, batch.threads, batch.devices, batch.progress,
                                 roots=batch.roots, retry=retry, device_rows=batch.device_rows)
                except Exception as exc:  # the batch stays pending for another try
                    if not retry and is_transient(exc) and not writer.expired:
                        self._wake.set()  # the flusher thread resumes it
                        break
                    raise StoreError(f"writing events to {writer.store.label} failed: {one_line(exc)}") from exc
                self._pending.popleft()
                self._written += len(batch.events)
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
        batch = _Batch(events, _drain(tracker.new_modules), _drain(tracker.new_threads), _drain(tracker.new_devices),
                       _drain(tracker.new_roots), (self._taken + n, tracker.step), device_rows=device_rows)
        if pack is not None:
            batch.frame = self._frame(pack, batch)
        self._taken += n
        if n:
            self._last_taken_step = events[-1][6]
        self._pending.append(batch)

    @staticmethod
    def _frame(proc: WriterProcess, batch: _Batch) -> bytes:
        """The batch packed for the writer process (packed once)."""
        if batch.frame is None:
            batch.frame = proc.pack(batch.events, batch.modules, batch.threads, batch.devices, batch.progress,
                                    roots=batch.roots, device_rows=batch.device_rows)
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
            self._written += len(batch.events)

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
            self._written += len(self._in_flight.popleft().events)
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
            woken = self._wake.wait(_POLL_S)
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

    def _materialize(self) -> None:
        try:
            from modtrace.materialize import materialize
        except ImportError:  # analysis layer not installed in this build
            return
        assert self._store is not None
        try:
            materialize(self._store, self.run_id, rank=self.rank, complete=self.status == "completed")
        except Exception as exc:  # the events are safe; analysis can be rerun with `modtrace analyze`
            print(f"modtrace: warning: analysing run {self.run_name!r} failed: {one_line(exc)}; "
                  f"rerun `modtrace analyze {self.run_name}`", file=sys.stderr)

    # -- process-level safety nets ----------------------------------------------

    def _install_signal_handlers(self) -> None:
        if not self._atexit_registered:
            atexit.register(self._atexit)
            self._atexit_registered = True
        if not self.handle_sigterm or threading.current_thread() is not threading.main_thread():
            return
        prev = signal.getsignal(signal.SIGTERM)
        if prev not in (signal.SIG_DFL, None):
            return  # the program handles SIGTERM itself; atexit still flushes

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            raise Terminated()

        self._prev_sigterm = prev
        signal.signal(signal.SIGTERM, on_sigterm)

    def _restore_signal_handlers(self) -> None:
        if self._prev_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._prev_sigterm)
            self._prev_sigterm = None
        if self._atexit_registered:
            atexit.unregister(self._atexit)
            self._atexit_registered = False

    def _atexit(self) -> None:
        if self.status is None and self._tracker is not None:
            self.finish("interrupted", "process exited inside the recording")


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _checkpoint(store: Store) -> None:
    if not store.is_sqlite:
        return
    try:
        with store.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(RESTART)")
    except Exception:
        pass


def _ranges(steps: set[int]) -> str | None:
    """Step numbers as ranges: {1, 2, 3, 7} -> '1-3,7'; None when empty."""
    out: list[str] = []
    for step in sorted(steps):
        if out and int(out[-1].rsplit("-", 1)[-1]) == step - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{step}"
        else:
            out.append(str(step))
    return ",".join(out) or None


def _drain(rows: list[Any]) -> list[Any]:
    n = len(rows)
    out = rows[:n]
    del rows[:n]
    return out


def _torch_version() -> str | None:
    torch = sys.modules.get("torch")
    return str(getattr(torch, "__version__", "")) or None



def _summary(exc: BaseException | None) -> str:
    if exc is None:
        return "unknown error"
    text = str(exc).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__
