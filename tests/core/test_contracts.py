"""One definition of every row and frame: the tracker, the writer, the schema,
the readers and the analysis all follow ``modtrace.core.contracts``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import torch
from sqlalchemy import BigInteger, Integer, SmallInteger, String, Text
from torch import nn
from torch.utils.checkpoint import checkpoint

from modtrace.analysis import analyze_events
from modtrace.analysis.events import (
    DEVICE_SCHEMA,
    EVENT_SCHEMA,
    MODULE_SCHEMA,
    PHASE_ENUM,
    STATUS_ENUM,
)
from modtrace.analysis.nesting import ISSUE_SCHEMA
from modtrace.analysis.spans import SPAN_ROW_SCHEMA
from modtrace.core import contracts
from modtrace.core.codes import Kind, Phase, Status
from modtrace.core.contracts import (
    CALL_FRAME,
    DEVICE_FRAME,
    DEVICE_ROW,
    EVENT_FRAME,
    EVENT_ROW,
    ISSUE_FRAME,
    ISSUE_ROW,
    MODULE_FRAME,
    MODULE_ROW,
    ROOT_FRAME,
    ROOT_ROW,
    SPAN_FRAME,
    SPAN_ROW,
    THREAD_ROW,
    Batch,
)
from modtrace.store import schema
from modtrace.store.engine import open_store
from modtrace.store.reader import read_devices, read_events, read_modules
from modtrace.store.runs import add_rank, create_run, finish_rank
from modtrace.store.writer import (
    DEVICE_COLUMNS,
    EVENT_COLUMNS,
    MODULE_COLUMNS,
    ROOT_COLUMNS,
    THREAD_COLUMNS,
    RankWriter,
)
from modtrace.tracking.tracker import Tracker

_SQL_TYPES = {"Int8": SmallInteger, "Int32": Integer, "Int64": BigInteger, "String": (String, Text)}


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.lin(x))


class _Project(torch.autograd.Function):
    """Identity forward; its backward calls a module (a backward_call)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, module: nn.Module) -> torch.Tensor:
        ctx.module = module
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return ctx.module(grad), None


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = _Block()
        self.b = _Block()
        self.proj = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(_Project.apply(checkpoint(self.a, x, use_reentrant=False), self.proj))


def _track() -> tuple[Tracker, list[tuple[Any, ...]]]:
    rows: list[tuple[Any, ...]] = []
    tracker = Tracker(rows.append)
    tracker.start()
    try:
        torch.manual_seed(0)
        net = _Net()
        net(torch.randn(2, 4, requires_grad=True)).sum().backward()
    finally:
        tracker.stop()
    return tracker, rows


def test_tracker_builds_event_tuples_in_the_event_row_order() -> None:
    tracker, rows = _track()
    phases = set()
    assert rows
    for row in rows:
        assert len(row) == len(EVENT_ROW.names)
        ev = dict(zip(EVENT_ROW.names, row, strict=True))
        assert ev["kind"] in {int(k) for k in Kind}
        assert ev["phase"] in {int(p) for p in Phase}
        assert ev["status"] in {int(s) for s in Status}
        assert ev["tie"] in (0, 1)
        assert 0 <= ev["module_id"] < len(tracker.fqns)
        assert ev["thread_id"] == 0 and ev["step"] == 0
        # graph_task is set exactly outside forward: the one field that tells phase and task apart
        assert (ev["graph_task"] is None) == (ev["phase"] == Phase.FORWARD)
        assert isinstance(ev["ts_ns"], int) and ev["ts_ns"] >= 0
        phases.add(Phase(ev["phase"]))
    assert phases == set(Phase)
    seqs = [r[EVENT_ROW.index("seq")] for r in rows]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert all(len(m) == len(MODULE_ROW.names) and isinstance(m[1], str) for m in tracker.new_modules)
    assert all(len(t) == len(THREAD_ROW.names) and isinstance(t[1], int) for t in tracker.new_threads)
    assert all(len(d) == len(DEVICE_ROW.names) and d[1] == "cpu" for d in tracker.new_devices)


def _columns(table: Any) -> tuple[str, ...]:
    return tuple(c.name for c in table.columns)


