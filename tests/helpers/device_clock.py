"""A device clock standing in for CUDA events (the one boundary faked).

It models what matters about a GPU for device timing: each stream runs the
work launched on it in order, later than the host launched it, and streams
run independently, so events complete late and out of order across streams.

* ``launch(stream, ns)`` enqueues ``ns`` of work on ``stream``;
* ``record(event, stream)`` enqueues the event behind that work: its device
  time is when the stream gets to it;
* ``advance(ns)`` moves device time on; an event completes when the device
  time reaches it;
* ``wait(event)`` is the host blocking until then (counted: the code under
  test may wait only at the end);
* ``current[device]`` is the device's current stream (``current_stream``),
  ``DEFAULT_STREAM`` of the device until a test sets another.

It times module calls on ``device_type`` devices: "cpu", so a real model on
the CPU goes through the tracker's CUDA path with this clock injected.

Like CUDA, an event recorded on one device cannot be recorded on another,
``elapsed_ms`` of an event not yet completed raises, and elapsed times are
float32 milliseconds (finer than a microsecond only below about 8 s).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field


@dataclass(frozen=True)
class FakeStream:
    device: int
    handle: int


@dataclass(eq=False)
class FakeEvent:
    number: int
    device: int | None = None
    ts_ns: int | None = None  # device time the stream reaches it
    records: int = 0


DEFAULT_STREAM = 0x7000  # handle of a device's default stream: DEFAULT_STREAM + device index


@dataclass
class FakeDeviceClock:
    device_type: str = "cpu"
    now_ns: int = 0
    current: dict[int, FakeStream] = field(default_factory=dict)  # device -> its current stream
    memory: dict[int, int] = field(default_factory=dict)  # device -> bytes allocated
    broken: set[int] = field(default_factory=set)  # event numbers whose timing fails
    capturing: bool = False  # the current stream is being captured into a CUDA graph
    busy_until: dict[FakeStream, int] = field(default_factory=dict)
    events: list[FakeEvent] = field(default_factory=list)
    queries: int = 0
    waits: int = 0
    memory_reads: int = 0

    # -- the test's controls -----------------------------------------------------

    def launch(self, stream: FakeStream, ns: int) -> None:
        self.busy_until[stream] = self._tail(stream) + ns

    def advance(self, ns: int) -> None:
        self.now_ns += ns

    def _tail(self, stream: FakeStream) -> int:
        return max(self.busy_until.get(stream, self.now_ns), self.now_ns)

    def stream(self, device: int = 0) -> FakeStream:
        """The device's current stream."""
        return self.current.get(device) or FakeStream(device, DEFAULT_STREAM + device)

    # -- DeviceClock -------------------------------------------------------------

    def current_stream(self, device: int) -> tuple[FakeStream, int]:
        stream = self.stream(device)
        return stream, stream.handle

    def new_event(self) -> FakeEvent:
        ev = FakeEvent(len(self.events))
        self.events.append(ev)
        return ev

    def record(self, event: FakeEvent, stream: FakeStream) -> bool:
        if self.capturing:
            return False
        if event.device is not None and event.device != stream.device:
            raise RuntimeError(f"event of device {event.device} recorded on a stream of device {stream.device}")
        event.device = stream.device
        event.ts_ns = self.busy_until[stream] = self._tail(stream)
        event.records += 1
        return True

    def query(self, event: FakeEvent) -> bool:
        self.queries += 1
        return event.ts_ns is not None and event.ts_ns <= self.now_ns

    def elapsed_ms(self, start: FakeEvent, end: FakeEvent) -> float:
        for ev in (start, end):
            if ev.ts_ns is None or ev.ts_ns > self.now_ns:
                raise AssertionError("elapsed time of an event not completed (CUDA: cudaErrorNotReady)")
        if start.device != end.device:
            raise RuntimeError("events on different devices")
        if end.number in self.broken:
            raise RuntimeError("event not recorded with timing")
        assert start.ts_ns is not None and end.ts_ns is not None
        # cudaEventElapsedTime reports a float32 of milliseconds
        return float(struct.unpack("f", struct.pack("f", (end.ts_ns - start.ts_ns) / 1e6))[0])

    def wait(self, event: FakeEvent) -> None:
        self.waits += 1
        assert event.ts_ns is not None, "waiting for an event never recorded would hang"
        self.now_ns = max(self.now_ns, event.ts_ns)

    def memory_allocated(self, device: int) -> int:
        self.memory_reads += 1
        return self.memory.get(device, 0)
