"""DeviceTimer through the test device clock (events complete late and out of
order), and CudaClock on a real GPU where there is one."""

from __future__ import annotations

import threading

import pytest
import torch

from modtrace.tracking.device_timer import CudaClock, DeviceRow, DeviceTimer
from tests.helpers.device_clock import FakeDeviceClock, FakeStream

A = FakeStream(0, 0x7F00)
B = FakeStream(0, 0x7F08)


def timer(clock: FakeDeviceClock, host_ns: int = 1_000, **kw: bool) -> DeviceTimer:
    host = [host_ns]
    return DeviceTimer(clock, lambda: host[0], **kw)


def mark(t: DeviceTimer, seq: int, s: FakeStream) -> None:
    t.mark(seq, s.device, s, s.handle)


def test_rows_get_the_device_times_of_their_stream() -> None:
    clock = FakeDeviceClock(memory={0: 512})
    t = timer(clock)
    mark(t, 0, A)  # the reference goes on A just before, at device time 0, host time 1000
    clock.launch(A, 3_000_000)
    clock.memory[0] = 4096
    mark(t, 1, A)
    clock.launch(A, 250)
    mark(t, 2, A)
    clock.advance(10_000_000)
    assert t.poll() == [(0, 1_000, 512), (1, 3_001_000, 4096), (2, 3_001_250, 4096)]
    assert t.pending == 0 and clock.waits == 0


def test_events_taken_for_compiled_kernels_time_the_rows_queued_later() -> None:
    """A compiled graph's kernels: events recorded either side of each kernel as it is
    launched (take), queued once the graph call returns with the seqs of the rows each
    one times (none, one or several), in recording order among the hooks' marks."""
    clock = FakeDeviceClock(memory={0: 64})
    t = timer(clock, host_ns=0)
    mark(t, 0, A)  # the compiled module's enter (a hook): device time 0
    taken = []
    for ns in (2_000, 3_000):  # two kernels
        taken.append(t.take(A.device, A, A.handle))
        clock.launch(A, ns)
        taken.append(t.take(A.device, A, A.handle))
    assert None not in taken and t.pending == 1  # taken events are not pending until queued
    # rows 1 (enter of an inner module and its child, both at the first kernel's start),
    # 2 (exit of the child: first kernel's end), nothing at the second kernel's start, 3 (exit)
    t.queue_recorded(A.device, A.handle, [((1, 2), taken[0]), ((3,), taken[1]), ((), taken[2]), ((4,), taken[3])])
    mark(t, 5, A)  # the compiled module's exit
    clock.advance(10_000)
    assert t.poll() == [(0, 0, 64), (1, 0, None), (2, 0, None), (3, 2_000, None), (4, 5_000, None), (5, 5_000, 64)]
    assert t.pending == 0
    # every event went back to the pool: more kernels take no new one
    made = t.events_allocated
    for _ in range(2):
        got = [t.take(A.device, A, A.handle), t.take(A.device, A, A.handle)]
        t.queue_recorded(A.device, A.handle, [((), ev) for ev in got])
        clock.advance(1)
        t.poll()
    assert t.events_allocated == made


def test_a_stream_being_captured_takes_no_event() -> None:
    clock = FakeDeviceClock()
    t = timer(clock)
    mark(t, 0, A)
    clock.capturing = True
    assert t.take(A.device, A, A.handle) is None


def test_pending_events_resolve_later_and_polling_never_waits() -> None:
    clock = FakeDeviceClock()
    t = timer(clock, host_ns=0)
    mark(t, 0, A)
    clock.launch(A, 5_000)
    for seq in range(1, 100):
        mark(t, seq, A)
        clock.launch(A, 1_000)
    assert t.poll() == [(0, 0, 0)]
    assert clock.queries <= 2 + 7  # the reference, the newest, a bisection of 99: not one per pending event
    clock.advance(5_000)
    assert t.poll() == [(1, 5_000, 0)]
    clock.advance(2_500)
    assert t.poll() == [(2, 6_000, 0), (3, 7_000, 0)]
    assert t.pending == 96 and clock.waits == 0


