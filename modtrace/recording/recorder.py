"""Recording session: a run in the database, a tracker, a buffer and a flusher.

``Recorder`` is a context manager; how its batches reach the store is
``modtrace.recording.flusher``'s part, its safety nets (SIGTERM, atexit,
fork) ``modtrace.recording.safety``'s.
"""

from __future__ import annotations

import os
import platform
import shlex
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

from modtrace._version import __version__
from modtrace.core.codes import Status
from modtrace.core.errors import StoreError, Terminated, UsageError, one_line
from modtrace.core.secrets import mask
from modtrace.core.step_rules import STEP_RULES
from modtrace.recording import forking
from modtrace.recording.analysing import Analysing
from modtrace.recording.config import (
    DEFAULT_FLUSH_EVERY,
    MAX_BUFFERED_EVENTS,
    WRITERS,
    PendingBatch,
    dist_rank_world,
    ranges,
    recorder_run_name,
    summary,
    torch_version,
    usable_cpus,
)
from modtrace.recording.flusher import Flushing
from modtrace.recording.reserve import DiskReserve
from modtrace.recording.safety import SafetyNets
from modtrace.recording.schedule import Schedule, StepAction, parse_schedule
from modtrace.recording.speed_probe import SpeedProbe
from modtrace.recording.step_boundary import Scheduling
from modtrace.recording.writer_process import WriterProcess
from modtrace.store.counters import write_counters
from modtrace.store.engine import Store, open_store
from modtrace.store.memory import write_memory
from modtrace.store.retry import ResumingWriter, call_retrying, retry_seconds
from modtrace.store.runs import add_rank, create_run, finish_rank
from modtrace.store.speeds import write_speeds
from modtrace.tracking.counters import COUNTER_POLICIES, Counting
from modtrace.tracking.device_timer import DeviceClock, drain_rows
from modtrace.tracking.tracker import Tracker

if TYPE_CHECKING:
    from sqlalchemy import Connection


