"""Device time of module calls: timing events on device streams, resolved late.

Host timestamps in module hooks say when Python *launched* work; on CUDA the
kernels run later.  So each enter and exit on a CUDA device also records a
timing event on the device's current stream (``DeviceTimer.mark``, on the
hot path: take an event from a pool, record it, remember ``(seq, event)``)
and reads the device's allocated-memory counter (host side, no sync).

Nothing waits for the device while the program runs.  ``DeviceTimer.poll``
(at step boundaries and from the flusher) asks each stream which of its
pending events completed -- a stream runs its work in order, so they are
the oldest ones, found by bisection -- turns each completed one into
nanoseconds and gives the event back to its pool.  ``DeviceTimer.drain``, at
the end of the recording, waits once per stream for its last pending event
and resolves everything.  Calls made while a CUDA graph is being captured
get no event (it would break the capture; their kernels run at replay).

Times are on the rank's host clock: a *reference* event is recorded on a
device the first time it is seen, with the host time of that moment
(nanoseconds since the rank started recording), and an event's device time
is that plus the device's elapsed time since the reference (measured from
the newest event already resolved, see ``_Anchor``).  When the
device is idle as the reference is recorded (as at the start of a
recording) it runs at once, so ``device_ts_ns - ts_ns`` of an event is how
far the device lagged behind the launch; otherwise every time on that device
is early by the same constant, and durations are unaffected.

``DeviceClock`` is the one boundary with the hardware: ``CudaClock`` is a few
lines over ``torch.cuda.Event``; tests use a clock whose events complete late
and out of order (``tests/helpers/device_clock.py``).  torch is imported only by
``CudaClock``.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol


class DeviceClock(Protocol):
    """Timing events on the streams of accelerator devices.

    ``stream`` is the clock's stream object (``torch.cuda.Stream`` for CUDA);
    an event, once recorded on a device, is recorded on that device only.
    ``device_type`` is the torch device type whose module calls it times
    (``"cuda"``; the test clock stands in for ``"cpu"``).
    """

    device_type: str

    def current_stream(self, device: int) -> tuple[Any, int]:
        """The current stream of device ``device`` (its index) and its handle
        (``events.stream``): the stream work launched now goes to."""

    def new_event(self) -> Any:
        """A new timing event (called only when a device's pool is empty)."""

    def record(self, event: Any, stream: Any) -> bool:
        """Enqueue ``event`` on ``stream``: it completes when the stream reaches
        it.  False (nothing enqueued) when the stream cannot take a timing
        event now: it is being captured into a CUDA graph."""

    def query(self, event: Any) -> bool:
        """Whether the stream has reached ``event``; never waits."""

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Device milliseconds from ``start`` to ``end``, both completed, same device."""

    def wait(self, event: Any) -> None:
        """Block the calling host thread until ``event`` completes (only at the end)."""

    def memory_allocated(self, device: int) -> int:
        """Bytes allocated by tensors on ``device`` now: a host-side counter, no sync."""


class CudaClock:
    """``DeviceClock`` over ``torch.cuda.Event(enable_timing=True)``."""

    device_type = "cuda"

    def __init__(self) -> None:
        import torch

        self._current_stream: Callable[[int], Any] = torch.cuda.current_stream
        self._event: Callable[..., Any] = torch.cuda.Event
        self._capturing: Callable[[], bool] = torch.cuda.is_current_stream_capturing
        # torch.cuda.memory_allocated builds and flattens the whole stats dict
        # on every call; the nested dict from the C call holds the same counter.
        self._stats: Callable[[int], Any] = getattr(torch._C, "_cuda_memoryStats", None) or (
            torch.cuda.memory.memory_stats_as_nested_dict
        )

    def current_stream(self, device: int) -> tuple[Any, int]:
        stream = self._current_stream(device)
        return stream, int(stream.cuda_stream)

    def new_event(self) -> Any:
        return self._event(enable_timing=True)

    def record(self, event: Any, stream: Any) -> bool:
        # A timing event recorded into a capture would invalidate the
        # program's CUDA graph; the kernels run at replay, untimed by us.
        if self._capturing():
            return False
        event.record(stream)
        return True

    def query(self, event: Any) -> bool:
        return bool(event.query())

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end))

    def wait(self, event: Any) -> None:
        event.synchronize()

    def memory_allocated(self, device: int) -> int:
        return int(self._stats(device)["allocated_bytes"]["all"]["current"])


# What one enter or exit event gets once its device event resolved:
# (seq, device_ts_ns, mem_bytes); device_ts_ns is None when the device could
# not time it, mem_bytes when memory is not read.
DeviceRow = tuple[int, int | None, int | None]


class _Anchor:
    """A completed event of a device and its time on the rank's clock: first
    the reference, then the newest event resolved.  CUDA reports elapsed
    time as a float32 of milliseconds, finer than a microsecond only below
    about 8 s; measuring each event from a recent anchor, not from the start,
    keeps that precision for a run of any length."""

    __slots__ = ("event", "ns", "done")

    def __init__(self, event: Any, ns: int) -> None:
        self.event = event
        self.ns = ns
        self.done = False  # known to have completed


class DeviceTimer:
    """Pending device events of one rank's recording, and their resolution.

    ``mark`` may be called from any thread (the program's, autograd's device
    threads); ``poll`` and ``drain`` from one thread at a time (a lock makes
    sure).  ``host_clock`` returns the rank's host nanoseconds (the
    tracker's ``now``), read only when a device is first seen.
    """

    def __init__(self, clock: DeviceClock, host_clock: Callable[[], int], *, memory: bool = True) -> None:
        self.clock = clock
        self._host_clock = host_clock
        self.memory = memory
        self._record = clock.record  # bound once: mark is on the hot path
        self._memory = clock.memory_allocated if memory else None
        self._pools: dict[int, list[Any]] = {}  # device -> free events
        self._anchors: dict[int, _Anchor] = {}  # device -> its anchor
        # (device, stream handle) -> deque of (seq, event, mem), oldest first
        self._queues: dict[tuple[int, int], deque[tuple[Any, Any, int | None]]] = {}
        self._queue_list: list[tuple[int, deque[tuple[Any, Any, int | None]]]] = []  # (device, queue)
        self._lock = threading.Lock()  # new devices and streams (rare)
        self._resolve_lock = threading.Lock()
        self.events_allocated = 0

    # -- hot path ----------------------------------------------------------------

    def mark(self, seq: int, device: int, stream: Any, handle: int) -> None:
        """Record event ``seq``'s device event on ``stream`` (``handle``, the
        tracker's stream column) of ``device`` (the CUDA device index, not
        the run's device id), and read that device's allocated memory."""
        try:
            q = self._queues[(device, handle)]
            ev = self._pools[device].pop()
        except (KeyError, IndexError):
            got = self._slow_mark(device, stream, handle)
            if got is None:
                return  # the device's reference cannot be recorded now
            q, ev = got
        if self._record(ev, stream):
            memory = self._memory
            q.append((seq, ev, None if memory is None else memory(device)))
        else:
            self._pools[device].append(ev)

    def take(self, device: int, stream: Any, handle: int) -> Any | None:
        """An event recorded on ``stream`` now, not yet queued: its rows are
        known later (``queue_recorded``).  For the kernels of compiled code, whose
        module rows are written after the graph call returns.  None when the
        stream cannot take a timing event now."""
        try:
            self._queues[(device, handle)]
            ev = self._pools[device].pop()
        except (KeyError, IndexError):
            got = self._slow_mark(device, stream, handle)
            if got is None:
                return None
            ev = got[1]
        if self._record(ev, stream):
            return ev
        self._pools[device].append(ev)
        return None

    def queue_recorded(self, device: int, handle: int, entries: list[tuple[tuple[int, ...], Any]]) -> None:
        """Queue events from ``take`` with the seqs of the rows they time (none,
        one or several), in the order they were recorded.  No ``mark`` on that
        stream may fall between their recording and this call: a stream's queue
        is in the stream's order (true of one compiled graph call: no module hook
        runs inside it)."""
        self._queues[(device, handle)].extend((seqs, ev, None) for seqs, ev in entries)

    def _slow_mark(self, device: int, stream: Any, handle: int) -> tuple[deque[tuple[Any, Any, int | None]], Any] | None:
        """A new stream or device, or an empty pool; None when the device is
        new and its stream cannot take the reference now."""
        with self._lock:
            if device not in self._anchors:
                self._pools.setdefault(device, [])
                pool = self._pools[device]
                ref = pool.pop() if pool else self._new_event()
                # Recorded on the same stream just before the first event, so
                # that event is never earlier than the reference.
                host_ns = self._host_clock()
                if not self.clock.record(ref, stream):
                    pool.append(ref)
                    return None
                self._anchors[device] = _Anchor(ref, host_ns)
            q = self._queues.get((device, handle))
            if q is None:
                q = self._queues[(device, handle)] = deque()
                self._queue_list = [*self._queue_list, (device, q)]
        try:
            ev = self._pools[device].pop()
        except IndexError:
            ev = self._new_event()
        return q, ev

    def _new_event(self) -> Any:
        self.events_allocated += 1
        return self.clock.new_event()

    # -- resolution --------------------------------------------------------------

    @property
    def pending(self) -> int:
        return sum(len(q) for _, q in self._queue_list)

    def poll(self) -> list[DeviceRow]:
        """The events that completed, oldest first per stream; never waits."""
        with self._resolve_lock:
            return self._resolve(wait=False)

    def drain(self) -> list[DeviceRow]:
        """Everything still pending, waiting once per stream for its last event.
        The tracker stops before this: a later mark would stay pending."""
        with self._resolve_lock:
            return self._resolve(wait=True)

    def _resolve(self, wait: bool) -> list[DeviceRow]:
        clock = self.clock
        query, elapsed = clock.query, clock.elapsed_ms
        rows: list[DeviceRow] = []
        for device, q in self._queue_list:
            n = len(q)  # marks appended meanwhile wait for the next poll
            if not n:
                continue
            ref = self._anchors[device]
            if wait:
                clock.wait(q[n - 1][1])
                if not ref.done and not query(ref.event):
                    clock.wait(ref.event)  # recorded on another stream of the device
                ref.done = True
            else:
                if not ref.done:
                    if not query(ref.event):
                        continue  # nothing on this device can be timed yet
                    ref.done = True
                n = _completed(q, n, query)
            if not n:
                continue
            pool, anchor, anchor_ns = self._pools[device], ref.event, ref.ns
            for i in range(n):
                seq, ev, mem = q.popleft()
                try:
                    ts = anchor_ns + round(elapsed(anchor, ev) * 1e6)
                except RuntimeError:  # the device could not time it
                    ts = None
                if type(seq) is tuple:  # an event of compiled code: the rows it times (queue_recorded)
                    rows.extend((s, ts, mem) for s in seq)
                else:
                    rows.append((seq, ts, mem))
                if ts is None:
                    pool.append(ev)
                    continue
                if i == n - 1:  # the newest resolved event becomes the anchor
                    pool.append(ref.event)
                    ref.event, ref.ns = ev, ts
                else:
                    pool.append(ev)
        return rows


def _completed(q: deque[tuple[Any, Any, int | None]], n: int, query: Callable[[Any], bool]) -> int:
    """How many of the first ``n`` events of a stream's queue completed.  A
    stream reaches its events in order, so completion is a prefix: found by
    bisection, about log2(n) queries."""
    if query(q[n - 1][1]):
        return n
    lo, hi = 0, n - 1  # q[hi] has not completed; q[:lo] have
    while lo < hi:
        mid = (lo + hi) // 2
        if query(q[mid][1]):
            lo = mid + 1
        else:
            hi = mid
    return lo


def drain_rows(timer: DeviceTimer) -> list[DeviceRow]:
    """``timer.drain()`` at the end of a recording; a device that fails to
    answer (a CUDA error surfacing at the wait) is a warning, and the events
    still pending keep NULL device times (their host rows are written)."""
    try:
        return timer.drain()
    except RuntimeError as exc:
        import warnings

        warnings.warn(f"modtrace: device times of {timer.pending} event(s) lost: {exc}", RuntimeWarning, stacklevel=2)
        return []
