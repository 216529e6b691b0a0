"""Work counters per module call: FLOPs equal torch's own FlopCounterMode's where its
attribution is right, and are charged to the right call and phase where it cannot tell
(a module borrowed from a plain list, checkpoint recomputation); counting runs on the
chosen steps only."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.flop_counter import FlopCounterMode

import modtrace
from tests.helpers.database import db_rows
from tests.helpers.training import record_training


def _flop_counter(model: nn.Module, x: torch.Tensor) -> dict[str, int]:
    """torch's own per-module FLOPs of one forward and backward (inclusive, every phase)."""
    with FlopCounterMode(display=False) as counter:
        model(x).sum().backward()
    model.zero_grad()
    return {name: sum(counts.values()) for name, counts in counter.get_flop_counts().items()}


def _per_module(db: str, run: str, step: int = 0) -> dict[str, int]:
    """Each module's inclusive FLOPs summed over its spans of ``step``, every phase."""
    rows = db_rows(db, "SELECT s.fqn, SUM(s.flops) FROM spans s JOIN runs r ON r.id = s.run_id "
                       "WHERE r.name = :run AND s.step = :step GROUP BY s.fqn", run=run, step=step)
    return {fqn: int(flops) for fqn, flops in rows}


def _linear(batch: int, n_in: int, n_out: int) -> int:
    return 2 * batch * n_in * n_out


def test_per_module_flops_equal_flop_counter_modes_on_a_sequential_stack(any_db: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Sequential(nn.Linear(32, 32), nn.GELU()), nn.Linear(32, 4))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(8, 16)
    with modtrace.Recorder(db=any_db, run="seq", writer="inline"):
        for _ in range(2):
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
    expected = _flop_counter(model, x)
    ours = _per_module(any_db, "seq")
    assert expected.pop("Global") == ours["Sequential"]
    assert {fqn: flops for fqn, flops in ours.items() if flops} == expected
    assert ours["Sequential.1"] == 0  # ReLU: known to do no matrix work, so 0 and not unknown
    assert db_rows(any_db, "SELECT SUM(unknown_ops) FROM spans WHERE step = 0") == [(0,)]
    # self counts partition the root's
    assert db_rows(any_db, "SELECT SUM(flops_self), SUM(ops_self), SUM(bytes_self) FROM spans WHERE step = 0") == \
        db_rows(any_db, "SELECT SUM(flops), SUM(ops), SUM(bytes) FROM spans WHERE step = 0 AND depth = 0")
    # the first step of its kind only: step 1 has the same shapes
    assert db_rows(any_db, "SELECT COUNT(*), COUNT(ops) FROM spans WHERE step = 1")[0][1] == 0
    assert db_rows(any_db, "SELECT counters FROM runs") == [("first",)]


