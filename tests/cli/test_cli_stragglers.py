"""``modtrace stragglers`` and ``Database.stragglers`` on recorded runs of two ranks on a work clock
(exact times), on SQLite and PostgreSQL: the reduction runs as SQL on both."""

from __future__ import annotations

import csv
import io
import json

import modtrace
from tests.helpers.diff_runs import record

SLOW = 10_000_000  # ns: blocks.1's work on the slow rank (100 us elsewhere)


def _job(db: str, name: str, *, costs1: dict[int, int] | None = None, scale1: float = 1.0, steps1: int = 6) -> None:
    record(db, name, {}, rank=0, world_size=2, steps=6, jitter=0.05, seed=1)
    record(db, name, costs1 or {}, rank=1, world_size=2, steps=steps1, jitter=0.05, seed=2, scale=scale1)


def test_a_slow_module_on_one_rank_is_named_each_step_with_its_what_if(any_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    _job(any_db, "job", costs1={1: SLOW})
    with modtrace.open(any_db) as db:
        found = db.stragglers("job").to_dict()
        balanced = db.steps("job").filter(rank=0)["wall_ns"].median()
    assert [s["straggler"]["fqn"] for s in found["steps"]] == ["Net.blocks.1.work"] * 6
    assert {(s["straggler"]["rank"], s["straggler"]["phase"], s["straggler"]["kind"]) for s in found["steps"]} == {
        (1, "forward", "module")}
    for s in found["steps"]:
        assert 0.85 * SLOW < s["straggler"]["excess_ns"] < 1.15 * SLOW
        assert s["what_if_step_ns"] < 1.25 * balanced  # type: ignore[operator]
    [p] = found["persistent"]
    assert (p["rank"], p["fqn"], p["phase"], p["steps"]) == (1, "Net.blocks.1.work", "forward", 6)
    out = run_cli("stragglers", "job", "--db", any_db)
    assert out.code == 0, out
    assert "persistent straggler: rank 1 Net.blocks.1.work forward: 6/6 steps" in out.out
    report = run_cli("report", "job", "--db", any_db, "-o", "-", "-q")
    data = json.loads(report.out.split('id="modtrace-data">', 1)[1].split("</script>", 1)[0])
    assert data["rank"] == 0 and data["stragglers"]["persistent"][0]["fqn"] == "Net.blocks.1.work"
    assert 'id="stragglers-section"' in report.out
    checked = run_cli("check", "job", "--db", any_db)
    assert checked.out.splitlines()[-1].startswith(
        "stragglers: rank 1 Net.blocks.1.work forward held back 6 of 6 steps, median +"), checked.out


def test_a_rank_slower_everywhere_is_a_slow_rank_and_a_balanced_run_has_none(any_db: str) -> None:
    _job(any_db, "slow", scale1=1.5)
    _job(any_db, "even")
    with modtrace.open(any_db) as db:
        slow = db.stragglers("slow").to_dict()
        even = db.stragglers("even").to_dict()
    [p] = slow["persistent"]
    assert (p["kind"], p["rank"], p["fqn"]) == ("rank", 1, None)
    assert 1.4 < p["ratio"] < 1.6
    assert even["persistent"] == []
    assert all(s["straggler"] is None for s in even["steps"])


def test_formats_skip_steps_and_the_steps_one_rank_missed(db_path: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(db_path)
    _job(db, "crashed", costs1={1: SLOW}, steps1=4)
    out = run_cli("stragglers", "crashed", "--db", db, "--format", "json", "--skip-steps", "1")
    assert out.code == 0, out
    data = json.loads(out.out)
    assert [s["step"] for s in data["steps"]] == [1, 2, 3]
    assert data["left_out_steps"] == [4, 5]
    assert set(data["steps"][0]) == {"step", "step_ns", "straggler", "waited", "what_if_step_ns"}
    assert set(data["persistent"][0]) >= {"rank", "fqn", "phase", "steps", "median_excess_ns", "what_if_step_ns"}
    table = run_cli("stragglers", "crashed", "--db", db)
    assert "left out: step(s) 4, 5: not every rank recorded them" in table.out
    rows = list(csv.DictReader(io.StringIO(run_cli("stragglers", "crashed", "--db", db, "--format", "csv").out)))
    assert [r["fqn"] for r in rows] == ["Net.blocks.1.work"] * 4
    md = run_cli("stragglers", "crashed", "--db", db, "--format", "markdown").out
    assert "| step | step_ms | straggler |" in md


def test_one_rank_is_a_usage_error_in_one_line(db_path: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(db_path)
    record(db, "solo", {})
    out = run_cli("stragglers", "solo", "--db", db)
    assert out.code == 2
    assert out.err.count("\n") == 1 and "needs two or more" in out.err, out
    record(db, "raw", {}, rank=0, world_size=2, analyze=False)
    record(db, "raw", {}, rank=1, world_size=2, analyze=False)
    out = run_cli("stragglers", "raw", "--db", db)
    assert out.code == 1 and "modtrace analyze raw" in out.err, out
