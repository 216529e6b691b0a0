"""modtrace report: one self-contained HTML file holding the run's model, on
runs recorded from real models (the bundled tiny transformer, and a toy model
on an injected clock so that a slowed module is an exact, known regression).

Also home of the recording helpers the export and browser tests share.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.database import db_rows
from tests.helpers.report import embedded, record_tiny, record_toy

REPO = Path(__file__).resolve().parents[2]


# -- the file ----------------------------------------------------------------------


def test_report_is_one_self_contained_file_with_the_runs_data(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(tmp_path / "t.db")
    record_tiny(db, "ck", steps=3, checkpoint=True)
    out = tmp_path / "report.html"
    result = run_cli("report", "ck", "--db", db, "-o", str(out))
    assert result.code == 0, result
    assert result.out == ""
    assert result.err == f"modtrace: wrote report of run 'ck' to {out}\n"
    html = out.read_text()

    # Nothing to fetch: no URL, no external resource, no stylesheet or script by reference.
    assert "http://" not in html and "https://" not in html and "//" not in re.sub(r"<script.*?</script>", "", html, flags=re.S)
    assert not re.search(r"<(link|img|iframe|object|embed)\b", html, re.I)
    assert not re.search(r"\b(src|href)\s*=", html, re.I)
    assert "@import" not in html and "url(" not in html
    assert html.count("<script") == 2 and "<style>" in html

    data = embedded(html)
    assert data["run"]["name"] == "ck" and data["run"]["status"] == "completed"
    spans_per_step = dict(db_rows(db, "SELECT step, COUNT(*) FROM spans WHERE run_id = 1 GROUP BY step"))
    assert data["span_count"] == sum(spans_per_step.values())
    assert [s["step"] for s in data["steps"]] == sorted(spans_per_step) == [0, 1, 2]
    assert [s["spans"] for s in data["steps"]] == [spans_per_step[s] for s in sorted(spans_per_step)]
    # Every embedded step's flame chart holds exactly that step's spans, every phase present.
    assert data["default_step"] in spans_per_step
    for step in data["flame"]["steps"]:
        assert len(step["spans"]) == spans_per_step[step["step"]]
        phases = {data["phases"][s[6]] for s in step["spans"]}
        assert phases == {"forward", "backward", "recompute"}
        assert all(s[0] >= 0 and s[0] + s[1] <= step["duration_ns"] for s in step["spans"])
    # Per-step times (docs/schema.md, "Step time"): the root spans' durations, split by self time.
    roots = dict(db_rows(db, "SELECT step, SUM(duration_ns) FROM spans WHERE run_id = 1 AND depth = 0 GROUP BY step"))
    assert {s["step"]: s["step_ns"] for s in data["steps"]} == roots
    for phase in ("forward", "backward", "recompute"):
        selfs = dict(db_rows(db, f"SELECT step, SUM(self_ns) FROM spans WHERE run_id = 1 AND phase = '{phase}' GROUP BY step"))
        assert {s["step"]: s[f"{phase}_ns"] for s in data["steps"]} == selfs
    assert all(s["recompute_ns"] > 0 and s["forward_ns"] + s["backward_ns"] + s["recompute_ns"] == s["step_ns"]
               for s in data["steps"])
    # Issues: what nesting_issues holds (checkpoint early stops and closes at the end of backward).
    issues = db_rows(db, "SELECT severity, kind, COUNT(*) FROM nesting_issues WHERE run_id = 1 GROUP BY severity, kind")
    assert {(c["severity"], c["kind"], c["n"]) for c in data["issues"]["counts"]} == set(issues)
    assert data["issues"]["total"] == len(data["issues"]["rows"]) == sum(n for *_, n in issues)
    assert data["diff"] is None


def test_report_vs_base_carries_the_diff_with_the_regression_first(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(tmp_path / "t.db")
    record_toy(db, "base", steps=8)
    record_toy(db, "slow", steps=8, slow_ns=400_000)
    out = tmp_path / "r.html"
    result = run_cli("report", "slow", "--vs", "base", "--db", db, "-o", str(out))
    assert result.code == 0, result
    html = out.read_text()
    assert "<title>modtrace report: slow vs base</title>" in html
    diff = embedded(html)["diff"]
    assert diff["base"]["run"] == "base"
    assert diff["summary"]["regressions"] == 1
    first = diff["timing"][0]
    assert (first["fqn"], first["phase"], first["verdict"]) == ("Toy.body.2", "forward", "regression")
    assert first["impact_us"] == 400  # exact: the injected clock charged it
    assert [r for r in diff["timing"] if r["verdict"] == "regression"] == [first]
    assert diff["structure"] == []
    # The trend chart's data: the blamed module's self time per step in the base run, then the
    # candidate: two points, 400 us apart as the injected clock charged them.
    trend = embedded(html)["trend"]
    assert [(r["run"], r["role"]) for r in trend["runs"]] == [("base", "base"), ("slow", "cand")]
    assert [(t["fqn"], t["phase"]) for t in trend["series"]] == [("Toy.body.2", "forward")]
    base_us, cand_us = trend["series"][0]["self_us"]
    assert cand_us - base_us == 400

    # The same run on both sides is a usage error, not an empty diff.
    same = run_cli("report", "slow", "--vs", "slow", "--db", db, "-o", str(tmp_path / "x.html"))
    assert (same.code, same.err) == (2, "modtrace: error: --vs slow: is the same run as slow\n")
    assert not (tmp_path / "x.html").exists()


def test_report_without_a_regression_has_no_trend(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(tmp_path / "t.db")
    record_toy(db, "base", steps=8)
    record_toy(db, "same", steps=8)
    out = tmp_path / "r.html"
    assert run_cli("report", "same", "--vs", "base", "--db", db, "-o", str(out)).code == 0
    data = embedded(out.read_text())
    assert data["diff"]["summary"]["regressions"] == 0 and data["trend"] is None


def test_trend_of_a_history_has_a_point_per_run_oldest_first_then_the_candidate() -> None:
    """The shape a history of N baseline runs gives the chart (N + 1 points), on a diff document
    as ``modtrace diff`` writes it with ``history`` added (runs newest first)."""
    from modtrace.renderers.html_report import trend_data

    def row(fqn: str, verdict: str, history: list[float], cand: float) -> dict[str, Any]:
        return {"fqn": fqn, "phase": "forward", "verdict": verdict, "impact_us": cand - history[0],
                "self": {"base_us": history[0], "cand_us": cand, "history_us": history}}

    history = [{"run": "main-3", "run_id": 3}, {"run": "main-2", "run_id": 2}, {"run": "main-1", "run_id": 1}]
    doc = {
        "base": {"run": "main-3", "run_id": 3, "history": history}, "cand": {"run": "pr", "run_id": 9},
        "timing": [row("M.slow", "regression", [10.0, 11.0, 12.0], 30.0), row("M.ok", "unchanged", [5.0, 5.0, 5.0], 5.0)],
    }
    trend = trend_data(doc)
    assert trend is not None
    assert [(r["run"], r["role"]) for r in trend["runs"]] == [
        ("main-1", "base"), ("main-2", "base"), ("main-3", "base"), ("pr", "cand")]
    assert trend["series"] == [{"fqn": "M.slow", "phase": "forward", "impact_us": 20.0, "self_us": [12.0, 11.0, 10.0, 30.0]}]
    one = {**doc, "base": {"run": "main-3", "run_id": 3, "history": None}}
    assert trend_data(one) == {"runs": [{"run": "main-3", "run_id": 3, "role": "base"}, {"run": "pr", "run_id": 9, "role": "cand"}],
                               "series": [{"fqn": "M.slow", "phase": "forward", "impact_us": 20.0, "self_us": [10.0, 30.0]}]}


def test_report_numbers_are_the_clis_numbers(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    """One meaning per number: the report's diff is what `modtrace diff BASE RUN --format json` prints,
    and its modules' calls, self/step, incl/step and totals are what `modtrace tree --format json` gives."""
    db = str(tmp_path / "t.db")
    record_toy(db, "base", steps=8)
    record_toy(db, "slow", steps=8, slow_ns=400_000)
    out = tmp_path / "r.html"
    assert run_cli("report", "slow", "--vs", "base", "--db", db, "-o", str(out)).code == 0
    data = embedded(out.read_text())

    diff = run_cli("diff", "base", "slow", "--db", db, "--format", "json")
    assert diff.code == 1, diff  # the regression
    doc = json.loads(diff.out)
    assert data["diff"] == doc  # every number of every row, the Holm-adjusted p among them
    row = next(r for r in data["diff"]["timing"] if r["fqn"] == "Toy.body.2" and r["phase"] == "forward")
    # two p-values per row, told apart by name: the page's "p (Holm)" column is p_adjusted (test_report_browser)
    assert row["verdict"] == "regression" and row["self"]["p_value"] < row["self"]["p_adjusted"] < 0.01
    assert data["diff_headline"][0].startswith("base 'base' (run 1, 7 steps, median step time ")

    tree = run_cli("tree", "slow", "--db", db, "--format", "json")
    assert tree.code == 0, tree
    nodes: dict[tuple[str, str], dict[str, Any]] = {}
    todo = json.loads(tree.out)
    while todo:
        node = todo.pop()
        assert (node["fqn"], node["phase"]) not in nodes  # one call path per module and phase in the toy
        nodes[(node["fqn"], node["phase"])] = node
        todo.extend(node["children"])
    assert len(data["top_modules"]) == len(nodes)
    for mod in data["top_modules"]:
        node = nodes[(mod["fqn"], mod["phase"])]
        for key in ("calls", "steps", "self_median_ns", "inclusive_median_ns", "self_total_ns", "inclusive_total_ns"):
            assert mod[key] == node[key], (mod["fqn"], mod["phase"], key)


