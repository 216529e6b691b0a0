"""Runs for diff tests: a small model on a work clock, each block costing what the test says, recorded for a number of steps."""

from __future__ import annotations

from typing import Any

STEPS = 10


def record(db: str, name: str, costs: dict[int, int] | None = None, *, steps: int = STEPS, rank: int = 0,
           world_size: int = 1, blocks: int = 3, analyze: bool = True, scale: float = 1.0, jitter: float = 0.0,
           seed: int = 0, tags: dict[str, str] | None = None, speed_probe: bool = False,
           clock: WorkClock | None = None) -> None:
    """``scale`` stretches every duration alike (a busier machine, or slower code everywhere);
    ``jitter`` multiplies each module's cost by a random factor in [1 - jitter, 1 + jitter]
    (seeded by ``seed``): step-to-step noise.  With ``speed_probe`` the recorder's probe reads the
    clock twice, so it takes one tick: ``scale`` slows it as it slows the steps (a slower machine).
    ``clock``: the test's own clock instead of one made of those three."""
    import torch

    from modtrace import Recorder

    clock = clock or WorkClock(scale=scale, jitter=jitter, seed=seed)
    net = build_model(clock, costs or {}, blocks)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    x = torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    with Recorder(db=db, run=name, clock=clock, rank=rank, world_size=world_size, join=world_size > 1,
                  handle_sigterm=False, analyze=analyze, tags=tags, speed_probe=speed_probe) as _rec:
        for _ in range(steps):
            net(x).sum().backward()
            opt.step()
            opt.zero_grad()
    _rec.wait_analyzed()  # the writer process analyses the run after the with


class WorkClock:
    """Nanoseconds: ``tick`` per read, plus whatever ``work`` adds."""

    def __init__(self, tick: int = 1000, scale: float = 1.0, jitter: float = 0.0, seed: int = 0) -> None:
        import random

        self.now = 0
        self.tick = round(tick * scale)
        self.scale = scale
        self.jitter = jitter
        self.rng = random.Random(seed)

    def __call__(self) -> int:
        self.now += self.tick
        return self.now

    def work(self, ns: int) -> None:
        factor = self.scale * ((1 + self.rng.uniform(-self.jitter, self.jitter)) if self.jitter else 1.0)
        self.now += round(ns * factor)


class PreemptedClock(WorkClock):
    """A busy machine that preempts the process in one module: the ``i``-th call of the work
    costing ``cost`` waits ``wait`` more when ``preempted[i]`` is true."""

    def __init__(self, cost: int, wait: int, preempted: list[bool], **kw: Any) -> None:
        super().__init__(**kw)
        self.cost, self.wait, self.preempted = cost, wait, iter(preempted)

    def work(self, ns: int) -> None:
        super().work(ns)
        if ns == self.cost and next(self.preempted):
            self.now += self.wait


def build_model(clock: WorkClock, costs: dict[int, int], blocks: int = 3) -> Any:
    import torch
    from torch import nn

    class Work(nn.Module):
        def __init__(self, cost: int) -> None:
            super().__init__()
            self.lin = nn.Linear(4, 4)
            self.cost = cost

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            clock.work(self.cost)  # the module's own code takes this long
            return torch.relu(self.lin(x))

    class Block(nn.Module):
        def __init__(self, cost: int) -> None:
            super().__init__()
            self.norm = nn.LayerNorm(4)
            self.work = Work(cost)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.work(self.norm(x))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(4, 4)
            self.blocks = nn.ModuleList(Block(costs.get(i, 100_000)) for i in range(blocks))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.inp(x)
            for b in self.blocks:
                x = b(x)
            return x

    torch.manual_seed(0)
    return Net()