class Borrows(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self._borrowed = [nn.Linear(4, 3)]  # not registered: no module path leads to it

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._borrowed[0](self.inner(x))


def test_a_module_borrowed_from_a_list_is_charged_to_its_own_calls_and_its_callers(db_path: Path) -> None:
    torch.manual_seed(0)
    model = Borrows()
    x = torch.randn(2, 4, requires_grad=True)
    with modtrace.Recorder(db=str(db_path), run="borrow", writer="inline"):
        model(x).sum().backward()
    db = str(db_path)
    rows = {(fqn, phase): (flops, flops_self, parent) for fqn, phase, flops, flops_self, parent in db_rows(
        db, "SELECT s.fqn, s.phase, s.flops, s.flops_self, p.fqn FROM spans s "
            "LEFT JOIN spans p ON p.run_id = s.run_id AND p.rank = s.rank AND p.span_id = s.parent_span_id")}
    inner, borrowed = _linear(2, 4, 4), _linear(2, 4, 3)
    # forward: the matmul; backward: the input's and the weight's gradients
    assert rows["Linear", "forward"] == (borrowed, borrowed, "Borrows")
    assert rows["Linear", "backward"] == (2 * borrowed, 2 * borrowed, "Borrows")
    assert rows["Borrows.inner", "backward"] == (2 * inner, 2 * inner, "Borrows")
    assert rows["Borrows", "forward"] == (inner + borrowed, 0, None)
    assert rows["Borrows", "backward"] == (2 * (inner + borrowed), 0, None)
    expected = _flop_counter(model, x)
    assert expected["Borrows"] == rows["Borrows", "forward"][0] + rows["Borrows", "backward"][0]


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class Checkpointed(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=self.reentrant)
        return x


@pytest.mark.parametrize("reentrant", [False, True])
def test_checkpointed_blocks_charge_their_recompute_to_recompute(db_path: Path, reentrant: bool) -> None:
    torch.manual_seed(0)
    model = Checkpointed(reentrant)
    x = torch.randn(2, 8, requires_grad=True)
    with modtrace.Recorder(db=str(db_path), run="ckpt", writer="inline"):
        model(x).sum().backward()
    db = str(db_path)
    by_phase: dict[tuple[str, str], int] = {
        (fqn, phase): int(flops) for fqn, phase, flops in db_rows(db, "SELECT fqn, phase, SUM(flops) FROM spans GROUP BY fqn, phase")}
    fc = _linear(2, 8, 8)
    for i in (0, 1):
        block = f"Checkpointed.blocks.{i}"
        assert by_phase[block, "forward"] == fc
        assert by_phase[block, "recompute"] == fc  # the forward run again during backward
        # the gradients' matmuls, and the recompute when it runs inside the block's backward span
        # (reentrant checkpoint recomputes first, then runs the block's backward in a graph task
        # of its own: a root span of its own, as the tracker records it)
        assert by_phase[block, "backward"] == 2 * fc + (0 if reentrant else fc)
        assert by_phase[f"{block}.fc", "backward"] == 2 * fc
        for phase in ("forward", "recompute", "backward"):
            assert by_phase[block, phase] >= by_phase[f"{block}.fc", phase]  # the child inside its parent
    # torch's counter charges the recompute to the forward: the same total, split by phase here
    expected = _flop_counter(model, x)
    assert expected["Global"] == db_rows(db, "SELECT SUM(flops) FROM spans WHERE depth = 0")[0][0]
    for i in (0, 1):
        block = f"Checkpointed.blocks.{i}"
        if not reentrant:
            assert expected[block] == by_phase[block, "forward"] + by_phase[block, "backward"]
        else:  # where it is wrong: a block's count below its own Linear's (the backward in another graph task)
            assert expected[block] < expected[f"{block}.fc"]


class Spectral(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.fft.rfft(self.fc(x)).abs()


def test_an_op_with_no_formula_counts_as_unknown_and_makes_the_flops_a_lower_bound(db_path: Path) -> None:
    model = Spectral()
    with modtrace.Recorder(db=str(db_path), run="fft", writer="inline"), torch.no_grad():
        model(torch.randn(2, 8))
    rows = db_rows(str(db_path), "SELECT fqn, flops, flops_self, unknown_ops, unknown_ops_self FROM spans ORDER BY span_id")
    assert rows == [("Spectral", _linear(2, 8, 8), 0, 1, 1), ("Spectral.fc", _linear(2, 8, 8), _linear(2, 8, 8), 0, 0)]


def _counted(db: str, run: str, step_rule: str = "recorded") -> list[int]:
    sql = ("SELECT DISTINCT s.step FROM spans s JOIN runs r ON r.id = s.run_id WHERE r.name = :run AND s.ops IS NOT NULL"
           if step_rule == "recorded" else
           "SELECT DISTINCT st.step FROM spans s JOIN runs r ON r.id = s.run_id JOIN span_steps st ON st.run_id = s.run_id "
           "AND st.rank = s.rank AND st.span_id = s.span_id WHERE r.name = :run AND s.ops IS NOT NULL")
    return sorted(step for (step,) in db_rows(db, sql, run=run))


def _two_kinds(step: int) -> torch.Tensor:
    """Two step kinds: batches of 4, then of 6."""
    return torch.randn(4 if step < 2 else 6, 8)


def test_counters_first_counts_the_first_step_of_each_kind_every_step_all_off_none(db_path: Path) -> None:
    db = str(db_path)
    record_training(db, "first", 4, inputs=_two_kinds, wait=False, writer="inline", counters="first")
    record_training(db, "every", 4, inputs=_two_kinds, wait=False, writer="inline", counters="every-step")
    record_training(db, "off", 4, inputs=_two_kinds, wait=False, writer="inline", counters="off")
    assert _counted(db, "first") == [0, 2]
    assert _counted(db, "every") == [0, 1, 2, 3]
    assert _counted(db, "off") == []
    assert db_rows(db, "SELECT name, counters FROM runs ORDER BY id") == [("first", "first"), ("every", "every-step"),
                                                                          ("off", "off")]
    # the same shapes, the same work: exactly
    every = db_rows(db, "SELECT s.step, s.fqn, s.phase, s.flops, s.bytes, s.ops FROM spans s JOIN runs r ON r.id = s.run_id "
                        "WHERE r.name = 'every' ORDER BY s.span_id")
    per_step: dict[int, list[Any]] = {}
    for step, *rest in every:
        per_step.setdefault(step, []).append(tuple(rest))
    assert per_step[0] == per_step[1] and per_step[2] == per_step[3] and per_step[0] != per_step[2]
    first = db_rows(db, "SELECT s.step, s.fqn, s.phase, s.flops, s.bytes, s.ops FROM spans s JOIN runs r ON r.id = s.run_id "
                        "WHERE r.name = 'first' AND s.ops IS NOT NULL ORDER BY s.span_id")
    assert [tuple(r[1:]) for r in first] == per_step[0] + per_step[2]


def test_root_call_steps_count_the_first_call_of_each_input_shape(db_path: Path) -> None:
    db = str(db_path)
    model = nn.Linear(4, 4)
    with modtrace.Recorder(db=db, run="serve", writer="inline", step_on="root"), torch.no_grad():
        for batch in (1, 1, 3, 1, 3):
            model(torch.randn(batch, 4))
    assert _counted(db, "serve", step_rule="root") == [0, 2]
    assert db_rows(db, "SELECT flops FROM spans WHERE ops IS NOT NULL ORDER BY span_id") == [(_linear(1, 4, 4),),
                                                                                             (_linear(3, 4, 4),)]


def test_a_schedules_warmup_steps_are_not_counted(db_path: Path) -> None:
    db = str(db_path)
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with modtrace.Recorder(db=db, run="sched", writer="inline", schedule="warmup=1,active=2,repeat=1"):
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
    assert _counted(db, "sched") == [1]


SCRIPT = textwrap.dedent(
    """
    import torch
    from torch import nn
    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
    """
)


def test_record_counters_option(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    db = str(tmp_path / "trace.db")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}

    def record(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "modtrace", "record", "--db", db, "-q", *args, str(script)],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    out = record("--run", "all", "--counters", "every-step")
    assert out.returncode == 0, out.stderr[-3000:]
    assert _counted(db, "all") == [0, 1, 2]
    bad = record("--run", "bad", "--counters", "sometimes")
    assert bad.returncode == 2
    assert "Traceback" not in bad.stderr and "sometimes" in bad.stderr
    assert db_rows(db, "SELECT name FROM runs") == [("all",)]


def test_recorder_refuses_an_unknown_counters_policy(db_path: Path) -> None:
    with pytest.raises(ValueError, match="counters must be one of first, every-step, off"):
        modtrace.Recorder(db=str(db_path), counters="sometimes")


def test_steps_not_counted_run_with_no_dispatch_mode_and_counted_ones_with_one(db_path: Path) -> None:
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    model = nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []

    def look(mod: nn.Module, args: Any) -> None:
        seen.append(len(_get_current_dispatch_mode_stack()))

    handle = model.register_forward_pre_hook(look)
    try:
        with modtrace.Recorder(db=str(db_path), run="modes", writer="inline"):
            for batch in (2, 2, 2, 5, 5):
                model(torch.randn(batch, 4)).sum().backward()
                opt.step()
    finally:
        handle.remove()
    assert seen == [1, 0, 0, 1, 0]  # the first step of each kind only
    assert len(_get_current_dispatch_mode_stack()) == 0  # nothing left pushed after the recording


class Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.block = nn.Sequential(nn.Linear(8, 8), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(self.embed(x))


def test_a_compiled_region_compiles_on_a_counted_step_and_its_work_goes_to_the_compiled_module(db_path: Path) -> None:
    torch.manual_seed(0)
    model = Twice()
    model.block = torch.compile(model.block, backend="eager")  # type: ignore[assignment]
    with modtrace.Recorder(db=str(db_path), run="compiled", writer="inline", counters="every-step"), \
            pytest.warns(UserWarning, match="global hooks"):
        for _ in range(2):
            model(torch.randn(2, 4)).sum().backward()
    db = str(db_path)
    # compiled as without counters: the block's insides never recorded as calls
    assert {f for (f,) in db_rows(db, "SELECT DISTINCT fqn FROM spans")} == {"Twice", "Twice.embed", "Twice.block"}
    assert db_rows(db, "SELECT compiled FROM modules WHERE fqn = 'Twice.block'") == [(1,)]
    rows = db_rows(db, "SELECT fqn, SUM(flops_self) FROM spans WHERE phase = 'forward' GROUP BY fqn ORDER BY fqn")
    # the compiled region's ops at run time are counted, charged to the compiled module (its
    # inner modules make no calls): two steps of its Linear's matmul
    assert rows == [("Twice", 0), ("Twice.block", 2 * _linear(2, 8, 8)), ("Twice.embed", 2 * _linear(2, 4, 8))]
