"""A checkpoint recompute the recorder cannot link to its forward call is a
visible nesting issue naming the module, never a silent fresh call id."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import modtrace
from tests.helpers.clients import query


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


def test_a_recompute_of_a_forward_run_before_recording_is_an_unlinked_recompute_warning(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(2, 4, requires_grad=True)
    out = checkpoint(block, x, use_reentrant=False)  # the forward runs before the recording starts
    with modtrace.Recorder(db=str(db_path), run="late"):
        out.sum().backward()  # ... its recompute inside it: no forward call to link to
        block(x).sum().backward()  # a forward the recorder saw, for contrast
    db = str(db_path)
    forward_ids = {c for (c,) in query(db, "SELECT call_id FROM spans WHERE phase = 'forward'")}
    recomputed = query(db, "SELECT fqn, call_id FROM spans WHERE phase = 'recompute' ORDER BY span_id")
    assert [f for f, _ in recomputed] == ["Block", "Block.fc"]
    assert not {c for _, c in recomputed} & forward_ids  # call ids of their own ...
    assert query(db, "SELECT fqn, status FROM event_log WHERE phase = 'recompute' AND kind = 'enter' ORDER BY seq") == [
        ("Block", "unlinked"), ("Block.fc", "unlinked")]  # ... and the rows say so
    check = run_cli("check", "@", "--db", db, "--format", "json")
    assert check.code == 0, check  # a warning (the record is not all linked), not an error
    issues = [(r["kind"], r["severity"], r["fqn"], r["phase"]) for r in json.loads(check.out) if r["severity"] != "info"]
    assert issues == [("unlinked_recompute", "warning", "Block", "recompute"),
                      ("unlinked_recompute", "warning", "Block.fc", "recompute")]
    table = run_cli("check", "@", "--db", db)
    assert "Block recompute at seq" in table.out and "could not be linked to its forward call" in table.out


def test_recomputes_of_recorded_forwards_are_linked_and_clean(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    block = Block()
    with modtrace.Recorder(db=str(db_path), run="linked"):
        for _ in range(3):
            checkpoint(block, torch.randn(2, 4, requires_grad=True), use_reentrant=False).sum().backward()
    db = str(db_path)
    assert query(db, "SELECT count(*) FROM spans s WHERE phase = 'recompute' AND NOT EXISTS (SELECT 1 FROM spans f"
                     " WHERE f.phase = 'forward' AND f.call_id = s.call_id AND f.fqn = s.fqn)") == [(0,)]
    assert query(db, "SELECT count(*) FROM spans WHERE phase = 'recompute'") == [(6,)]
    check = run_cli("check", "@", "--db", db, "--format", "json")
    assert check.code == 0 and not [r for r in json.loads(check.out) if r["severity"] != "info"], check
