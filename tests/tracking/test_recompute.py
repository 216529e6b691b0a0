"""A checkpoint recompute the recorder cannot link to its forward call is a
visible nesting issue naming the module, never a silent fresh call id."""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import modtrace
from modtrace.tracking.recompute import TESTED_TORCH, backward_codes
from tests.helpers.clients import check_rows
from tests.helpers.database import db_rows


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
    forward_ids = {c for (c,) in db_rows(db, "SELECT call_id FROM spans WHERE phase = 'forward'")}
    recomputed = db_rows(db, "SELECT fqn, call_id FROM spans WHERE phase = 'recompute' ORDER BY span_id")
    assert [f for f, _ in recomputed] == ["Block", "Block.fc"]
    assert not {c for _, c in recomputed} & forward_ids  # call ids of their own ...
    assert db_rows(db, "SELECT fqn, status FROM event_log WHERE phase = 'recompute' AND kind = 'enter' ORDER BY seq") == [
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
    assert db_rows(db, "SELECT count(*) FROM spans s WHERE phase = 'recompute' AND NOT EXISTS (SELECT 1 FROM spans f"
                       " WHERE f.phase = 'forward' AND f.call_id = s.call_id AND f.fqn = s.fqn)") == [(0,)]
    assert db_rows(db, "SELECT count(*) FROM spans WHERE phase = 'recompute'") == [(6,)]
    check = run_cli("check", "@", "--db", db, "--format", "json")
    assert check.code == 0 and not [r for r in json.loads(check.out) if r["severity"] != "info"], check



# --- module calls made during backward by code other than checkpoint -----------------

# True while the test's own backward code (a Project backward, a tensor hook) runs: the
# oracle's knowledge of who made a module call, from the program, not from modtrace.
_IN_BACKWARD_CODE = [False]


def _as_backward_code(module: nn.Module, grad: torch.Tensor) -> torch.Tensor:
    _IN_BACKWARD_CODE[0] = True
    try:
        out: torch.Tensor = module(grad)
        return out
    finally:
        _IN_BACKWARD_CODE[0] = False


class Project(torch.autograd.Function):
    """Identity forward; the backward sends the gradient through a module (a
    gradient projection)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, module: nn.Module) -> torch.Tensor:
        ctx.module = module
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _as_backward_code(ctx.module, grad), None


class Projected(nn.Module):
    """fc, its gradient projected by ``proj`` in backward (``proj`` also runs in
    forward when ``proj_in_forward``), then a block; fc to block are
    checkpointed when ``reentrant`` is not None.  A tensor hook on the output
    calls ``hooked`` in backward."""

    def __init__(self, proj_in_forward: bool, reentrant: bool | None = None) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.proj = nn.Linear(4, 4)
        self.block = Block()
        self.hooked = nn.Linear(4, 4)
        self.proj_in_forward = proj_in_forward
        self.reentrant = reentrant

    def inner(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(Project.apply(self.fc(x), self.proj))  # type: ignore[no-untyped-call]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.proj_in_forward:
            x = self.proj(x)
        h = self.inner(x) if self.reentrant is None else checkpoint(self.inner, x, use_reentrant=self.reentrant)
        h.register_hook(lambda grad: _as_backward_code(self.hooked, grad))
        return h


def _record_steps(model: nn.Module, db: str, run: str, steps: int = 2) -> list[tuple[str, str]]:
    """Record ``steps`` training steps of ``model``; returns the oracle: (fqn, phase) of
    every module call in order, as per-module torch pre-hooks see it (torch's graph task
    is -1 outside backward; inside, the test's backward code made the call, or else
    checkpoint did)."""
    calls: list[tuple[str, str]] = []
    names = {id(m): type(model).__name__ + (f".{n}" if n else "") for n, m in model.named_modules()}

    def pre(mod: nn.Module, args: Any) -> None:
        if torch._C._current_graph_task_id() == -1:
            phase = "forward"
        else:
            phase = "backward_call" if _IN_BACKWARD_CODE[0] else "recompute"
        calls.append((names[id(mod)], phase))

    handles = [m.register_forward_pre_hook(pre) for m in model.modules()]
    try:
        with modtrace.Recorder(db=db, run=run):
            for _ in range(steps):
                model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    finally:
        for h in handles:
            h.remove()
    return calls


def _calls(db: str) -> list[tuple[str, str]]:
    """(fqn, phase) of every recorded module call but backward, in enter order."""
    return [(f, p) for f, p in db_rows(db, "SELECT fqn, phase FROM event_log WHERE kind = 'enter' AND phase <> 'backward'"
                                           " ORDER BY seq")]


@pytest.mark.parametrize("proj_in_forward", [False, True], ids=["only_in_backward", "also_in_forward"])
def test_a_module_called_by_backward_code_is_a_backward_call_of_its_own(
        proj_in_forward: bool, db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = Projected(proj_in_forward)
    db = str(db_path)
    oracle = _record_steps(model, db, "projected")
    assert ("Projected.proj", "backward_call") in oracle and ("Projected.hooked", "backward_call") in oracle
    assert _calls(db) == oracle
    # never linked to a forward call: call ids of their own, status ok
    forward_ids = {c for (c,) in db_rows(db, "SELECT call_id FROM spans WHERE phase = 'forward'")}
    own = db_rows(db, "SELECT fqn, call_id, status, graph_task FROM spans WHERE phase = 'backward_call' ORDER BY span_id")
    assert len(own) == 4 and len({c for _, c, _, _ in own}) == 4 and not {c for _, c, _, _ in own} & forward_ids
    assert {s for _, _, s, _ in own} == {"ok"} and None not in {t for _, _, _, t in own}
    assert db_rows(db, "SELECT DISTINCT status FROM event_log WHERE phase = 'backward_call'") == [("ok",)]
    rows = check_rows(run_cli, db)  # no error, no warning
    assert not [r for r in rows if r["phase"] in ("recompute", "backward_call")]
    tree = run_cli("tree", "@", "--db", db, "--format", "json")
    assert tree.code == 0, tree
    nodes = {(n["phase"], n["fqn"]) for n in _tree_nodes(json.loads(tree.out))}
    assert {("backward_call", "Projected.proj"), ("backward_call", "Projected.hooked")} <= nodes
    assert not {p for p, _ in nodes} & {"recompute"}
    only = run_cli("tree", "@", "--db", db, "--phase", "backward_call", "--format", "json")
    assert only.code == 0 and {n["phase"] for n in _tree_nodes(json.loads(only.out))} == {"backward_call"}


@pytest.mark.parametrize("reentrant", [False, True], ids=["non_reentrant", "reentrant"])
def test_checkpoint_recomputes_stay_linked_beside_backward_calls(
        reentrant: bool, db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = Projected(proj_in_forward=True, reentrant=reentrant)
    db = str(db_path)
    oracle = _record_steps(model, db, "checkpointed")
    assert {p for _, p in oracle} == {"forward", "recompute", "backward_call"}
    recorded = _calls(db)
    # the oracle's recomputes run to the end; a non-reentrant recompute may stop early
    assert [c for c in recorded if c[1] != "recompute"] == [c for c in oracle if c[1] != "recompute"]
    assert {c for c in recorded if c[1] == "recompute"} == {c for c in oracle if c[1] == "recompute"}
    assert db_rows(db, "SELECT count(*) FROM spans s WHERE phase = 'recompute' AND NOT EXISTS (SELECT 1 FROM spans f"
                       " WHERE f.phase = 'forward' AND f.call_id = s.call_id AND f.fqn = s.fqn)") == [(0,)]
    assert db_rows(db, "SELECT count(*) FROM spans s WHERE phase = 'backward_call' AND EXISTS (SELECT 1 FROM spans f"
                       " WHERE f.phase = 'forward' AND f.call_id = s.call_id)") == [(0,)]
    check_rows(run_cli, db)


def _tree_nodes(nodes: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for node in nodes:
        yield node
        yield from _tree_nodes(node.get("children", []))


@pytest.mark.parametrize("impl", ["NO_REENTRANT", "REENTRANT"])
def test_checkpoint_wrapper_recomputes_are_linked(impl: str, db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    """torch's checkpoint_wrapper (what Lightning's and FSDP's activation checkpointing wrap
    blocks in) recomputes through torch.utils.checkpoint: linked recomputes, no backward_call."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        checkpoint_wrapper,
    )

    torch.manual_seed(0)
    model = nn.Sequential(checkpoint_wrapper(Block(), checkpoint_impl=CheckpointImpl[impl]), nn.Linear(4, 1))
    db = str(db_path)
    with modtrace.Recorder(db=db, run="wrapped"):
        for _ in range(2):
            model(torch.randn(2, 4, requires_grad=True)).sum().backward()
    recomputed = db_rows(db, "SELECT fqn, count(*) FROM spans WHERE phase = 'recompute' GROUP BY fqn ORDER BY fqn")
    # the wrapper checkpoints the module it wraps: that module and its submodule run again
    assert recomputed == [("Sequential.0._checkpoint_wrapped_module", 2), ("Sequential.0._checkpoint_wrapped_module.fc", 2)]
    assert db_rows(db, "SELECT count(*) FROM spans s WHERE phase = 'recompute' AND NOT EXISTS (SELECT 1 FROM spans f"
                       " WHERE f.phase = 'forward' AND f.call_id = s.call_id AND f.fqn = s.fqn)") == [(0,)]
    assert db_rows(db, "SELECT count(*) FROM events WHERE phase = 3") == [(0,)]
    check_rows(run_cli, db)


