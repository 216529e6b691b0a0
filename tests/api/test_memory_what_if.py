"""The checkpointing what-if against reality: a stack of MLP blocks recorded, the what-if asked
for some of its modules, then the same model recorded again with exactly those modules
checkpointed (non-reentrant): the predicted peak is within 10% of the measured one, as modtrace
(``step_memory``) and torch's MemTracker measure it.  The budget search likewise, on SQLite and
PostgreSQL.  (Predicted step time against measured: benchmarks/bench_memory_what_if.py; timing
on a loaded 2-core host is too noisy to assert here.)"""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch
from torch import nn

import modtrace
from tests.helpers.memory import (
    MlpStack,
    checkpointed,
    memtracker_peak,
    record_steps,
    step_memory_peak,
)

BATCH, WIDTH, BLOCKS = 256, 128, 6
BLOCK_NAMES = tuple(f"MlpStack.blocks.{i}" for i in range(BLOCKS))


# One input tensor for every step, so that MemTracker (told of it) and the recording see the same.
X = torch.randn(BATCH, WIDTH, generator=torch.Generator().manual_seed(1))


def _step(model: nn.Module, opt: torch.optim.Optimizer) -> None:
    model(X).square().mean().backward()
    opt.step()
    opt.zero_grad()


def _fresh(fqns: tuple[str, ...] = ()) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = checkpointed(MlpStack(WIDTH, BLOCKS), fqns)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def _record(db: str, run: str, fqns: tuple[str, ...] = ()) -> None:
    model, opt = _fresh(fqns)
    record_steps(db, run, model, opt, _step, 3)


def _measured(db: str, run: str, fqns: tuple[str, ...]) -> tuple[int, int]:
    model, opt = _fresh(fqns)
    return step_memory_peak(db, run), memtracker_peak(model, opt, _step, X)


def _close(predicted: int, measured: int, within: float = 0.10) -> bool:
    return abs(predicted / measured - 1) <= within


@pytest.mark.parametrize("patterns", [["blocks.*"], ["blocks.0", "blocks.1", "blocks.2"], ["*.fc1"]],
                         ids=["every-block", "first-three", "fc1"])
def test_predicted_peak_is_the_checkpointed_runs_peak(any_db: str, patterns: list[str]) -> None:
    _record(any_db, "plain")
    with modtrace.open(any_db) as db:
        plain = db.memory("plain")
        found = db.memory("plain", checkpoint=patterns).what_if
    assert found is not None and found.modules
    # Nothing checkpointed, the model replays the measured step: its peak is step_memory's.
    assert found.measured_peak_bytes == max(s.peak_bytes for s in plain.steps) == step_memory_peak(any_db, "plain")
    _record(any_db, "ckpt", found.modules)
    ours, torch_peak = _measured(any_db, "ckpt", found.modules)
    assert _close(found.peak_bytes, ours), (found, ours)
    assert _close(found.peak_bytes, torch_peak), (found, torch_peak)
    if patterns != ["*.fc1"]:  # checkpointing whole blocks frees most of what they keep
        assert found.peak_bytes < 0.9 * found.measured_peak_bytes


def test_budget_names_a_set_that_fits_when_recorded(any_db: str, run_cli: Any) -> None:
    _record(any_db, "plain")
    with modtrace.open(any_db) as db:
        every = db.memory("plain", checkpoint=["blocks.*"]).what_if
    assert every is not None
    budget = (every.peak_bytes + every.measured_peak_bytes) // 2
    out = run_cli("memory", "plain", "--db", any_db, "--budget", str(budget), "--format", "json")
    assert out.code == 0, out
    plan = json.loads(out.out)["budget"]
    assert plan["found"] and plan["search"] == "exact" and plan["peak_bytes"] <= budget
    assert 0 < len(plan["modules"]) < BLOCKS and set(plan["modules"]) <= set(BLOCK_NAMES) | {"MlpStack.head"}
    assert plan["added_ns"] > 0 and plan["step_ns"] > plan["added_ns"]
    chosen = tuple(plan["modules"])
    _record(any_db, "fits", chosen)
    ours, torch_peak = _measured(any_db, "fits", chosen)
    assert _close(plan["peak_bytes"], ours) and _close(plan["peak_bytes"], torch_peak), (plan, ours, torch_peak)
    assert ours <= budget * 1.10

    too_small = run_cli("memory", "plain", "--db", any_db, "--budget", "1MiB")
    assert too_small.code == 0, too_small
    assert "budget 1 MiB: no set of modules brings the predicted peak within it (exact search" in too_small.out


def test_checkpoint_what_if_on_the_command_line(any_db: str, run_cli: Any) -> None:
    _record(any_db, "plain")
    out = run_cli("memory", "plain", "--db", any_db, "--checkpoint", "blocks.*", "--format", "json")
    assert out.code == 0, out
    doc = json.loads(out.out)
    assert [s["step"] for s in doc["steps"]] == [0] and doc["steps"][0]["peak_bytes"] > 0
    w = doc["what_if"]
    assert w["checkpoint"] == ["blocks.*"] and tuple(w["modules"]) == BLOCK_NAMES
    assert w["step_ns"] == w["measured_step_ns"] + w["added_ns"] and w["added_ns"] > 0
    assert w["peak_bytes"] < w["measured_peak_bytes"]
    kept = {m["fqn"]: m for m in doc["modules"]}
    assert kept["MlpStack.blocks.0"]["freed_bytes"] > 0 and kept["MlpStack.blocks.0"]["backward"]
    table = run_cli("memory", "plain", "--db", any_db, "--checkpoint", "blocks.*")
    assert table.code == 0 and "what-if, checkpoint blocks.* (MlpStack.blocks.0," in table.out
    for fmt in ("csv", "markdown"):
        assert run_cli("memory", "plain", "--db", any_db, "--format", fmt).code == 0
    bad = run_cli("memory", "plain", "--db", any_db, "--checkpoint", "nothing.here")
    assert bad.code == 2 and bad.err.startswith("modtrace: error: --checkpoint 'nothing.here' matches no module")
    assert len(bad.err.strip().splitlines()) == 1


def test_a_run_without_counted_steps_says_to_record_with_counters(db_path: Any, run_cli: Any) -> None:
    model, opt = _fresh()
    with modtrace.Recorder(db=str(db_path), run="off", counters="off") as rec:
        _step(model, opt)
    rec.wait_analyzed()
    out = run_cli("memory", "off", "--db", str(db_path))
    assert out.code == 2 and "has no counted step with memory: record it with work counters on" in out.err
    assert "--counters first|every-step" in out.err


def test_every_counted_step_has_its_peak_and_the_what_if_takes_the_worst(db_path: Any) -> None:
    from tests.helpers.database import db_rows

    db = str(db_path)
    model, opt = _fresh()
    record_steps(db, "every", model, opt, _step, 3, counters="every-step")
    stored = dict(db_rows(db, "SELECT m.step, m.peak_bytes FROM step_memory m JOIN runs r ON r.id = m.run_id "
                              "WHERE r.name = 'every'"))
    with modtrace.open(db) as database:
        report = database.memory("every", checkpoint=["blocks.*"])
    assert {s.step: s.peak_bytes for s in report.steps} == stored and sorted(stored) == [0, 1, 2]
    assert report.timed_steps == 3  # every step counted: the times are theirs
    assert report.what_if is not None and report.what_if.measured_peak_bytes == max(stored.values())