def test_writer_and_schema_follow_the_contracts() -> None:
    assert (EVENT_COLUMNS, MODULE_COLUMNS, THREAD_COLUMNS, DEVICE_COLUMNS, ROOT_COLUMNS) == (
        EVENT_ROW.names, MODULE_ROW.names, THREAD_ROW.names, DEVICE_ROW.names, ROOT_ROW.names,
    )
    tables = {
        schema.events: EVENT_FRAME, schema.modules: MODULE_ROW.prefixed("", ("run_id", "Int32"), ("rank", "Int32")),
        schema.threads: THREAD_ROW.prefixed("", ("run_id", "Int32"), ("rank", "Int32")),
        schema.devices: DEVICE_ROW.prefixed("", ("run_id", "Int32"), ("rank", "Int32")),
        schema.span_rows: contracts.SPAN_STORED_ROW, schema.nesting_issues: ISSUE_ROW,
        schema.root_calls: ROOT_ROW.prefixed("", ("run_id", "Int32"), ("rank", "Int32")),
    }
    for table, contract in tables.items():
        assert _columns(table) == contract.names, table.name
        for column in table.columns:
            assert isinstance(column.type, _SQL_TYPES[contract.dtype(column.name)]), (table.name, column.name)
    for kind in contracts.ISSUE_KINDS:
        assert kind in str(schema.nesting_issues.c.kind.comment)
    for rule in contracts.STEP_RULES:
        assert f"{rule} (" in str(schema.runs.c.step_on.comment)


def test_root_calls_and_step_rules_follow_the_contracts() -> None:
    from modtrace.analysis.steps import ROOT_SCHEMA
    from modtrace.core import step_rules

    tracker, _ = _track()
    assert tracker.new_roots, "the net's call is a root call"
    for root in tracker.new_roots:
        assert len(root) == len(ROOT_ROW.names)
        row = dict(zip(ROOT_ROW.names, root, strict=True))
        assert isinstance(row["seq"], int) and isinstance(row["call_id"], int)
        assert row["kind"] == "x=2x4"
    assert ROOT_SCHEMA == ROOT_FRAME.polars()
    # the frame adds the rank and the thread (read from the call's enter event) and drops the call id
    assert ROOT_FRAME.names == ("rank", "seq", "thread_id", "kind")
    assert set(ROOT_ROW.names) - {"call_id"} <= set(ROOT_FRAME.names)
    assert step_rules.STEP_RULES is contracts.STEP_RULES


def test_analysis_frames_are_the_contracts() -> None:
    assert EVENT_SCHEMA == EVENT_FRAME.polars()
    assert MODULE_SCHEMA == MODULE_FRAME.polars()
    assert DEVICE_SCHEMA == DEVICE_FRAME.polars()
    assert SPAN_ROW_SCHEMA == SPAN_ROW.polars()
    assert ISSUE_SCHEMA == ISSUE_FRAME.polars()
    assert list(PHASE_ENUM.categories) == list(contracts.PHASES) == [p.name.lower() for p in Phase]
    assert list(STATUS_ENUM.categories) == list(contracts.STATUSES)
    from modtrace.analysis.diff import CALL_SCHEMA

    assert CALL_SCHEMA == CALL_FRAME.polars()


def test_a_tracked_run_goes_through_writer_reader_and_analysis_in_contract_form(tmp_path: Path) -> None:
    tracker, rows = _track()
    store = open_store(str(tmp_path / "c.db"), create=True)
    try:
        run_id, _ = create_run(store, "contracts", {})
        add_rank(store, run_id, 0, 0)
        RankWriter(store, run_id, 0).write(Batch(rows, tracker.new_modules, tracker.new_threads, tracker.new_devices))
        finish_rank(store, run_id, 0, "completed")
        events = read_events(store, run_id)
        modules = read_modules(store, run_id)
        devices = read_devices(store, run_id)
    finally:
        store.dispose()
    assert events.schema == pl.Schema(EVENT_FRAME.polars())
    assert events.select(EVENT_ROW.names).rows() == rows
    assert modules.schema == pl.Schema(MODULE_FRAME.polars())
    result = analyze_events(events, modules, devices)
    assert result.spans.schema == pl.Schema(SPAN_FRAME.polars())
    assert result.issues.schema == pl.Schema(ISSUE_FRAME.polars())
    from modtrace.analysis.nesting import summarize_issues

    assert summarize_issues(result.issues).schema == pl.Schema(contracts.ISSUE_SUMMARY_FRAME.polars())
    assert result.spans.height * 2 == len(rows)
    assert result.issues.filter(pl.col("severity") != "info").height == 0
