"""modtrace diff compares work counters exactly: an A/A pair is quiet, a candidate whose
block 1 MLP runs its first matmul three times is named alone, and --fail-on counters
makes that the exit status."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from tests.helpers.training import record_training


class MLP(nn.Module):
    """Matmuls on its own parameters (no child modules): its self counts are its work."""

    def __init__(self, repeats: int = 1) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(8, 16) * 0.1)
        self.w2 = nn.Parameter(torch.randn(16, 8) * 0.1)
        self.repeats = repeats

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.repeats):
            h = x @ self.w1
        return torch.nn.functional.gelu(h) @ self.w2


class Block(nn.Module):
    def __init__(self, repeats: int = 1) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.mlp = MLP(repeats)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Model(nn.Module):
    def __init__(self, repeats_in_block_1: int = 1) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block(repeats_in_block_1), Block()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_counter_diff_is_quiet_on_aa_and_names_only_the_module_whose_work_changed(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(db_path)
    record_training(db, "base", 4, model=lambda: Model(1), writer="inline")
    record_training(db, "again", 4, model=lambda: Model(1), writer="inline")
    record_training(db, "cand", 4, model=lambda: Model(3), writer="inline")
    aa = run_cli("diff", "base", "again", "--db", db, "--fail-on", "counters", "--format", "json")
    assert aa.code == 0, aa
    doc = json.loads(aa.out)
    assert doc["counters"] == [] and doc["summary"]["counter_changes"] == 0

    ab = run_cli("diff", "base", "cand", "--db", db, "--fail-on", "counters", "--format", "json")
    assert ab.code == 1, ab
    changes = json.loads(ab.out)["counters"]
    assert {c["fqn"] for c in changes} == {"Model.blocks.1.mlp"}
    by = {(c["phase"], c["counter"]): (c["base"], c["cand"]) for c in changes}
    matmul = 2 * 4 * 8 * 16
    assert by["forward", "flops"] == (2 * matmul, 4 * matmul)  # x @ w1 three times instead of once
    assert ("backward", "flops") not in by  # only the last product reaches the loss: the same gradients
    assert by["forward", "ops"][1] > by["forward", "ops"][0]

    table = run_cli("diff", "base", "cand", "--db", db, "--fail-on", "counters")
    assert table.code == 1
    assert "Work counters (exact, self)" in table.out and "Model.blocks.1.mlp" in table.out
    # the default --fail-on regression is not failed by counters alone
    assert run_cli("diff", "base", "again", "--db", db).code == 0
