"""Steps of serving loops and inference runs (issue 25 point 2, issue 27 point 4).

Root calls are the outermost module calls of every thread, so a thread pool
serving requests gets a step per request; the step time of root calls that
ran at once is the union of their intervals; and every command, the shipped
queries and the ``steps`` view count the steps ``runs`` counts.  Real
threads, real models on CPU, real SQLite files and the real PostgreSQL
server; the oracle for times is torch's own forward hooks.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import sqlalchemy as sa
import torch
from torch import nn

import modtrace
from modtrace.analysis.step_time import STEP_COLUMNS, step_table
from modtrace.store.engine import open_store
from tests.helpers.training import record_training

RunCli = Callable[..., Any]


def _stepped(db: str, run: str) -> pl.DataFrame:
    """The run's spans with their steps under its own rule (as tree and diff assign them)."""
    from modtrace.api._cli import restep

    with modtrace.open(db) as database:
        return restep(database, run, database.spans(run), None).frame


def _serve(db: str, run: str, requests: int = 4) -> nn.Module:
    """The issue's reproduction: a pool of two worker threads serving requests under inference_mode."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 2)).eval()

    def serve(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            return m(x)

    with modtrace.Recorder(db=db, run=run, analyze=False, handle_sigterm=False):
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(serve, [torch.randn(1, 8) for _ in range(requests)]))
    return m


class _Meet(nn.Module):
    """Two requests meet inside the model (a barrier), then each works for a while: their calls overlap."""

    def __init__(self, barrier: threading.Barrier, seconds: float) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.barrier, self.seconds = barrier, seconds

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.barrier.wait(timeout=30)
        time.sleep(self.seconds)
        return self.lin(x)


def _overlapping(db: str, run: str, step_on: str) -> list[tuple[int, int]]:
    """Two threads whose root calls overlap; the calls' (start, end) perf_counter_ns as torch's own
    forward hooks on the model saw them (the oracle)."""
    model = _Meet(threading.Barrier(2), 0.05)
    seen: dict[int, int] = {}
    intervals: list[tuple[int, int]] = []
    lock = threading.Lock()

    def pre(mod: nn.Module, args: Any) -> None:
        seen[threading.get_ident()] = time.perf_counter_ns()

    def post(mod: nn.Module, args: Any, out: Any) -> None:
        end = time.perf_counter_ns()
        with lock:
            intervals.append((seen[threading.get_ident()], end))

    model.register_forward_pre_hook(pre)
    model.register_forward_hook(post)

    def serve(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            out: torch.Tensor = model(x)
            return out

    with modtrace.Recorder(db=db, run=run, step_on=step_on, analyze=False, handle_sigterm=False):
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(serve, [torch.randn(1, 4) for _ in range(2)]))
    assert len(intervals) == 2
    return sorted(intervals)


def _union(intervals: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for start, end in sorted(intervals):
        if reach is None or start >= reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def _query(run_cli: RunCli, db: str, name: str, run: str) -> list[dict[str, Any]]:
    res = run_cli("query", name, "--run", run, "--db", db, "--format", "json")
    assert res.code == 0, res.err
    rows: list[dict[str, Any]] = json.loads(res.out)
    return rows


def _runs(run_cli: RunCli, db: str) -> dict[str, dict[str, Any]]:
    res = run_cli("runs", "--db", db, "--format", "json")
    assert res.code == 0, res.err
    return {r["name"]: r for r in json.loads(res.out)}


def _view(db: str, relation: str, run: str) -> list[dict[str, Any]]:
    store = open_store(db)
    try:
        with store.engine.connect() as conn:
            rid = conn.execute(sa.text("SELECT id FROM runs WHERE name = :n"), {"n": run}).scalar()
            rows = conn.execute(sa.text(f"SELECT * FROM {relation} WHERE run_id = :r ORDER BY rank, step"), {"r": rid})
            return [dict(r._mapping) for r in rows]
    finally:
        store.dispose()


@pytest.fixture
def analysed(any_db: str, run_cli: RunCli) -> Iterator[Callable[[str], None]]:
    def analyse(run: str) -> None:
        res = run_cli("analyze", run, "--db", any_db)
        assert res.code == 0, res.err

    yield analyse


def test_a_thread_pool_serving_requests_gets_one_step_per_request(
        any_db: str, run_cli: RunCli, analysed: Callable[[str], None], tmp_path: Path) -> None:
    _serve(any_db, "serve", requests=4)
    _serve(any_db, "serve2", requests=4)
    analysed("serve")
    analysed("serve2")
    runs = _runs(run_cli, any_db)
    assert runs["serve"]["steps"] == 4
    assert runs["serve"]["step_on"] == "auto: root"
    # every request's calls are one step each, whichever thread ran it
    stepped = _stepped(any_db, "serve")
    assert stepped["step"].unique().sort().to_list() == [0, 1, 2, 3]
    per_step = stepped.group_by("step").agg(pl.col("thread_id").n_unique().alias("threads"), pl.len().alias("n"))
    assert per_step["threads"].to_list() == [1] * 4 and per_step["n"].to_list() == [4] * 4

    tree = run_cli("tree", "serve", "--db", any_db, "--format", "json")
    assert tree.code == 0, tree.err
    report = run_cli("report", "serve", "--db", any_db, "-o", str(tmp_path / "serve.html"))
    assert report.code == 0, report.err
    assert (tmp_path / "serve.html").stat().st_size > 0
    diff = run_cli("diff", "serve", "serve2", "--db", any_db, "--format", "json")
    assert diff.code == 0, diff.err
    assert len(_query(run_cli, any_db, "step_breakdown", "serve")) == 4


def test_overlapping_root_calls_count_their_union(any_db: str, run_cli: RunCli, analysed: Callable[[str], None]) -> None:
    # one step holding both requests (manual: no Recorder.step()), and a step per request (auto)
    oracle = {"together": _overlapping(any_db, "together", "manual"), "apart": _overlapping(any_db, "apart", "auto")}
    tolerance = 5_000_000  # the hooks' own time around the oracle's, far below the 50 ms overlap
    for run, intervals in oracle.items():
        analysed(run)
        (a_start, a_end), (b_start, b_end) = intervals
        assert min(a_end, b_end) - max(a_start, b_start) > 30_000_000, "the two calls overlapped"
        rows = _query(run_cli, any_db, "step_breakdown", run)
        for row in rows:
            assert row["outside_ms"] >= 0 and row["module_pct"] <= 100 + 1e-9, row
        if run == "together":
            assert len(rows) == 1
            assert abs(rows[0]["step_ms"] * 1e6 - _union(intervals)) < tolerance
            summed = sum(e - s for s, e in intervals)
            assert summed - rows[0]["step_ms"] * 1e6 > 30_000_000, "the overlap counts once"
        else:
            assert len(rows) == 2
            for row, (start, end) in zip(rows, intervals, strict=True):
                assert abs(row["step_ms"] * 1e6 - (end - start)) < tolerance
                # a request still running when the next one started ends at its own end
                assert row["wall_ms"] * 1e6 >= end - start - tolerance
        # the polars step table says the same
        table = step_table(_stepped(any_db, run))
        assert [int(t) for t in table["step_ns"]] == [_view_row["step_ns"] for _view_row in _view(any_db, "steps", run)]


def _infer(db: str, run: str, calls: int) -> None:
    """An eval loop of ``calls`` model calls; a submodule raises (caught) in each, an info issue per call."""

    class Flaky(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            raise ValueError("no")

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin, self.flaky = nn.Linear(4, 4), Flaky()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            try:
                self.flaky(x)
            except ValueError:
                pass
            out: torch.Tensor = self.lin(x)
            return out

    net = Net().eval()
    with modtrace.Recorder(db=db, run=run, analyze=False, handle_sigterm=False), torch.no_grad():
        for _ in range(calls):
            net(torch.randn(2, 4))


def test_check_and_the_step_queries_count_the_steps_runs_counts(
        any_db: str, run_cli: RunCli, analysed: Callable[[str], None]) -> None:
    _infer(any_db, "infer", 5)
    analysed("infer")
    assert _runs(run_cli, any_db)["infer"]["steps"] == 5
    assert [r["step"] for r in _query(run_cli, any_db, "step_breakdown", "infer")] == [0, 1, 2, 3, 4]
    assert {r["step_rule"] for r in _query(run_cli, any_db, "step_breakdown", "infer")} == {"root"}
    assert sorted(r["step"] for r in _query(run_cli, any_db, "slowest_steps", "infer")) == [0, 1, 2, 3, 4]
    assert sorted({r["step"] for r in _query(run_cli, any_db, "call_counts", "infer")}) == [0, 1, 2, 3, 4]
    check = run_cli("check", "infer", "--db", any_db)
    assert check.code == 0, check.err
    assert "5 times, steps 0 to 4" in check.out, check.out
    issues = json.loads(run_cli("check", "infer", "--db", any_db, "--format", "json").out)
    assert sorted({i["step"] for i in issues}) == [0, 1, 2, 3, 4]


def _nested() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Sequential(nn.Linear(8, 8), nn.Tanh()), nn.Linear(8, 1))


def test_the_steps_view_equals_the_polars_step_table(any_db: str, analysed: Callable[[str], None]) -> None:
    record_training(any_db, "train", 3, model=_nested, lr=1e-3, wait=False, analyze=False, handle_sigterm=False)
    _serve(any_db, "serve", requests=6)
    _infer(any_db, "infer", 3)
    for run, rule in (("train", "optimizer"), ("serve", "root"), ("infer", "root")):
        analysed(run)
        py = step_table(_stepped(any_db, run))
        rows = _view(any_db, "steps", run)
        assert {r["step_rule"] for r in rows} == {rule}
        sql = pl.DataFrame([[r[c] for c in STEP_COLUMNS] for r in rows], schema=py.schema, orient="row")
        assert sql.equals(py), (run, sql, py)
        # and span by span
        spans = _stepped(any_db, run).select("rank", "span_id", "step").sort("rank", "span_id")
        view = pl.DataFrame(_view(any_db, "span_steps", run)).select(
            pl.col("rank").cast(pl.Int32), pl.col("span_id").cast(pl.Int64), pl.col("step").cast(pl.Int32)
        ).sort("rank", "span_id")
        assert view.equals(spans.select(pl.col("rank").cast(pl.Int32), pl.col("span_id").cast(pl.Int64),
                                        pl.col("step").cast(pl.Int32))), run
