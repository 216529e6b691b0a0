"""A real model whose modules "launch kernels" on the test device clock.

``Kernel`` modules do real CPU math (a Linear) and tell the device clock
they launched ``ns`` of work on the current stream, forward and backward (a
custom autograd function launches the gradient's work), and that they keep
``alloc`` bytes allocated.  With the device behind (the test advances it
less than was launched), every enter and exit event is queued behind the
work before it, so a call's device duration is exactly the work launched
inside it -- what the assertions compute independently.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import modtrace
import modtrace.api
from tests.helpers.device_clock import FakeDeviceClock, FakeStream
from tests.helpers.recording import FakeClock
from tests.helpers.training import train

FORWARD_NS = {"a": 30_000, "b": 50_000, "head": 20_000}  # work launched by each Kernel's forward
BACKWARD_NS = 7_000  # and by each Kernel's backward
ALLOC = {"a": 4096, "b": 1024, "head": 512}  # bytes each forward call leaves allocated


class _Launch(torch.autograd.Function):
    """Identity whose backward launches ``BACKWARD_NS`` on the device's current stream."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, device: FakeDeviceClock) -> torch.Tensor:
        ctx.device = device
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        device: FakeDeviceClock = ctx.device
        device.launch(device.stream(0), BACKWARD_NS)
        return grad, None


class Kernel(nn.Module):
    def __init__(self, device: FakeDeviceClock, name: str, side: FakeStream | None = None) -> None:
        super().__init__()
        self.device = device
        self.ns = FORWARD_NS[name]
        self.alloc = ALLOC[name]
        self.side = side  # run on this stream (torch.cuda.stream(s) in a real program)
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dev = self.device
        before = dev.current.get(0)
        if self.side is not None:
            dev.current[0] = self.side
        try:
            y = self.fc(_Launch.apply(x, dev))
            dev.launch(dev.stream(0), self.ns)
            dev.memory[0] = dev.memory.get(0, 0) + self.alloc
        finally:
            if self.side is not None:
                if before is None:
                    dev.current.pop(0, None)
                else:
                    dev.current[0] = before
        return y


class DeviceNet(nn.Module):
    """a, then b under activation checkpointing (so b recomputes in the backward), then head."""

    def __init__(self, device: FakeDeviceClock, side: FakeStream | None = None) -> None:
        super().__init__()
        self.a = Kernel(device, "a")
        self.b = Kernel(device, "b", side)
        self.head = Kernel(device, "head")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.a(x)
        x = checkpoint(self.b, x, use_reentrant=False)
        return self.head(x)


def train_on_device(rec: Any, net: DeviceNet, device: FakeDeviceClock, steps: int, advance_ns: int) -> None:
    """``steps`` manual steps, no optimizer; after each the device gets ``advance_ns`` further
    (behind the launches when that is less than a step's work)."""

    def end_step() -> None:
        rec.step()
        device.advance(advance_ns)

    torch.manual_seed(0)
    train(net, steps, inputs=(2, 4), lr=None, each_step=end_step)


def _record(db: Path, run: str, device: FakeDeviceClock | None = None, *, side: FakeStream | None = None,
            **kwargs: Any) -> FakeDeviceClock:
    device = device or FakeDeviceClock()
    net = DeviceNet(device, side)
    with modtrace.Recorder(db=str(db), run=run, device_clock=device, clock=FakeClock(), **kwargs) as rec:
        train_on_device(rec, net, device, STEPS, BEHIND)
    return device


STEPS = 3


STEP_WORK = sum(FORWARD_NS.values()) + 2 * BACKWARD_NS


BEHIND = STEP_WORK // 2  # the device gets this much further per step: it falls behind