def test_a_late_reference_shifts_every_time_alike() -> None:
    clock = FakeDeviceClock()
    t = timer(clock, host_ns=100)
    clock.launch(A, 5_000)  # the device is busy as it is first seen
    mark(t, 0, A)
    clock.launch(A, 300)
    mark(t, 1, A)
    assert t.poll() == []  # not even the reference has run
    clock.advance(6_000)
    assert t.poll() == [(0, 100, 0), (1, 400, 0)]  # durations hold


def test_streams_complete_out_of_order() -> None:
    clock = FakeDeviceClock()
    t = timer(clock, host_ns=0)
    mark(t, 0, A)
    clock.launch(A, 1_000_000)
    mark(t, 1, A)  # A is busy for a millisecond
    mark(t, 2, B)
    clock.launch(B, 100)
    mark(t, 3, B)
    clock.advance(500)
    assert sorted(t.poll()) == [(0, 0, 0), (2, 0, 0), (3, 100, 0)]
    assert t.pending == 1
    clock.advance(1_000_000)
    assert t.poll() == [(1, 1_000_000, 0)]


def test_drain_waits_once_per_stream_and_loses_nothing() -> None:
    clock = FakeDeviceClock()
    t = timer(clock, host_ns=7)
    expected = {}
    for seq in range(100):
        s = A if seq % 2 else B
        mark(t, seq, s)
        expected[seq] = 7 + clock.busy_until[s]
        clock.launch(s, 10 * (seq + 1))
    rows = t.poll()
    assert sorted(r[0] for r in rows) == [0, 1]  # the first on each stream; the rest are running
    rows += t.drain()
    assert {r[0]: r[1] for r in rows} == expected
    assert len(rows) == 100 and t.pending == 0
    assert clock.waits == 2  # one per stream