def test_the_torch_internals_that_tell_recompute_apart_are_found(recwarn: pytest.WarningsRecorder) -> None:
    """The private torch names modtrace.tracking.recompute reads exist on the tested torch
    (pinned by constraints.txt); on another, a missing one is a warning, not a failure."""
    assert torch.__version__.startswith(TESTED_TORCH + ".")
    codes = backward_codes()
    assert codes is not None and sorted(codes.values()) == [False, False, False, True, True]
    assert not [w for w in recwarn if "modtrace" in str(w.message)]


def test_backward_calls_count_as_backward_in_the_step_time(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    """forward + backward + recompute = step time still holds with backward calls (in
    step_table and in the step_breakdown query): their self time is backward's."""
    from modtrace.analysis.step_time import step_table

    torch.manual_seed(0)
    model = Projected(proj_in_forward=False, reentrant=False)
    db = str(db_path)
    clock = itertools.count(0, 7)
    with modtrace.Recorder(db=db, run="steps", clock=lambda: next(clock)) as rec:
        for _ in range(2):
            model(torch.randn(2, 4, requires_grad=True)).sum().backward()
            rec.step()
    rec.wait_analyzed()
    with modtrace.open(db) as database:
        spans = database.spans("steps")
    assert spans.filter(pl.col("phase") == "backward_call")["self_ns"].min() > 0
    steps = step_table(spans)
    assert steps.height == 2
    assert (steps["forward_ns"] + steps["backward_ns"] + steps["recompute_ns"]).to_list() == steps["step_ns"].to_list()
    sql = run_cli("query", "step_breakdown", "--run", "steps", "--format", "json")
    assert sql.code == 0, sql
    rows = json.loads(sql.out)
    for phase in ("forward", "backward", "recompute"):
        assert [round(r[f"{phase}_ms"] * 1e6) for r in rows] == steps[f"{phase}_ns"].to_list()
