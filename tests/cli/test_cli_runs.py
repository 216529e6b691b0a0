"""``modtrace runs`` and ``modtrace show`` over runs written through the store."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys

import pytest
import sqlalchemy as sa

from modtrace.store.engine import open_store
from modtrace.store.runs import add_rank, create_run, finish_rank
from modtrace.store.schema import run_ranks, runs
from tests.helpers.harness import update_rank_progress

COLUMNS = ["id", "name", "status", "started_at", "ended_at", "duration_s", "events", "steps", "step_on", "ranks",
           "analysis", "tags"]
STARTED = "2026-01-01T00:00:00.000000Z"
ENDED = "2026-01-01T00:01:05.500000Z"


@pytest.fixture
def three_runs(any_db: str) -> str:
    """baseline: completed on two ranks in 65.5 s; tuned: running in this
    process; crashed: left running by a process that is gone."""
    store = open_store(any_db, create=True)
    try:
        base, _ = create_run(store, "baseline", {"world_size": 2, "started_at": STARTED, "command": "train.py"})
        for rank, (n_events, n_steps) in enumerate([(100, 5), (120, 4)]):
            add_rank(store, base, rank, wall_anchor_ns=0)
            update_rank_progress(store, base, rank, n_events, n_steps)
            finish_rank(store, base, rank, "completed")
        tuned, _ = create_run(store, "tuned", {"started_at": STARTED})
        add_rank(store, tuned, 0, wall_anchor_ns=0)  # pid: this live process
        crashed, _ = create_run(store, "crashed", {"started_at": STARTED})
        add_rank(store, crashed, 0, wall_anchor_ns=0)
        gone = subprocess.Popen([sys.executable, "-c", "pass"])
        gone.wait()
        with store.engine.begin() as conn:
            conn.execute(sa.update(runs).where(runs.c.id == base).values(ended_at=ENDED))
            conn.execute(sa.update(run_ranks).where(run_ranks.c.run_id == crashed).values(pid=gone.pid))
    finally:
        store.dispose()
    return any_db


def test_json_lists_runs_newest_first_with_counts(run_cli, three_runs: str) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("runs", "--db", three_runs, "--format", "json")
    assert result.code == 0 and result.err == ""
    listed = json.loads(result.out)
    assert [r["name"] for r in listed] == ["crashed", "tuned", "baseline"]
    assert all(list(r) == COLUMNS for r in listed)
    crashed, tuned, baseline = listed
    assert baseline == {
        "id": baseline["id"], "name": "baseline", "status": "completed", "started_at": STARTED,
        "ended_at": ENDED, "duration_s": 65.5, "events": 220, "steps": 5, "step_on": "optimizer", "ranks": 2,
        "analysis": "none", "tags": {},
    }
    assert isinstance(baseline["id"], int) and tuned["id"] > baseline["id"]
    assert (tuned["status"], tuned["ended_at"], tuned["duration_s"], tuned["ranks"]) == ("running", None, None, 1)
    assert crashed["status"] == "incomplete"


def test_csv_has_a_header_and_one_row_per_run(run_cli, three_runs: str) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("runs", "--db", three_runs, "--format", "csv")
    assert result.code == 0
    reader = csv.DictReader(io.StringIO(result.out))
    assert reader.fieldnames == COLUMNS
    rows = list(reader)
    assert [r["name"] for r in rows] == ["crashed", "tuned", "baseline"]
    assert rows[2]["duration_s"] == "65.5" and rows[2]["events"] == "220" and rows[2]["ranks"] == "2"
    assert rows[1]["ended_at"] == "" and rows[1]["duration_s"] == ""


def test_table_shows_the_summary_columns(run_cli, three_runs: str) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("runs", "--db", three_runs)
    assert result.code == 0
    header, *lines = result.out.splitlines()
    assert header.split() == ["id", "name", "status", "started", "duration", "events", "steps", "step_on", "ranks",
                              "analysis", "tags"]
    assert [line.split()[1:3] for line in lines] == [["crashed", "incomplete"], ["tuned", "running"], ["baseline", "completed"]]
    assert lines[2].split()[3:] == [STARTED, "1m05s", "220", "5", "optimizer", "2", "none"]


def test_limit_keeps_the_newest(run_cli, three_runs: str) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("runs", "--db", three_runs, "--limit", "2", "--format", "json")
    assert [r["name"] for r in json.loads(result.out)] == ["crashed", "tuned"]


@pytest.mark.parametrize(("fmt", "expected"), [("json", "[]\n"), ("csv", ",".join(COLUMNS) + "\n")])
def test_no_runs_in_machine_formats(run_cli, any_db: str, fmt: str, expected: str) -> None:  # type: ignore[no-untyped-def]
    assert run_cli("db", "upgrade", "--db", any_db).code == 0
    result = run_cli("runs", "--db", any_db, "--format", fmt)
    assert (result.code, result.out) == (0, expected)


def test_no_runs_in_a_table_says_so(run_cli, db_path) -> None:  # type: ignore[no-untyped-def]
    run_cli("db", "upgrade")
    result = run_cli("runs")
    assert (result.code, result.out) == (0, f"no runs in {db_path}\n")


def test_show_resolves_references(run_cli, three_runs: str) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("show", "@~2", "--db", three_runs, "--format", "json")
    assert result.code == 0, result
    info = json.loads(result.out)
    assert (info["name"], info["status"], info["events"], info["steps"], info["ranks"]) == ("baseline", "completed", 220, 5, 2)
    assert [r["rank"] for r in info["rank_details"]] == [0, 1]
    table = run_cli("show", "tuned", "--db", three_runs)
    assert table.code == 0 and any(line.split()[:2] == ["name", "tuned"] for line in table.out.splitlines())


def test_show_unknown_run_is_a_usage_error_with_a_suggestion(run_cli, three_runs: str) -> None:  # type: ignore[no-untyped-def]
    result = run_cli("show", "basline", "--db", three_runs)
    assert result.code == 2 and result.out == ""
    assert result.err.startswith("modtrace: error: no run 'basline' in ")
    assert result.err.endswith("; did you mean 'baseline'?\n")