class Recorder(Analysing, Flushing, Scheduling, SafetyNets):
    """Record every ``nn.Module`` call inside a ``with`` block into a database.

    >>> with modtrace.Recorder(db="trace.db", run="baseline") as rec:
    ...     for batch in data:
    ...         loss = model(batch).sum(); loss.backward(); opt.step()

    Steps advance after every optimizer step and on ``rec.step()``;
    ``step_on`` chooses: ``"auto"`` (optimizer steps when the run makes any,
    else every root call: each outermost module call of any thread, as
    ``generate()`` makes one per token), ``"optimizer"``, ``"root"`` or
    ``"manual"`` (``rec.step()`` only).  Root calls are always recorded, so
    ``modtrace tree``, ``diff`` and ``report`` can choose again later.

    A write failing on a transient database fault is retried on a new
    connection for up to ``retry_s`` seconds (default ``MODTRACE_RETRY_S`` or
    120) while the program goes on; past ``max_buffered`` waiting events,
    whole steps are dropped and the run records which (``store.retry``).

    ``schedule`` (``modtrace.schedule(...)`` or its ``--schedule`` text)
    records only some steps (``modtrace.recording.schedule``); the run stores
    which.  The end-of-recording analysis (``analyze``) is done by the writer
    process after the context exits when batches went through it:
    ``wait_analyzed()`` waits for it.

    ``counters`` chooses the steps whose work (FLOPs, bytes, ops) is counted
    (``modtrace.tracking.counters``).  ``compiled_detail`` (on by default)
    times the kernels of code compiled by ``torch.compile`` (inductor, CPU)
    and records the inner modules' calls from them, status ``attributed``
    (``modtrace.tracking.compiled``).  ``speed_probe`` times a fixed piece of
    CPU work before each recorded step, so that a history gate can tell a
    slower step from a slower machine (``modtrace.recording.speed_probe``; its
    cost: docs/performance.md, "Speed probe"); it needs step boundaries
    (optimizer steps or ``rec.step()``).
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
        schedule: Schedule | str | None = None,
        device_time: bool | None = None,
        device_clock: DeviceClock | None = None,
        counters: str = "first",
        compiled_detail: bool = True,
        speed_probe: bool = False,
    ) -> None:
        if counters not in COUNTER_POLICIES:
            raise ValueError(f"counters must be one of {', '.join(COUNTER_POLICIES)}, not {counters!r}")
        # Work counters (modtrace.tracking.counters): which steps count FLOPs, bytes and ops.
        self.counters = counters
        # Time per inner module of torch.compile'd code, attributed from its kernels (modtrace.tracking.compiled).
        self.compiled_detail = compiled_detail
        self._counting: Counting | None = None
        self.speed_probe = speed_probe
        self._probe: SpeedProbe | None = None
        if step_on not in STEP_RULES:
            raise ValueError(f"step_on must be one of {', '.join(STEP_RULES)}, not {step_on!r}")
        if writer is None:
            writer = os.environ.get("MODTRACE_WRITER") or "auto"
            if writer not in WRITERS:
                raise UsageError(f"MODTRACE_WRITER must be one of {', '.join(WRITERS)}, not {writer!r}")
        if writer not in WRITERS:
            raise ValueError(f"writer must be one of {', '.join(WRITERS)}, not {writer!r}")
        if writer == "auto" and usable_cpus() < 2:
            writer = "inline"  # a writer process could only take turns with the program
        env_rank, env_world = dist_rank_world()
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
        # Device time (modtrace.tracking.device_timer): None or True = on once a CUDA
        # device is seen, False = off; ``device_clock`` replaces CUDA (tests).
        self.device_time = device_time
        self._device_clock = device_clock
        self._device_rows: list[tuple[Any, ...]] = []  # drained at the end, for the last batch
        self.schedule = parse_schedule(schedule) if isinstance(schedule, str) else schedule
        if self.schedule is not None and step_on == "root":
            raise UsageError("a schedule counts optimizer steps and rec.step() calls: use it with step_on "
                             "auto, optimizer or manual, not root")
        self._action = StepAction.RECORD
        self._warm: list[tuple[Any, ...]] = []
        self._warm_seq = 0
        self._recorded_steps: list[int] = []
        self.run_id: int = 0
        self.status: str | None = None
        self._clock = clock
        self._buf: list[tuple[Any, ...]] = []
        self._taken = 0  # events moved from _buf into batches
        self._pending: deque[PendingBatch] = deque()  # taken, not yet handed over, oldest first
        self._in_flight: deque[PendingBatch] = deque()  # handed to the writer process, not yet answered
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
        self._forked_child = False  # this is a child forked while recording (see modtrace.recording.forking)
        self._started = 0.0
        self._reserve = DiskReserve(None)
        self._keeper: Connection | None = None
        self._analyst: WriterProcess | None = None  # analysing the rank after the recording ended
        # Whether the end-of-recording analysis is stored: None while the writer process
        # is at it (``wait_analyzed``) or when none was asked for.
        self.analysis_stored: bool | None = None
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
        if self._counting is not None:
            self._counting.end_step()
        tracker.step += 1
        self._begin_step(tracker, tracker.step)
        self._hand_step_over(tracker)
        if self._probe is not None and self._action is StepAction.RECORD:
            # last, just before the next step starts: the speed it will run at
            self._probe.take(tracker.step, tracker.next_seq)

    def _hand_step_over(self, tracker: Tracker) -> None:
        """The step's events towards the store, between steps (``step``)."""
        if self._taken - self._written + len(self._buf) > self.max_buffered:
            self._shed_step()
        if self.writer_mode == "inline" and self._flush_error is None and self._writer is not None:
            try:
                # One try, never waiting: while the flusher thread retries a
                # fault, the events wait in the buffer.
                self._flush(take=True, retry=False, wait=False)
            except StoreError as exc:
                self._write_failed(exc)
            else:
                # the step wrote its events: the flusher thread's timer starts again, so that it
                # does not write in the middle of the next step (a stall of a few milliseconds
                # charged to whichever module then runs)
                self._last_handoff = time.monotonic()
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
        # One connection held open while recording: on SQLite the last
        # connection to close checkpoints the write-ahead log (an fsync), and
        # each step below opens and closes its own.
        self._keeper = store.engine.connect() if store.is_sqlite else None
        try:
            meta = {
                "command": self.command,
                "cwd": os.getcwd(),
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "world_size": self.world_size,
                "python_version": platform.python_version(),
                "torch_version": torch_version(),
                "modtrace_version": __version__,
                "tags": self.tags,
                "step_on": self.step_on,
                "schedule": self.schedule.text() if self.schedule is not None else None,
                "counters": self.counters,
            }
            meta.update(self.meta)
            self.run_id, _created = create_run(store, self.run_name, meta, join=self.join)
            tracker = Tracker(self._buf.append, clock=self._clock,
                              on_optimizer_step=None if self.step_on == "manual" else self.step,
                              device_time=self.device_time is not False, device_clock=self._device_clock,
                              compiled_detail=self.compiled_detail)
            if self.counters != "off":
                self._counting = Counting(
                    tracker, self.counters,
                    root_steps=lambda: self.step_on == "root" or (self.step_on == "auto" and tracker.step == 0),
                    may_count=lambda: self._action is StepAction.RECORD)
                tracker.on_root = self._counting.on_root
            wall = time.time_ns()
            tracker.start()
            self._begin_step(tracker, 0)
            if self.speed_probe:
                self._probe = SpeedProbe(tracker.now, cpu=self._clock is None)
                if self._action is StepAction.RECORD:
                    self._probe.take(0, tracker.next_seq)
            try:
                add_rank(store, self.run_id, self.rank, wall)
            except BaseException:
                tracker.stop()
                raise
        except BaseException:
            self._dispose(store)
            raise
        self._store = store
        self._reserve = DiskReserve(store.path)
        try:
            self._reserve.take()
            self._writer = ResumingWriter(store, self.run_id, self.rank, self.retry_s)
            if self.writer_mode in ("auto", "process"):
                try:
                    # MODTRACE_FOLLOW=0: the rank is analysed at the end only (benchmarks/bench_record_return.py)
                    follow = self.analyze and os.environ.get("MODTRACE_FOLLOW", "1") != "0"
                    self._proc = WriterProcess(store, self.run_id, self.rank, self.retry_s, follow=follow)
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
            finish_rank(self._store, self.run_id, self.rank, "failed", f"the recorder failed to start: {summary(exc)}")
        except Exception:  # the original error is the one to report
            pass
        finally:
            self._dispose(self._store)
            self._reserve.release()

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
        if self._flush_error is not None:
            self._close_writers()
            lost = self._dropped + len(self._buf) + sum(b.count for b in (*self._in_flight, *self._pending))
            status = "failed"
            error = f"{self._flush_error}; {lost} event(s) not written" + (f" (the program: {error})" if error else "")
        assert self._store is not None
        self.status = status
        if self._flush_error is not None:
            self._reserve.release()  # room for the status update on a full disk
            _checkpoint(self._store)
        store = self._store
        faults = {"dropped_events": self._shed, "dropped_steps": ranges(self._shed_steps),
                  "recorded_steps": self._recorded_steps_text(),
                  "fork_calls": self._forks.total() if self._forks is not None else 0}
        if self._flush_error is None:
            # Every event is written: every step counts, also those after the last batch (a
            # schedule's off steps, or a step whose events a timed flush took before it ended).
            faults["step_count"] = tracker.step
        try:
            if self._counting is not None and self._flush_error is None:
                self._write_counters(store)
            # the last probe (after the last step boundary) precedes no step; it closes the last
            # step's window of CPU time
            probes = [] if self._probe is None else self._probe.rows
            if probes and self._flush_error is None:
                call_retrying(lambda: write_speeds(store, self.run_id, self.rank, probes), self.retry_s)
            call_retrying(lambda: finish_rank(store, self.run_id, self.rank, status, error, faults),
                          0.0 if self._flush_error is not None else self.retry_s)
            analyze = self.analyze and self._flush_error is None
            if analyze:
                self._hand_analysis_over(status == "completed")
            self._close_writers()  # with the analysis handed over, the writer process does it from here
            self._report_faults()
            if analyze and self._analyst is None:
                self.analysis_stored = self._materialize()
        except Exception as exc:  # e.g. the disk is still full: what was written stays readable
            print(f"modtrace: error: could not mark run {self.run_name!r} {status}: {one_line(exc)}", file=sys.stderr)
        finally:
            self._close_writers()
            self._dispose(self._store)
            self._reserve.release()

    def _write_counters(self, store: Store) -> None:
        """The counted steps' counters (modtrace.tracking.counters), written once the events are."""
        assert self._counting is not None
        self._counting.end_step()
        calls, counted = self._counting.rows(self.run_id, self.rank)
        if counted:
            call_retrying(lambda: write_counters(store, self.run_id, self.rank, calls, counted), self.retry_s)
            storages, returns = self._counting.memory_rows(self.run_id, self.rank)
            if storages:
                call_retrying(lambda: write_memory(store, self.run_id, self.rank, storages, returns), self.retry_s)

    def _dispose(self, store: Store) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.close()
        store.dispose()

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
            self.finish("failed", summary(exc))

    # -- writing -----------------------------------------------------------------

def _checkpoint(store: Store) -> None:
    if not store.is_sqlite:
        return
    try:
        with store.engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA wal_checkpoint(RESTART)")
    except Exception:
        pass
