"""One step time (docs/schema.md, "Step time"): tree, diff, the HTML report and
queries/step_breakdown.sql agree on a real recording, through the real CLI."""

from __future__ import annotations

import itertools
import json
import re
import statistics
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch

import modtrace
from modtrace.analysis.step_time import step_table
from tests.helpers.models import Net

STEPS = 4


@pytest.fixture
def recorded(db_path: Path) -> Any:
    """A checkpointed model trained for a few steps (forward, backward with recompute, optimizer)."""
    torch.manual_seed(0)
    net = Net(blocks=3)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    clock = itertools.count(0, 7)
    with modtrace.Recorder(db=str(db_path), run="net", clock=lambda: next(clock), handle_sigterm=False) as _rec:
        for _ in range(STEPS):
            net(torch.randn(3, 4)).sum().backward()
            for _ in range(5):  # time outside module calls
                next(clock)
            opt.step()
            opt.zero_grad()
    _rec.wait_analyzed()  # the writer process analyses the run after the with
    with modtrace.open(str(db_path)) as db:
        assert db.runs().filter(pl.col("name") == "net")["analysis"].item() == "stored"
        return step_table(db.spans("net"))


def test_tree_diff_report_and_sql_agree_on_the_step_time(recorded: Any, db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    steps = recorded
    assert steps.height == STEPS
    step_ns = steps["step_ns"].to_list()
    assert all(n > 0 for n in step_ns)
    # self times partition the root spans: the phase split adds up to the step time
    assert (steps["forward_ns"] + steps["backward_ns"] + steps["recompute_ns"]).to_list() == step_ns
    assert all(r > 0 for r in steps["recompute_ns"].to_list())
    assert all(w > s for w, s in zip(steps["wall_ns"].to_list(), step_ns, strict=True))  # the optimizer's time

    sql = run_cli("query", "step_breakdown", "--run", "net", "--format", "json")
    assert sql.code == 0, sql
    rows = json.loads(sql.out)
    assert [round(r["step_ms"] * 1e6) for r in rows] == step_ns
    assert [round(r["wall_ms"] * 1e6) for r in rows] == steps["wall_ns"].to_list()
    for phase in ("forward", "backward", "recompute"):
        assert [round(r[f"{phase}_ms"] * 1e6) for r in rows] == steps[f"{phase}_ns"].to_list()

    tree = run_cli("tree", "net", "--format", "json")
    assert tree.code == 0, tree
    roots = json.loads(tree.out)
    assert sum(r["percent"] for r in roots) == pytest.approx(100.0)
    for root in roots:
        assert root["percent"] == pytest.approx(100.0 * root["inclusive_total_ns"] / sum(step_ns))

    diff = run_cli("diff", "net", "net", "--skip-steps", "0", "--format", "json")
    assert diff.code == 0, diff
    doc = json.loads(diff.out)
    assert doc["base"]["step_us"] == pytest.approx(statistics.median(step_ns) / 1000)
    shares = {(r["fqn"], r["phase"]): r["inclusive_share"]["base_pct"] for r in doc["timing"]}
    by_tree = {(r["fqn"], r["phase"]): r["percent"] for r in roots}
    for key, pct in by_tree.items():  # every step's time is the same here, so medians and totals agree
        assert shares[key] == pytest.approx(pct, abs=1e-3)

    report = run_cli("report", "net", "-o", str(db_path.parent / "report.html"), "-q")
    assert report.code == 0, report
    html = (db_path.parent / "report.html").read_text()
    m = re.search(r'<script type="application/json" id="modtrace-data">(.*?)</script>', html, re.S)
    assert m is not None
    data = json.loads(m.group(1))
    assert [s["step_ns"] for s in data["steps"]] == step_ns
    assert [s["wall_ns"] for s in data["steps"]] == steps["wall_ns"].to_list()
    for phase in ("forward", "backward", "recompute"):
        assert [s[f"{phase}_ns"] for s in data["steps"]] == steps[f"{phase}_ns"].to_list()