def test_events_come_from_a_pool_not_one_per_call() -> None:
    clock = FakeDeviceClock()
    t = timer(clock, host_ns=0)
    rows: list[DeviceRow] = []
    expected = {}
    seq = 0
    for step in range(20):
        for _ in range(64):
            mark(t, seq, A)
            expected[seq] = clock.busy_until[A]
            clock.launch(A, 100)
            seq += 1
        clock.advance(64 * 100 // (2 if step == 0 else 1))  # the device lags half a step behind
        rows += t.poll()
    rows += t.drain()
    assert {r[0]: r[1] for r in rows} == expected  # no event reused while pending
    assert len(rows) == 1280
    assert t.events_allocated == len(clock.events) <= 1 + 64 + 32  # the reference, and at most two steps' worth
    assert max(ev.records for ev in clock.events) >= 19


def test_each_device_has_its_own_pool_and_reference() -> None:
    clock = FakeDeviceClock(memory={0: 100, 1: 200})
    host = [10]
    t = DeviceTimer(clock, lambda: host[0])
    d1 = FakeStream(1, 0x9000)
    mark(t, 0, A)
    clock.launch(A, 1_000)
    clock.advance(400)  # device 1 is first seen later, at host time 20
    host[0] = 20
    mark(t, 1, d1)
    clock.launch(d1, 50)
    for seq in range(2, 40):  # the fake refuses an event of one device recorded on another's stream
        s = A if seq % 2 else d1
        clock.launch(s, 10)
        mark(t, seq, s)
    clock.advance(10_000)
    rows = {r[0]: r for r in t.poll()}
    assert rows[0] == (0, 10, 100)
    assert rows[1] == (1, 20, 200)  # its reference ran at once, on an idle device
    assert rows[2] == (2, 20 + 50 + 10, 200)
    assert rows[3] == (3, 10 + 1_000 + 10, 100)
    assert len(rows) == 40


def test_memory_read_at_each_mark_or_not_at_all() -> None:
    clock = FakeDeviceClock(memory={0: 1 << 20})
    t = timer(clock, memory=False)
    mark(t, 0, A)
    clock.advance(1)
    assert t.poll() == [(0, 1_000, None)]
    assert clock.memory_reads == 0


def test_an_event_the_device_cannot_time_gets_no_time() -> None:
    clock = FakeDeviceClock()
    t = timer(clock, host_ns=0)
    mark(t, 0, A)
    clock.broken.add(clock.events[-1].number)
    clock.launch(A, 5)
    mark(t, 1, A)
    clock.advance(10)
    assert t.poll() == [(0, None, 0), (1, 5, 0)]
    assert t.pending == 0


def test_marks_from_many_threads_while_polling_resolve_once_each() -> None:
    clock = FakeDeviceClock()  # idle streams: every event completes as it is recorded
    t = timer(clock, host_ns=0)
    n, threads = 3_000, 4
    done = threading.Event()
    rows: list[DeviceRow] = []

    def work(k: int) -> None:
        s = FakeStream(0, 0x100 + k)
        for i in range(n):
            t.mark(k * n + i, 0, s, s.handle)

    def poll() -> None:
        while not done.is_set():
            rows.extend(t.poll())

    poller = threading.Thread(target=poll)
    poller.start()
    workers = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    done.set()
    poller.join()
    rows.extend(t.drain())
    assert sorted(r[0] for r in rows) == list(range(n * threads))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_clock_times_a_matmul_and_counts_its_memory() -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    stream = torch.cuda.current_stream(dev)
    t = DeviceTimer(CudaClock(), lambda: 0)
    x = torch.randn(4096, 4096, device=dev)
    rows: list[DeviceRow] = []
    for step in range(3):
        t.mark(2 * step, dev.index, stream, stream.cuda_stream)
        y = x @ x
        t.mark(2 * step + 1, dev.index, stream, stream.cuda_stream)
        del y
        rows += t.poll()
    rows += t.drain()
    assert t.pending == 0 and t.events_allocated <= 1 + 6
    by_seq = {r[0]: r for r in rows}
    assert sorted(by_seq) == list(range(6))
    for step in range(3):
        enter, exit_ = by_seq[2 * step], by_seq[2 * step + 1]
        assert enter[1] is not None and exit_[1] is not None
        assert exit_[1] - enter[1] > 0
        assert enter[2] is not None and exit_[2] is not None
        assert exit_[2] - enter[2] == 4096 * 4096 * 4


def test_calls_during_a_cuda_graph_capture_get_no_device_event() -> None:
    clock = FakeDeviceClock(capturing=True)
    t = timer(clock, host_ns=0)
    mark(t, 0, A)  # not even the reference can go on a capturing stream
    mark(t, 1, A)
    clock.capturing = False
    mark(t, 2, A)
    clock.launch(A, 40)
    mark(t, 3, A)
    clock.capturing = True
    for seq in range(4, 10):
        mark(t, seq, A)
    clock.advance(100)
    assert t.poll() == [(2, 0, 0), (3, 40, 0)]
    assert t.pending == 0
    # the reference, two events, one taken by a refused record and given back
    assert t.events_allocated == len(clock.events) == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_clock_leaves_a_graph_capture_alone() -> None:
    dev = torch.device("cuda", torch.cuda.current_device())
    t = DeviceTimer(CudaClock(), lambda: 0)
    x = torch.randn(256, 256, device=dev)
    side = torch.cuda.Stream(dev)
    side.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(side):
        x @ x  # warm, as torch's docs ask before capturing
    torch.cuda.current_stream(dev).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        stream = torch.cuda.current_stream(dev)
        t.mark(0, dev.index, stream, stream.cuda_stream)
        y = x @ x
    graph.replay()
    torch.cuda.synchronize()
    assert t.drain() == [] and t.pending == 0
    assert torch.allclose(y, x @ x)


def test_times_stay_precise_in_a_long_run() -> None:
    # float32 milliseconds measured from the start would be off by up to
    # 0.2 ms after an hour (a 1 us call would last 0 or 430 us); measured from
    # the newest resolved event (a second back here) they are off by tens of ns.
    clock = FakeDeviceClock()
    t = timer(clock, host_ns=0)
    rows: list[DeviceRow] = []
    seq = 0
    for _second in range(3_600):
        clock.launch(A, 999_999_000)
        mark(t, seq, A)
        clock.launch(A, 1_000)
        mark(t, seq + 1, A)
        seq += 2
        clock.advance(1_000_000_000)
        rows += t.poll()
    got = dict((r[0], r[1]) for r in rows)
    assert len(got) == seq
    last_enter, last_exit = got[seq - 2], got[seq - 1]
    assert last_enter is not None and last_exit is not None
    assert abs(last_enter - 3_599 * 1_000_000_000) < 1_000  # the device was first seen at its 999_999_000th ns
    assert abs(last_exit - last_enter - 1_000) <= 100
