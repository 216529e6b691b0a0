"""The phase-2 data path, end to end without a GPU: a real Tracker over a real
model (forward, backward, checkpoint recompute) whose events each get a
device event through DeviceTimer (the test device clock standing in for
CUDA), polled between steps and drained at the end, then spans and their
device columns from the real analysis."""

from __future__ import annotations

from typing import Any

import polars as pl
import torch
from analysis_streams import frame
from torch import nn
from torch.utils.checkpoint import checkpoint

from modtrace.analysis import analyze_events
from modtrace.analysis.device import DEVICE_EVENT_SCHEMA, device_times
from modtrace.contracts import MODULE_FRAME
from modtrace.device_clock import DeviceRow, DeviceTimer
from modtrace.tracker import Tracker
from tests.device_clock import FakeDeviceClock, FakeStream
from tests.recording import FakeClock

STREAM = FakeStream(0, 0x5000)
KERNEL_NS = 500  # the device work each event is behind; the host clock ticks 1000 per event
MEM_PER_EVENT = 8


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.fc(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = Block()
        self.b = Block()
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        x = checkpoint(self.b, x, use_reentrant=False)
        return self.head(x)


def test_spans_of_a_real_recording_get_the_device_clocks_times() -> None:
    torch.manual_seed(0)
    net = Net()
    device = FakeDeviceClock()
    timer = DeviceTimer(device, lambda: 0)
    rows: list[tuple[Any, ...]] = []

    def append(event: tuple[Any, ...]) -> None:
        # What the tracker will do on CUDA (phase 2): the row, then its device event.
        event = (*event[:9], STREAM.handle, *event[10:])
        rows.append(event)
        device.launch(STREAM, KERNEL_NS)
        device.memory[0] = MEM_PER_EVENT * event[0]
        timer.mark(event[0], 0, STREAM, STREAM.handle)

    tracker = Tracker(append, clock=FakeClock())
    resolved: list[DeviceRow] = []
    tracker.start()
    try:
        for _ in range(3):
            net(torch.randn(2, 4)).sum().backward()
            resolved += timer.poll()  # a step boundary: what the device finished
            device.advance(10 * KERNEL_NS)  # the device is behind: the last events stay pending
    finally:
        tracker.stop()
    assert timer.pending > 0 and device.waits == 0
    resolved += timer.drain()
    assert device.waits == 1

    assert sorted(r[0] for r in resolved) == [r[0] for r in rows]  # every event, once
    modules = pl.DataFrame([(0, *m) for m in tracker.new_modules],
                           schema=list(MODULE_FRAME.names), orient="row")
    devices = pl.DataFrame([(0, *d) for d in tracker.new_devices], schema=["rank", "device_id", "name"], orient="row")
    spans = analyze_events(frame(rows), modules, devices).spans
    dev = pl.DataFrame([(1, 0, *r) for r in resolved], schema=DEVICE_EVENT_SCHEMA, orient="row")
    out = device_times(spans, dev)

    assert set(out["phase"].cast(pl.String)) == {"forward", "backward", "recompute"}
    assert out.filter(pl.col("end_ns").is_null()).height == 0
    # The device ran each event KERNEL_NS after the previous one, half the host's tick.
    assert (out["device_duration_ns"] * 2 == out["duration_ns"]).all()
    assert (out["device_self_ns"] * 2 == out["self_ns"]).all()
    assert (out["mem_delta_bytes"] == MEM_PER_EVENT * (out["exit_seq"] - out["span_id"])).all()
    assert (out["mem_max_bytes"] == MEM_PER_EVENT * out["exit_seq"]).all()
