"""Small real models shared by several test files."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from modtrace.core.contracts import Batch
from modtrace.store.engine import open_store
from modtrace.store.runs import add_rank, create_run, finish_rank
from modtrace.store.writer import RankWriter
from tests.helpers.analysis_streams import ENTER, EXIT, ev, model, to_rows


def mlp() -> nn.Sequential:
    """Linear(8, 8), ReLU, Linear(8, 2): the small model a test trains when the model is not the point."""
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2))


class Checkpointed(nn.Module):
    """Blocks every other one checkpointed (recompute spans in backward)."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            x = checkpoint(block, x, use_reentrant=False) if i % 2 else block(x)
        return x


class Block(nn.Module):
    """Two linear layers with a ReLU between them."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 4)
        self.fc2 = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


class Net(nn.Module):
    """``blocks`` Blocks then a head; block 1 runs under activation checkpointing (so backward recomputes it)."""

    def __init__(self, blocks: int = 2) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block() for _ in range(blocks)])
        self.head = nn.Linear(4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            x = checkpoint(block, x, use_reentrant=False) if i == 1 else block(x)
        return self.head(x)


def tiny_model_and_opt() -> tuple[nn.Module, torch.optim.Optimizer]:
    """Linear, ReLU, Linear (seeded) and its SGD optimizer."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1))
    return model, torch.optim.SGD(model.parameters(), lr=0.01)


def train_step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """One forward, backward and optimizer step (an optimizer step ends a recorded step)."""
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    opt.zero_grad()


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(6, 6)
        self.b = nn.Linear(6, 6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x)))


class Reentrant(nn.Module):
    """Reentrant checkpointing: each block's backward runs a nested graph task on the same thread."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Pair() for _ in range(3))
        self.head = nn.Linear(6, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=True)
        return self.head(x)


def _crossed_run(db: str) -> None:
    """A rank whose forward exit crossed an open call, leaving that call unclosed."""
    store = open_store(db, create=True)
    try:
        run_id, _ = create_run(store, "broken", {})
        add_rank(store, run_id, 0, 1_000_000)
        mods = model(blocks=1, per_block=1)  # 0 Net, 1 Net.blocks.0, 2 Net.blocks.0.fc0, 3 Net.head
        rows = to_rows([ev(ENTER, 0, 0, 1), ev(ENTER, 1, 0, 2), ev(ENTER, 2, 0, 3), ev(EXIT, 1, 0, 2), ev(EXIT, 0, 0, 1)])
        RankWriter(store, run_id, 0).write(Batch(rows, modules=mods.rows, threads=[(0, 1, "MainThread")],
                                           devices=[(0, "cpu")], progress=(len(rows), 1)))
        finish_rank(store, run_id, 0, "completed")
    finally:
        store.dispose()
