"""What the memory what-if tests share: a stack of MLP blocks, checkpointing chosen modules of
any model after the fact, a step's peak as torch's MemTracker measures it, and a recorded run's
peak as modtrace's ``step_memory`` has it."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import modtrace
from tests.helpers.database import db_rows

Step = Callable[[nn.Module, torch.optim.Optimizer], None]


class MlpBlock(nn.Module):
    """x + fc2(gelu(fc1(x))): its forward keeps fc1's input and output and the GELU's output."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, 4 * width)
        self.fc2 = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + self.fc2(nn.functional.gelu(self.fc1(x)))
        return out


class MlpStack(nn.Module):
    def __init__(self, width: int = 256, blocks: int = 6) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(MlpBlock(width) for _ in range(blocks))
        self.head = nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        out: torch.Tensor = self.head(x)
        return out


def checkpointed(model: nn.Module, fqns: Iterable[str]) -> nn.Module:
    """``model`` with each module named in ``fqns`` (modtrace's names: the root's class, then
    the module's path) run under non-reentrant ``torch.utils.checkpoint``: its forward replaced
    by one that checkpoints the original, so its hooks and name stay as they were."""
    wanted = set(fqns)
    root = type(model).__name__
    for name, module in model.named_modules():
        if (f"{root}.{name}" if name else root) in wanted:
            original = module.forward

            def forward(*args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
                return checkpoint(_original, *args, use_reentrant=False, **kwargs)

            module.forward = functools.update_wrapper(forward, original)  # type: ignore[method-assign]
    return model


def memtracker_peak(model: nn.Module, opt: torch.optim.Optimizer, step: Step, *inputs: torch.Tensor) -> int:
    """The peak total bytes on the CPU over one ``step`` under torch's MemTracker."""
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model, opt, *inputs)
    with tracker:
        step(model, opt)
    return int(tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"])


def record_steps(db: str, run: str, model: nn.Module, opt: torch.optim.Optimizer, step: Step, steps: int,
                 **recorder: Any) -> None:
    """``steps`` calls of ``step`` recorded as ``run`` (work counters and memory on the first step
    unless ``recorder`` says otherwise: ``counters="every-step"``), analysis waited for."""
    recorder.setdefault("counters", "first")
    with modtrace.Recorder(db=db, run=run, **recorder) as rec:
        for _ in range(steps):
            step(model, opt)
    rec.wait_analyzed()


def step_memory_peak(db: str | Path, run: str) -> int:
    """The largest ``step_memory.peak_bytes`` of the run's counted steps (read as SQL)."""
    rows = db_rows(db, "SELECT MAX(m.peak_bytes) FROM step_memory m JOIN runs r ON r.id = m.run_id WHERE r.name = :run",
                   run=run)
    return int(rows[0][0])
