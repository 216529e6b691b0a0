"""The device-time data path at the tracker, without a GPU: a real Tracker over a
real model (forward, backward, checkpoint recompute) with the test device
clock injected, so each event gets a device event on the clock's stream
(the tracker's CUDA path), polled between steps and drained at the end, then
spans and their device columns from the real analysis."""

from __future__ import annotations

from typing import Any

import polars as pl
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from modtrace.analysis import analyze_events
from modtrace.analysis.device import DEVICE_EVENT_SCHEMA, device_times
from modtrace.core.contracts import MODULE_FRAME
from modtrace.tracking.device_timer import DeviceRow
from modtrace.tracking.tracker import Tracker
from tests.helpers.analysis_streams import frame
from tests.helpers.device_clock import FakeDeviceClock
from tests.helpers.recording import FakeClock

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
    rows: list[tuple[Any, ...]] = []

    def append(event: tuple[Any, ...]) -> None:
        # The tracker marked the event's device event before handing it over;
        # then the "module" launches KERNEL_NS of work and allocates.
        rows.append(event)
        device.launch(device.stream(0), KERNEL_NS)
        device.memory[0] = MEM_PER_EVENT * (event[0] + 1)

    tracker = Tracker(append, clock=FakeClock(), device_clock=device)
    resolved: list[DeviceRow] = []
    tracker.start()
    try:
        for _ in range(3):
            net(torch.randn(2, 4)).sum().backward()
            timer = tracker.device_timer
            assert timer is not None
            resolved += timer.poll()  # a step boundary: what the device finished
            device.advance(10 * KERNEL_NS)  # the device is behind: the last events stay pending
    finally:
        tracker.stop()
    timer = tracker.device_timer
    assert timer is not None and timer.pending > 0 and device.waits == 0 and resolved
    resolved += timer.drain()
    assert device.waits == 1

    assert sorted(r[0] for r in resolved) == [r[0] for r in rows]  # every event, once
    assert {r[9] for r in rows} == {device.stream(0).handle}  # the stream column is the clock's stream
    modules = pl.DataFrame([(0, *m) for m in tracker.new_modules],
                           schema=list(MODULE_FRAME.names), orient="row")
    devices = pl.DataFrame([(0, *d) for d in tracker.new_devices], schema=["rank", "device_id", "name"], orient="row")
    spans = analyze_events(frame(rows), modules, devices).spans
    dev = pl.DataFrame([(1, 0, *r) for r in resolved], schema=DEVICE_EVENT_SCHEMA, orient="row")
    out = device_times(spans, dev)

    assert set(out["phase"].cast(pl.String)) == {"forward", "backward", "recompute"}
    assert out.filter(pl.col("end_ns").is_null()).height == 0
    # Event k was recorded behind k launches: a span lasts KERNEL_NS per event inside it.
    events_inside = out["exit_seq"] - out["span_id"]
    assert (out["device_duration_ns"] == KERNEL_NS * events_inside).all()
    children = out.group_by("parent_span_id").agg((pl.col("exit_seq") - pl.col("span_id")).sum().alias("inner"))
    own = out.join(children, left_on="span_id", right_on="parent_span_id", how="left").sort("span_id")
    ordered = out.sort("span_id")
    assert (ordered["device_self_ns"] == KERNEL_NS * (ordered["exit_seq"] - ordered["span_id"]
                                                      - own["inner"].fill_null(0))).all()
    assert (out["mem_delta_bytes"] == MEM_PER_EVENT * events_inside).all()
    assert (out["mem_max_bytes"] == MEM_PER_EVENT * out["exit_seq"]).all()
