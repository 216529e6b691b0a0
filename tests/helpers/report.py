"""Reading the HTML report as its page does: the run's data embedded in it."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
from torch import nn

import modtrace
from tests.helpers.training import record_training

REPO = Path(__file__).resolve().parents[2]


def embedded(html: str) -> dict[str, Any]:
    """The JSON document the report's script reads (``#modtrace-data``)."""
    m = re.search(r'<script type="application/json" id="modtrace-data">(.*?)</script>', html, re.S)
    assert m, "no embedded data"
    data: dict[str, Any] = json.loads(m.group(1))
    return data


def record_tiny(db: str, run: str, *, steps: int = 2, slow_block: int | None = None, checkpoint: bool = False,
                **recorder: Any) -> None:
    """Train the bundled tiny transformer (small settings) for ``steps`` steps under a Recorder."""
    tt = train_tiny()
    torch.manual_seed(0)
    model = tt.TinyLM(64, 32, 2, 2, 16, slow_block=slow_block, use_checkpoint=checkpoint)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    with modtrace.Recorder(db=db, run=run, **recorder) as _rec:
        for _ in range(steps):
            x, y = tt.synthetic_batch(gen, 64, 4, 16)
            logits = model(x)
            loss = nn.functional.cross_entropy(logits.reshape(-1, 64), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    _rec.wait_analyzed()  # the writer process analyses the run after the with


def record_toy(db: str, run: str, *, steps: int = 8, slow_ns: int = 0, **recorder: Any) -> None:
    """The toy model for ``steps`` steps on an injected clock; ``slow_ns`` slows Toy.body.2 per call."""
    clock = StepClock()
    record_training(db, run, steps, model=lambda: Toy(clock, slow_ns), clock=clock, **recorder)


def train_tiny() -> ModuleType:
    """scripts/train_tiny.py as a module (it is a script, not part of the package)."""
    global _TT
    if _TT is None:
        spec = importlib.util.spec_from_file_location("train_tiny_for_reports", REPO / "scripts" / "train_tiny.py")
        assert spec is not None and spec.loader is not None
        _TT = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(_TT)
    return _TT


class StepClock:
    """Injected clock: +1 µs per read, plus whatever a module asks to add."""

    def __init__(self) -> None:
        self.now = 0
        self.pending = 0

    def add(self, ns: int) -> None:
        self.pending += ns

    def __call__(self) -> int:
        self.now += 1000 + self.pending
        self.pending = 0
        return self.now


class Toy(nn.Module):
    def __init__(self, clock: StepClock, slow_ns: int) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 8)
        self.body = nn.Sequential(Costly(clock, 50_000), nn.ReLU(), Costly(clock, 50_000 + slow_ns))
        self.head = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(torch.relu(self.embed(x))))


_TT: ModuleType | None = None


class Costly(nn.Module):
    """A linear layer whose forward 'takes' ``cost_ns`` on the injected clock."""

    def __init__(self, clock: StepClock, cost_ns: int) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.clock = clock
        self.cost_ns = cost_ns

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        self.clock.add(self.cost_ns)  # charged to this module's own time, before its exit is stamped
        return y
