"""analyze, tree and check on runs recorded from real models, on SQLite and PostgreSQL."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

import modtrace
from modtrace.core.contracts import Batch
from modtrace.results.materialize import stored as read_analysis
from modtrace.store.engine import open_store
from modtrace.store.runs import add_rank, create_run, finish_rank
from modtrace.store.writer import RankWriter
from tests.helpers.analysis_streams import ENTER, EXIT, ev, model, to_rows
from tests.helpers.golden import GOLDEN, check_golden
from tests.helpers.models import Block, Net
from tests.helpers.recording import FakeClock
from tests.helpers.training import record_training


def record_net(db: str, run: str = "net", steps: int = 2, **kw: Any) -> None:
    """The Net (a checkpointed block: recompute) on a clock of 10 ns ticks."""
    record_training(db, run, steps, model=Net, inputs=(3, 4), lr=0.1, clock=FakeClock(10), **kw)


def test_recording_materialises_spans_and_issues(any_db: str) -> None:
    record_net(any_db)
    store = open_store(any_db)
    try:
        stored = read_analysis(store, 1)
        assert stored is not None
        spans, issues = stored.spans, stored.issues
        with store.engine.connect() as conn:
            view = conn.exec_driver_sql(
                "SELECT fqn, phase, status, depth, duration_ns, self_ns FROM spans WHERE step = 0 ORDER BY span_id"
            ).all()
            kinds = conn.exec_driver_sql(
                "SELECT kind, severity, COUNT(*) FROM nesting_issues GROUP BY kind, severity ORDER BY kind"
            ).all()
    finally:
        store.dispose()
    assert len(view) == 19
    assert view[0] == ("Net", "forward", "ok", 0, 150, 40)
    recompute = [r for r in view if r[1] == "recompute"]
    assert [r[0] for r in recompute] == ["Net.blocks.1", "Net.blocks.1.fc1", "Net.blocks.1.fc2"]
    assert [tuple(k) for k in kinds] == [("closed_at_end_of_backward", "info", 6), ("early_stop", "info", 4)]
    assert spans.height == 38 and issues.height == 10
    # The view shows what the frame holds.
    assert spans.filter(pl.col("step") == 0).select(
        pl.col("fqn").cast(pl.String), pl.col("phase").cast(pl.String), pl.col("status").cast(pl.String),
        "depth", "duration_ns", "self_ns",
    ).rows() == [tuple(r) for r in view]


def test_analyze_is_idempotent_and_check_reports_no_errors(any_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    record_net(any_db, analyze=False)
    store = open_store(any_db)
    try:
        assert read_analysis(store, 1) is None
    finally:
        store.dispose()
    first = run_cli("analyze", "net", "--db", any_db)
    assert first.code == 0
    assert first.out == "run net (id 1): 38 spans, 10 nesting issue(s): 0 error(s), 0 warning(s), 10 info\n"
    assert run_cli("analyze", "@", "--db", any_db).out == first.out
    store = open_store(any_db)
    try:
        with store.engine.connect() as conn:
            counts = conn.exec_driver_sql("SELECT (SELECT COUNT(*) FROM span_rows), (SELECT COUNT(*) FROM nesting_issues)").one()
    finally:
        store.dispose()
    assert tuple(counts) == (38, 10)
    checked = run_cli("check", "net", "--db", any_db, "--format", "json")
    assert checked.code == 0
    rows = json.loads(checked.out)
    assert {r["severity"] for r in rows} == {"info"}
    assert rows[0] == {
        "severity": "info", "kind": "early_stop", "rank": 0, "seq": 25, "step": 0, "phase": "recompute",
        "fqn": "Net.blocks.1.fc2",
        "message": "Net.blocks.1.fc2 recompute stopped early at seq 25 (step 0): checkpoint had recomputed what backward needed",
    }


def test_tree_table_and_json_match_golden_files(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    record_net(str(db_path))
    table = run_cli("tree", "net")
    assert table.code == 0, table
    check_golden("tree_net.txt", table.out)
    backward = run_cli("tree", "net", "--phase", "recompute", "--step", "1", "--format", "json")
    check_golden("tree_net_recompute_step1.json", backward.out)
    shallow = run_cli("tree", "@", "--max-depth", "0", "--min-percent", "50")
    assert [line.split()[0:3] for line in shallow.out.splitlines()[1:]] == [["Net", "Net", "backward"]]


def test_tree_and_check_compute_without_writing_when_not_analysed(db_path: Path, run_cli, digest) -> None:  # type: ignore[no-untyped-def]
    record_net(str(db_path), analyze=False)
    before = digest(db_path)
    assert run_cli("tree", "net").out == (GOLDEN / "tree_net.txt").read_text()
    assert run_cli("check", "net").out.endswith("run net: 0 error(s), 0 warning(s), 10 info\n")
    assert digest(db_path) == before


def _corrupt_run(db: str) -> None:
    """A run whose rank wrote a forward with a lost exit row."""
    store = open_store(db, create=True)
    try:
        run_id, _ = create_run(store, "broken", {})
        add_rank(store, run_id, 0, 0)
        mods = model(blocks=1, per_block=1)  # 0 Net, 1 blocks.0, 2 blocks.0.fc0, 3 head
        rows = to_rows([ev(ENTER, 0, 0, 1), ev(ENTER, 1, 0, 2), ev(ENTER, 2, 0, 3), ev(EXIT, 1, 0, 2), ev(EXIT, 0, 0, 1)])
        RankWriter(store, run_id, 0).write(Batch(
            rows, modules=mods.rows, threads=[(0, 1, "MainThread")], devices=[(0, "cpu")], progress=(len(rows), 1)
        ))
        finish_rank(store, run_id, 0, "completed")
    finally:
        store.dispose()


def test_check_exits_1_on_errors_and_names_the_module(any_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    _corrupt_run(any_db)
    table = run_cli("check", "broken", "--db", any_db)
    assert table.code == 1
    assert "Net.blocks.0 forward exit at seq 3 (step 0) does not match the innermost open call Net.blocks.0.fc0 (entered at seq 2)" in table.out
    assert table.out.endswith("run broken: 2 error(s), 0 warning(s), 0 info\n")
    as_json = json.loads(run_cli("check", "broken", "--db", any_db, "--format", "json").out)
    assert [(r["kind"], r["severity"], r["seq"], r["fqn"]) for r in as_json] == [
        ("unclosed", "error", 2, "Net.blocks.0.fc0"), ("crossed", "error", 3, "Net.blocks.0"),
    ]
    assert run_cli("analyze", "broken", "--db", any_db).code == 0
    assert run_cli("check", "broken", "--db", any_db).code == 1


def test_usage_errors(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    record_net(str(db_path), steps=1)
    bad_step = run_cli("tree", "net", "--step", "x")
    assert (bad_step.code, bad_step.err) == (2, "modtrace: error: Invalid value for '--step': 'x' is not a step number or 'all'\n")
    assert run_cli("tree", "net", "--step", "7").err == "modtrace: error: run net has no spans in step 7; its steps are 0\n"
    assert run_cli("tree", "net", "--rank", "3").err == "modtrace: error: run net has no spans on rank 3\n"
    missing = run_cli("check", "nope")
    assert missing.code == 2 and missing.err.startswith("modtrace: error: no run 'nope'")


@pytest.mark.parametrize("scenario", ["mlp_twice", "shared_and_raising", "threads", "double_backward", "reentrant"])
def test_healthy_models_have_no_error_or_warning_issues(db_path: Path, scenario: str) -> None:
    clock = itertools.count(0, 7)
    torch.manual_seed(0)
    with modtrace.Recorder(db=str(db_path), run=scenario, clock=lambda: next(clock)) as rec:
        if scenario == "mlp_twice":
            net = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Sequential(nn.Linear(5, 5), nn.Tanh()), nn.Linear(5, 1))
            for _ in range(2):
                net(torch.randn(2, 3)).sum().backward()
                rec.step()
        elif scenario == "shared_and_raising":
            shared = nn.Linear(4, 4)
            net = nn.Sequential(shared, nn.ReLU(), shared)
            net(torch.randn(2, 4, requires_grad=True)).sum().backward()
            with pytest.raises(RuntimeError):
                net(torch.randn(2, 5))
        elif scenario == "threads":
            import threading

            nets = [nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 1)) for _ in range(3)]

            def work(n: nn.Module) -> None:
                for _ in range(3):
                    n(torch.randn(2, 4)).sum().backward()

            threads = [threading.Thread(target=work, args=(n,)) for n in nets]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        elif scenario == "double_backward":
            net = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 1))
            x = torch.randn(2, 3, requires_grad=True)
            y = net(x).sum()
            (g,) = torch.autograd.grad(y, x, create_graph=True)
            (g.pow(2).sum() + y).backward(retain_graph=True)
            y.backward()
        else:
            blocks = nn.Sequential(Block(), Block())
            out = checkpoint(blocks, torch.randn(2, 4, requires_grad=True), use_reentrant=True)
            out.sum().backward()
    rec.wait_analyzed()  # the writer process analyses the run after the with
    store = open_store(str(db_path))
    try:
        stored = read_analysis(store, 1)
    finally:
        store.dispose()
    assert stored is not None
    spans, issues = stored.spans, stored.issues
    bad = issues.filter(pl.col("severity") != "info")
    assert bad.height == 0, bad["message"].to_list()
    assert spans.height > 0 and spans["end_ns"].null_count() == 0


def test_check_summarises_info_issues_unless_all(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    record_net(str(db_path), steps=12)
    rows = json.loads(run_cli("check", "net", "--format", "json").out)
    assert len(rows) == 60 and {r["severity"] for r in rows} == {"info"}  # the JSON keeps every row
    groups = {(r["kind"], r["fqn"], r["phase"]) for r in rows}
    table = run_cli("check", "net")
    assert table.code == 0
    lines = table.out.splitlines()
    assert lines[-1] == "run net: 0 error(s), 0 warning(s), 60 info"
    body = [line for line in lines[1:-1] if line.startswith("info")]
    assert len(body) == len(groups) == 5
    assert all(" 12 " in line for line in body)
    assert " ".join(table.out.split()).count("(12 times, steps 0 to 11)") == 5
    every = run_cli("check", "net", "--all")
    assert len([line for line in every.out.splitlines() if line.startswith("info")]) == 60


def test_summary_keeps_errors_and_warnings_whole() -> None:
    from modtrace.analysis.nesting import ISSUE_SCHEMA, summarize_issues

    def row(seq: int, kind: str, severity: str, fqn: str, step: int) -> dict[str, object]:
        return {"run_id": 1, "rank": 0, "seq": seq, "kind": kind, "severity": severity, "fqn": fqn,
                "phase": "backward", "call_id": seq, "step": step, "thread_id": 0, "message": f"{kind} {fqn} {seq}"}

    issues = pl.DataFrame(
        [row(1, "closed_at_end_of_backward", "info", "A", 0), row(2, "unclosed", "error", "B", 0),
         row(3, "unclosed", "error", "B", 1), row(4, "closed_at_end_of_backward", "info", "A", 1),
         row(5, "closed_at_end_of_backward", "info", "C", 1)],
        schema=ISSUE_SCHEMA,
    )
    out = summarize_issues(issues)
    assert out.select("seq", "kind", "fqn", "count", "message").rows() == [
        (1, "closed_at_end_of_backward", "A", 2, "closed_at_end_of_backward A 1 (2 times, steps 0 to 1)"),
        (2, "unclosed", "B", 1, "unclosed B 2"),
        (3, "unclosed", "B", 1, "unclosed B 3"),
        (5, "closed_at_end_of_backward", "C", 1, "closed_at_end_of_backward C 5"),
    ]