def test_report_of_a_run_never_analysed_is_analysed_on_the_fly_without_writing(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(tmp_path / "t.db")
    record_toy(db, "raw", steps=2, analyze=False)
    assert db_rows(db, "SELECT COUNT(*) FROM span_rows") == [(0,)]
    out = tmp_path / "r.html"
    result = run_cli("report", "raw", "--db", db, "-o", str(out))
    assert result.code == 0, result
    assert "has no stored analysis; analysing its events now" in result.err
    data = embedded(out.read_text())
    assert data["span_count"] == db_rows(db, "SELECT COUNT(*) FROM events")[0][0] // 2
    assert db_rows(db, "SELECT COUNT(*) FROM span_rows") == [(0,)]  # a read command writes nothing
    quiet = run_cli("report", "raw", "--db", db, "-o", str(out), "--quiet")
    assert (quiet.code, quiet.err) == (0, "")


def test_names_cannot_break_out_of_the_page(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(tmp_path / "t.db")
    name = "a</script><script>alert(1)</script><!--"
    record_toy(db, name, steps=1)
    out = tmp_path / "r.html"
    assert run_cli("report", name, "--db", db, "-o", str(out)).code == 0
    html = out.read_text()
    assert "alert(1)</script>" not in html and "<!--" not in html
    assert "<title>modtrace report: a&lt;/script&gt;&lt;script&gt;alert(1)&lt;/script&gt;&lt;!--</title>" in html
    assert embedded(html)["run"]["name"] == name


def test_step_and_rank_choose_the_flame_chart(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(tmp_path / "t.db")
    record_toy(db, "toy", steps=4)
    out = tmp_path / "r.html"
    assert run_cli("report", "toy", "--db", db, "-o", str(out), "--step", "3").code == 0
    data = embedded(out.read_text())
    assert data["default_step"] == 3 and 3 in [s["step"] for s in data["flame"]["steps"]]

    for args, message in [
        (("--step", "9"), "--step 9: run 'toy' has no spans in step 9 on rank 0"),
        (("--rank", "3"), "--rank 3: run 'toy' has no spans on that rank"),
    ]:
        bad = run_cli("report", "toy", "--db", db, "-o", str(tmp_path / "bad.html"), *args)
        assert (bad.code, bad.err) == (2, f"modtrace: error: {message}\n")
        assert not (tmp_path / "bad.html").exists()


def test_report_of_two_ranks_lists_both_and_charts_the_chosen_one(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(tmp_path / "t.db")
    for rank in (0, 1):
        record_toy(db, "dist", steps=3, join=True, rank=rank, world_size=2)
    out = tmp_path / "r.html"
    assert run_cli("report", "dist", "--db", db, "-o", str(out), "--rank", "1").code == 0
    data = embedded(out.read_text())
    assert data["ranks"] == [0, 1] and data["rank"] == 1
    assert [(s["rank"], s["step"]) for s in data["steps"]] == [(r, s) for r in (0, 1) for s in range(3)]
    per_step = dict(db_rows(db, "SELECT step, COUNT(*) FROM spans WHERE rank = 1 GROUP BY step"))
    assert {s["step"]: len(s["spans"]) for s in data["flame"]["steps"]} == per_step


def test_report_errors_are_one_line(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(tmp_path / "t.db")
    record_toy(db, "toy", steps=1)
    missing = run_cli("report", "nope", "--db", db, "-o", str(tmp_path / "r.html"))
    assert missing.code == 2 and missing.err.startswith("modtrace: error: no run 'nope'") and missing.err.count("\n") == 1
    nodir = run_cli("report", "toy", "--db", db, "-o", str(tmp_path / "no" / "r.html"))
    assert (nodir.code, nodir.err) == (2, f"modtrace: error: -o {tmp_path / 'no' / 'r.html'}: directory {tmp_path / 'no'} does not exist\n")
    no_o = run_cli("report", "toy", "--db", db)
    assert no_o.code == 2 and "Missing option '-o'" in no_o.err


def test_report_to_stdout(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(tmp_path / "t.db")
    record_toy(db, "toy", steps=2)
    result = run_cli("report", "toy", "--db", db, "-o", "-")
    assert result.code == 0 and result.err == ""
    assert result.out.startswith("<!DOCTYPE html>") and embedded(result.out)["run"]["name"] == "toy"


@pytest.mark.postgres
def test_report_from_postgresql(pg_url: str, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    record_toy(pg_url, "base", steps=8)
    record_toy(pg_url, "slow", steps=8, slow_ns=400_000)
    out = tmp_path / "r.html"
    result = run_cli("report", "slow", "--vs", "base", "--db", pg_url, "-o", str(out))
    assert result.code == 0, result
    data = embedded(out.read_text())
    assert data["diff"]["timing"][0]["fqn"] == "Toy.body.2" and data["diff"]["timing"][0]["verdict"] == "regression"
    assert data["span_count"] == db_rows(pg_url, "SELECT COUNT(*) FROM spans WHERE run_id = 2")[0][0]
