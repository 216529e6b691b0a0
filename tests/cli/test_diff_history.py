"""``modtrace diff`` against a history of baseline runs: real runs recorded by the real Recorder
on an injected clock whose durations the test sets (a per-run machine load, step-to-step
jitter), selected by their tags through the real command line."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.helpers.diff_runs import record

STEPS = 12
# The baseline runs' machine load: every duration stretched alike by this much, run to run.
LOADS = (1.0, 1.08, 0.95, 1.04, 1.1)


def doc_of(out: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(out)
    return data


@pytest.fixture(scope="module")
def history_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """base0..base4 (tag branch=main; host a or b; n=i), oldest first; candidates tagged
    branch=pr: ``aa`` the same code on a machine 6% busier, ``slow3x`` every module's work
    three times, ``block2x`` block 1's work twice."""
    db = str(tmp_path_factory.mktemp("history") / "runs.db")
    for i, load in enumerate(LOADS):
        record(db, f"base{i}", steps=STEPS, scale=load, jitter=0.05, seed=i,
               tags={"branch": "main", "host": "ab"[i % 2], "n": str(i)})
    pr = {"branch": "pr"}
    record(db, "aa", steps=STEPS, scale=1.06, jitter=0.05, seed=10, tags=pr)
    record(db, "slow3x", steps=STEPS, scale=3.0, jitter=0.05, seed=11, tags=pr)
    record(db, "block2x", {1: 200_000}, steps=STEPS, scale=1.02, jitter=0.05, seed=12, tags=pr)
    return db


