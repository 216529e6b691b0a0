"""modtrace diff compares kept memory exactly, like the work counters: an A/A pair keeps the
same bytes in every module and phase, and a candidate whose block 1 keeps one more tensor at
its exit is named, for that module's forward alone, under --fail-on counters."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tests.helpers.training import record_training


class Block(nn.Module):
    def __init__(self, hold: bool = False) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.hold = hold
        self.held: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        if self.hold:  # a cache the block keeps past its exit: 4 x 8 floats more
            self.held = h.detach() * 2
        return torch.relu(h)


class Model(nn.Module):
    def __init__(self, hold_in_block_1: bool = False) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block(hold_in_block_1), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_kept_memory_diff_is_exact(db_path: Path, run_cli: Any) -> None:
    db = str(db_path)
    record_training(db, "base", 3, model=lambda: Model(), writer="inline")
    record_training(db, "again", 3, model=lambda: Model(), writer="inline")
    record_training(db, "cand", 3, model=lambda: Model(True), writer="inline")
    aa = run_cli("diff", "base", "again", "--db", db, "--fail-on", "counters", "--format", "json")
    assert aa.code == 0, aa
    assert json.loads(aa.out)["counters"] == []

    ab = run_cli("diff", "base", "cand", "--db", db, "--fail-on", "counters", "--format", "json")
    assert ab.code == 1, ab
    kept = [c for c in json.loads(ab.out)["counters"] if c["counter"] == "kept_mem_bytes"]
    assert [(c["fqn"], c["phase"]) for c in kept] == [("Model.blocks.1", "forward")]
    assert kept[0]["cand"] - kept[0]["base"] == 4 * 8 * 4  # the held tensor's bytes, exactly
    table = run_cli("diff", "base", "cand", "--db", db, "--fail-on", "counters")
    assert table.code == 1 and "kept_mem_bytes" in table.out
