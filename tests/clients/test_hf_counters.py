"""Work counters on Hugging Face GPT-2 training (a small config, nothing downloaded), with
gradient checkpointing: every block of one config does the same work in every phase, two
runs count the same, and a candidate whose block 1 MLP runs its first projection three
times is the one finding of ``modtrace diff --fail-on counters``."""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

import modtrace
from tests.helpers.database import db_rows

pytestmark = pytest.mark.slow  # real clients: transformers

LAYERS = 3
PREFIX = "GPT2LMHeadModel.transformer.h"


def _tripled_mlp_forward(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    for _ in range(3):  # the first projection run three times, the last kept
        h = self.c_fc(hidden_states)
    return self.dropout(self.c_proj(self.act(h)))


def _record(db: str, run: str, tripled: bool = False) -> None:
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=LAYERS, n_head=2)
    model = transformers.GPT2LMHeadModel(cfg)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    if tripled:
        mlp = model.transformer.h[1].mlp
        mlp.forward = types.MethodType(_tripled_mlp_forward, mlp)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, 64, (2, 8), generator=torch.Generator().manual_seed(1))
    with modtrace.Recorder(db=db, run=run, writer="inline"):
        for _ in range(3):
            opt.zero_grad()
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()


def test_gpt2_blocks_count_alike_two_runs_alike_and_a_tripled_projection_is_the_one_finding(
        db_path: Path, run_cli: Any) -> None:
    db = str(db_path)
    _record(db, "base")
    _record(db, "again")
    _record(db, "cand", tripled=True)
    # each block's work per phase: the self counts of its spans and its descendants' (with
    # this transformers the recompute spans are the block's children's, not the block's own)
    work: dict[tuple[str, int], list[int]] = {}
    for fqn, phase, flops, nbytes, ops in db_rows(
            db, "SELECT s.fqn, s.phase, s.flops_self, s.bytes_self, s.ops_self FROM spans s JOIN runs r ON r.id = s.run_id "
                "WHERE r.name = 'base' AND s.ops IS NOT NULL"):
        if fqn.startswith(PREFIX + "."):
            acc = work.setdefault((phase, int(fqn.split(".")[3])), [0, 0, 0])
            for i, v in enumerate((flops, nbytes, ops)):
                acc[i] += v
    assert {phase for phase, _ in work} == {"forward", "backward", "recompute"}
    for phase in ("forward", "backward", "recompute"):
        counts = {tuple(work[phase, block]) for block in range(LAYERS)}
        assert len(counts) == 1, (phase, counts)  # every block, the same work
        assert next(iter(counts))[0] > 0
    assert work["recompute", 0][0] == work["forward", 0][0]  # the recompute's matmuls are the forward's

    aa = run_cli("diff", "base", "again", "--db", db, "--fail-on", "counters", "--format", "json")
    assert aa.code == 0, aa
    assert json.loads(aa.out)["counters"] == []

    ab = run_cli("diff", "base", "cand", "--db", db, "--fail-on", "counters", "--format", "json")
    assert ab.code == 1, ab
    changes = json.loads(ab.out)["counters"]
    # the projection's forward, and its recompute (the checkpoint runs the forward again)
    assert {(c["fqn"], c["phase"]) for c in changes} == {(f"{PREFIX}.1.mlp.c_fc", "forward"),
                                                         (f"{PREFIX}.1.mlp.c_fc", "recompute")}
    flops = {c["phase"]: (c["base"], c["cand"]) for c in changes if c["counter"] == "flops"}
    assert flops["forward"][1] == 3 * flops["forward"][0]
