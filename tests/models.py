"""Small real models shared by several test files."""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


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