def test_a_to_a_against_a_history_passes(history_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("diff", "--db", history_db, "tag:branch=main", "aa", "--format", "json")
    assert res.code == 0, res.out + res.err
    doc = doc_of(res.out)
    assert [h["run"] for h in doc["base"]["history"]] == ["base4", "base3", "base2", "base1", "base0"]
    assert doc["base"]["selector"] == "tag:branch=main" and doc["base"]["run"] == "base4"
    s = doc["summary"]
    assert s["history_runs"] == 5 and doc["step"]["verdict"] == "unchanged"
    assert s["regressions"] == s["improvements"] == s["structure_changes"] == 0
    assert doc["base"]["steps"] == 5 * (STEPS - 1)
    # the history's spread is the base runs' own median step times
    per_run = [h["step_us"] for h in doc["base"]["history"]]
    assert max(per_run) > min(per_run) * 1.1
    table = run_cli("diff", "--db", history_db, "tag:branch=main", "aa")
    assert table.code == 0 and "history of 5 runs (tag:branch=main, newest first: 'base4'" in table.out
    assert "no changes found" in table.out


def test_a_uniform_slowdown_fails_against_a_history(history_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("diff", "--db", history_db, "tag:branch=main", "slow3x", "--format", "json")
    assert res.code == 1, res.out + res.err
    doc = doc_of(res.out)
    s = doc["summary"]
    assert doc["step"]["verdict"] == "regression" and s["failed"] is True
    assert all(c["passed"] for c in doc["step"]["checks"])
    assert s["regressions"] == 0  # every module's share of the step is unchanged: the step is blamed
    assert 2.5 < s["step_ratio"] < 3.5
    table = run_cli("diff", "--db", history_db, "tag:branch=main", "slow3x")
    assert table.code == 1 and "a step-wide regression" in " ".join(table.out.split())
    # a single base run cannot tell it from load, and says so plainly
    one = run_cli("diff", "--db", history_db, "base4", "slow3x")
    assert one.code == 0
    assert "one base run cannot tell a step-wide change from machine load" in " ".join(one.out.split())


def test_one_slower_module_is_blamed_against_a_history(history_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("diff", "--db", history_db, "tag:branch=main", "block2x", "--format", "json")
    assert res.code == 1, res.out + res.err
    doc = doc_of(res.out)
    blamed = [(r["fqn"], r["phase"]) for r in doc["timing"] if r["verdict"] == "regression"]
    assert blamed == [("Net.blocks.1.work", "forward")]
    row = doc["timing"][0]
    assert row["self"]["cand_us"] > row["self"]["history_high_us"] * 1.1


def test_selectors_window_and_explicit_histories(history_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    def history(*args: str) -> list[str]:
        res = run_cli("diff", "--db", history_db, *args, "--format", "json", "--fail-on", "never")
        assert res.code == 0, res.err
        return [h["run"] for h in doc_of(res.out)["base"]["history"] or [doc_of(res.out)["base"]]]

    assert history("tag:branch=main", "aa", "--window", "2") == ["base4", "base3"]
    assert history("tag:branch=main", "tag:host=a", "aa") == ["base4", "base2", "base0"]  # AND-ed
    assert history("tag:branch=main tag:host=b", "aa") == ["base3", "base1"]  # several in one argument
    assert history("tag:branch=main", "base4") == ["base3", "base2", "base1", "base0"]  # the candidate left out
    assert history("base0", "base1", "base2", "aa") == ["base0", "base1", "base2"]  # runs listed
    one = run_cli("diff", "--db", history_db, "tag:n=4", "aa")
    assert one.code == 0
    assert "one base run matched tag:n=4: a step-wide change cannot be told from machine load" in one.err


@pytest.mark.parametrize("args, message", [
    (("tag:branch=nosuch", "aa"), "no completed run matches tag:branch=nosuch in "),
    (("tag:branch", "aa"), "bad selector 'tag:branch': write tag:KEY=VALUE"),
    (("tag:=main", "aa"), "bad selector 'tag:=main'"),
    (("tag:", "aa"), "bad selector 'tag:'"),
    (("tag:branch=main", "base0", "aa"), "base 'base0': give either runs or tag:KEY=VALUE selectors"),
    (("tag:branch=main", "tag:branch=pr", "aa"), "can match no run"),
    (("tag:branch=main", "aa", "--window", "0"), "--window"),
])
def test_bad_selectors_are_one_line_exit_2(history_db: str, run_cli, args: tuple[str, ...],  # type: ignore[no-untyped-def]
                                           message: str) -> None:
    res = run_cli("diff", "--db", history_db, *args)
    assert (res.code, res.out) == (2, ""), res.err
    assert res.err.startswith("modtrace: error: ") and res.err.count("\n") == 1
    assert message in res.err


def test_a_history_on_any_database(any_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    """Tags are matched alike on SQLite and PostgreSQL."""
    for i in range(2):
        record(any_db, f"h{i}", steps=6, jitter=0.05, seed=i, tags={"branch": "main"})
    record(any_db, "c", steps=6, scale=3.0, seed=9, tags={"branch": "pr"})
    res = run_cli("diff", "--db", any_db, "tag:branch=main", "c", "--format", "json")
    assert res.code == 1, res.out + res.err
    doc = doc_of(res.out)
    assert [h["run"] for h in doc["base"]["history"]] == ["h1", "h0"]
    assert doc["step"]["verdict"] == "regression"


def test_the_history_says_what_step_wide_change_it_can_tell(history_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    """The step verdict's bounds, as ratios to the history's median level, from the stored steps:
    each base run's level is the 10th percentile of its step times (the first step skipped),
    and the rule widens their range by its own width and 10%."""
    import sqlite3
    from statistics import median, quantiles

    with sqlite3.connect(history_db) as conn:
        levels = []
        for i in range(len(LOADS)):
            steps = [r[0] for r in conn.execute(
                "SELECT s.step_ns FROM steps s JOIN runs r ON r.id = s.run_id WHERE r.name = ? AND s.step >= 1",
                (f"base{i}",))]
            assert len(steps) == STEPS - 1
            levels.append(quantiles(steps, n=10, method="inclusive")[0])  # linear, as polars
    low, high, mid = min(levels), max(levels), median(levels)
    expected = [low * (low / high) * 0.9 / mid, high * (high / low) * 1.1 / mid]
    step = doc_of(run_cli("diff", "--db", history_db, "tag:branch=main", "aa", "--format", "json").out)["step"]
    assert step["bounds"] == pytest.approx(expected, rel=1e-4)
    assert step["level_low_us"] * 1000 == pytest.approx(low, rel=1e-4)
    # the check that decided it, with the bar of the way the candidate moved
    beyond = next(c for c in step["checks"] if c["name"] == "beyond_history")
    assert not beyond["passed"]
    assert beyond["bar"] == pytest.approx(expected[1] if step["ratio"] > 1 else expected[0], rel=1e-4)
    out = " ".join(run_cli("diff", "--db", history_db, "tag:branch=main", "aa").out.split())
    deciding = next(c["name"] for c in step["checks"] if not c["passed"])
    assert f"step: unchanged, step time's 10th percentile {(step['ratio'] - 1) * 100:+.1f}%: {deciding} " in out
    # a step-wide regression lists every check that made it one
    slow = " ".join(run_cli("diff", "--db", history_db, "tag:branch=main", "slow3x").out.split())
    assert "step: a step-wide regression" in slow and "beyond_history" in slow and "history_runs 5 >= 2" in slow
    one = doc_of(run_cli("diff", "--db", history_db, "base4", "aa", "--format", "json").out)["step"]
    assert one["verdict"] == "unknown" and one["checks"][0] == {"name": "history_runs", "value": 1.0, "bar": 2.0,
                                                                "passed": False}
