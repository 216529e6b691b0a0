"""``modtrace diff`` end to end: real models recorded by the real Recorder into
real databases, compared through the real command line.

Timing tests use an injected clock that advances a fixed tick per event, plus
what a ``Work`` module's own code "costs" (it advances the clock itself), so
durations are exact and a slower module is slower by exactly its cost.
"""

from __future__ import annotations

import json
import runpy
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.diff_runs import STEPS, record
from tests.helpers.golden import check_golden

REPO = Path(__file__).resolve().parents[2]








def doc_of(out: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(out)
    return data


def regressions(doc: dict[str, Any]) -> list[tuple[str, str]]:
    return [(r["fqn"], r["phase"]) for r in doc["timing"] if r["verdict"] == "regression"]



@pytest.fixture(scope="module")
def runs_db(tmp_path_factory: pytest.TempPathFactory) -> str:
    """One database for the module: base, same (identical), slow (block 1's Work costs 200 us
    instead of 100 us: twice as slow, what the rule blames; 1.5x sits at its share threshold), and a two-rank run ``job`` whose rank 1 straggles in block 2."""
    db = str(tmp_path_factory.mktemp("diff") / "runs.db")
    record(db, "base")
    record(db, "same")
    record(db, "slow", {1: 200_000})
    record(db, "job", rank=0, world_size=2)
    record(db, "job", {2: 300_000}, rank=1, world_size=2)
    return db


def test_identical_runs_exit_0_with_no_findings(runs_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("diff", "--db", runs_db, "base", "same", "--format", "json")
    assert res.code == 0, res.err
    doc = doc_of(res.out)
    assert doc["format"] == "modtrace.diff/2"
    assert doc["summary"]["regressions"] == doc["summary"]["improvements"] == doc["summary"]["structure_changes"] == 0
    assert {r["verdict"] for r in doc["timing"]} == {"unchanged"}
    assert {r["self"]["delta_us"] for r in doc["timing"]} == {0.0}
    assert doc["base"]["steps"] == doc["cand"]["steps"] == STEPS - 1
    table = run_cli("diff", "--db", runs_db, "base", "same")
    assert table.code == 0 and "no changes found" in table.out


def test_slower_module_is_blamed_exactly(runs_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("diff", "--db", runs_db, "base", "slow", "--format", "json")
    assert res.code == 1, res.err
    doc = doc_of(res.out)
    assert regressions(doc) == [("Net.blocks.1.work", "forward")]
    row = doc["timing"][0]
    assert row["self"]["delta_us"] == 100.0 and row["impact_us"] == 100.0
    assert row["self"]["ratio"] > 1.1 and row["self"]["p_value"] < 0.01
    inherited = sorted((r["fqn"], r["phase"]) for r in doc["timing"] if r["verdict"] == "inherited")
    assert inherited == [("Net", "forward"), ("Net.blocks.1", "forward")]
    assert doc["summary"]["failed"] is True and doc["summary"]["exit_code"] == 1
    # --fail-on decides the exit status, not the findings.
    assert run_cli("diff", "--db", runs_db, "base", "slow", "--fail-on", "never").code == 0
    assert run_cli("diff", "--db", runs_db, "base", "slow", "--fail-on", "structure").code == 0
    assert run_cli("diff", "--db", runs_db, "base", "slow", "--fail-on", "any").code == 1
    # A 100 us change is under --min-delta-us 110; its share of the step grew by less than
    # --threshold 200 and it is not 3 times slower than the typical module (--share-threshold 200).
    assert run_cli("diff", "--db", runs_db, "base", "slow", "--min-delta-us", "110").code == 0
    assert run_cli("diff", "--db", runs_db, "base", "slow", "--threshold", "200").code == 0
    assert run_cli("diff", "--db", runs_db, "base", "slow", "--share-threshold", "200").code == 0
    # The other direction is an improvement, not a failure.
    back = doc_of(run_cli("diff", "--db", runs_db, "slow", "base", "--format", "json").out)
    assert [(r["fqn"], r["verdict"]) for r in back["timing"][:1]] == [("Net.blocks.1.work", "improvement")]
    assert back["summary"]["exit_code"] == 0


def test_outputs_match_golden_files(runs_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    def norm(text: str) -> str:
        return text.replace(runs_db, "<db>")

    table = run_cli("diff", "--db", runs_db, "base", "slow").out
    check_golden("diff_slow.txt", norm(table))
    # In a pipe every sentence of the headline is one whole line; on a terminal of 100 columns
    # the same sentences fold to fit it.
    from modtrace.renderers import get_renderer
    from modtrace.renderers.base import Terminal
    from modtrace.renderers.diff import DiffView

    headline = table.split("\n\n", 1)[0].splitlines()
    assert any(len(line) > 100 for line in headline) and not any(line.startswith(" ") for line in headline)
    doc = json.loads(run_cli("diff", "--db", runs_db, "base", "slow", "--format", "json").out)
    folded = get_renderer("diff", "table", terminal=Terminal(width=100)).render(DiffView(doc, False))
    lines = folded.split("\n\n", 1)[0].splitlines()
    assert len(lines) > len(headline) and max(len(line) for line in lines) <= 100, lines
    assert " ".join(line.strip() for line in lines) == " ".join(headline)
    check_golden("diff_slow.md", norm(run_cli("diff", "--db", runs_db, "base", "slow", "--format", "markdown").out))
    check_golden("diff_slow.csv", norm(run_cli("diff", "--db", runs_db, "base", "slow", "--format", "csv").out))
    check_golden("diff_slow.json", norm(run_cli("diff", "--db", runs_db, "base", "slow", "--format", "json").out))


def test_markdown_is_a_pr_comment_verdict_first(runs_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    """First line the verdict (pass or fail, the regressions, the structure changes, against what),
    then the regressions, then what was compared with the baseline used, then the context."""
    md = run_cli("diff", "--db", runs_db, "base", "slow", "--format", "markdown").out
    lines = md.splitlines()
    assert lines[0] == ("## ❌ modtrace diff: 1 regression (Net.blocks.1.work forward +98.0%), no structure change: "
                        "slow against the base run base")
    titles = [line for line in lines if line.startswith("### ")]
    assert titles == ["### Regressions (self time got slower; sorted by impact on step time)", "### What was compared",
                      "### Inherited (inclusive time changed through a descendant: context, not blame)"]
    compared = md.split("### What was compared\n\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert compared[0].startswith("- base 'base' (run 1, 9 steps") and compared[1].startswith("- cand 'slow' (run 3")
    assert compared[-1] == ("- baseline: the base run 'base' (run 1): one run, so a change of the whole step cannot be "
                            "told from machine load")
    clean = run_cli("diff", "--db", runs_db, "base", "same", "--format", "markdown").out
    assert clean.splitlines()[0] == "## ✅ modtrace diff: no regression, no structure change: same against the base run base"
    # --fail-on decides the mark: the same regression passes under --fail-on never
    never = run_cli("diff", "--db", runs_db, "base", "slow", "--format", "markdown", "--fail-on", "never").out
    assert never.splitlines()[0].startswith("## ✅ modtrace diff: 1 regression (")


def test_phase_filter_and_skip_steps(runs_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    backward = doc_of(run_cli("diff", "--db", runs_db, "base", "slow", "--phase", "backward", "--format", "json").out)
    assert regressions(backward) == [] and {r["phase"] for r in backward["timing"]} == {"backward"}
    assert backward["options"]["phases"] == ["backward"]
    skip = doc_of(run_cli("diff", "--db", runs_db, "base", "slow", "--skip-steps", "2", "--format", "json").out)
    assert skip["base"]["steps"] == STEPS - 2 and regressions(skip) == [("Net.blocks.1.work", "forward")]
    res = run_cli("diff", "--db", runs_db, "base", "slow", "--skip-steps", str(STEPS))
    assert res.code == 2
    assert res.err == "modtrace: error: run 'base' has no steps left to compare after skipping 10 (use --skip-steps 0)\n"


def test_runs_in_different_databases(tmp_path: Path, any_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    other = str(tmp_path / "other.db")
    record(other, "base")
    record(any_db, "cand", {0: 200_000})
    doc = doc_of(run_cli("diff", "base", "cand", "--db", other, "--cand-db", any_db, "--format", "json").out)
    assert regressions(doc) == [("Net.blocks.0.work", "forward")]
    assert doc["base"]["db"] == other and doc["cand"]["run"] == "cand"
    res = run_cli("diff", "base", "cand", "--db", other)
    assert res.code == 2 and res.err.startswith("modtrace: error: no run 'cand' in ")


def test_two_ranks_of_one_run(runs_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    # rank 1 of "job" straggles in block 2
    doc = doc_of(run_cli("diff", "--db", runs_db, "job:0", "job:1", "--format", "json").out)
    assert (doc["base"]["rank"], doc["cand"]["rank"]) == (0, 1)
    assert regressions(doc) == [("Net.blocks.2.work", "forward")]
    # --rank restricts both sides; RUN:RANK overrides it for one side.
    assert run_cli("diff", "--db", runs_db, "job", "job", "--rank", "1").code == 0
    assert regressions(doc_of(run_cli("diff", "--db", runs_db, "job", "job:1", "--rank", "0", "--format", "json").out)) == [
        ("Net.blocks.2.work", "forward")
    ]
    # Without a rank, every (rank, step) is a sample of both runs.
    pooled = doc_of(run_cli("diff", "--db", runs_db, "job", "job", "--format", "json").out)
    assert pooled["base"]["steps"] == 2 * (STEPS - 1) and pooled["base"]["rank"] is None
    res = run_cli("diff", "--db", runs_db, "job:0", "job:5")
    assert res.code == 2 and res.err == "modtrace: error: run 'job' has no rank 5 (ranks: 0, 1)\n"


def test_structure_changes_on_train_tiny(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    from modtrace import Recorder

    train = runpy.run_path(str(REPO / "scripts" / "train_tiny.py"), run_name="train_tiny")
    args = ["--steps", "3", "--blocks", "2", "--d-model", "16", "--seq", "8", "--batch", "2", "--quiet", "--threads", "1"]
    for name, extra in (("plain", []), ("ckpt", ["--checkpoint"]), ("short", ["--blocks", "1"])):
        with Recorder(db=str(db_path), run=name, handle_sigterm=False) as _rec:
            train["main"](args + extra)
        _rec.wait_analyzed()  # the writer process analyses the run after the with
    res = run_cli("diff", "--db", str(db_path), "plain", "ckpt", "--format", "json", "--fail-on", "structure")
    assert res.code == 1, res.err
    doc = doc_of(res.out)
    found = [(s["kind"], s["fqn"], s["phase"]) for s in doc["structure"]]
    assert found == [
        ("phase_added", "TinyLM.blocks.0", "recompute"),
        ("phase_added", "TinyLM.blocks.1", "recompute"),
        ("order_changed", None, None),
    ]
    order = doc["order"]
    first = [e for e in order["excerpt"] if e["op"] != "="][0]
    assert first["op"] == "+" and first["cand"].split() == ["recompute", "TinyLM.blocks.1"]
    md = run_cli("diff", "--db", str(db_path), "plain", "short", "--format", "markdown", "--fail-on", "any")
    assert md.code == 1
    first, *rest = md.out.splitlines()
    assert first.startswith("## ❌ modtrace diff: ") and first.endswith(
        ", 2 structure changes: short against the base run plain"), first
    titles = [line.split(" (")[0].split(":")[0] for line in rest if line.startswith("### ")]
    # regressions (when any), structure and its call order, then what was compared, then context
    at = titles.index("### What was compared")
    assert titles[:at] in (["### Structure", "### Call order differs"],
                           ["### Regressions", "### Structure", "### Call order differs"]), titles
    # the detail does not repeat the module and phase its own columns show
    assert "| module_removed | TinyLM.blocks.1 |  | called | not called | (and 9 submodules) is not called in the candidate |" in md.out
    assert "```diff\n" in md.out and "- forward     TinyLM.blocks.1\n" in md.out


def test_usage_errors_are_one_line_exit_2(runs_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("diff", "--db", runs_db, "base", "nosuch")
    assert (res.code, res.out) == (2, "")
    assert res.err == f"modtrace: error: no run 'nosuch' in {runs_db}\n"
    assert run_cli("diff", "--db", runs_db, "base", "slow", "--format", "xml").code == 2
    assert run_cli("diff", "--db", runs_db, "base", "slow", "--phase", "sideways").code == 2
    assert run_cli("diff", "--db", runs_db, "base", "slow", "--threshold", "-1").code == 2
    assert run_cli("diff", "--db", runs_db, "base").code == 2
    missing = Path(runs_db).parent / "missing.db"
    res = run_cli("diff", "--db", str(missing), "base", "slow")
    assert res.code != 0 and res.err.startswith("modtrace: error: ") and res.err.count("\n") == 1
    assert not missing.exists()


def test_stored_calls_are_the_closed_stored_spans(tmp_path: Path, any_db: str) -> None:
    """The diff's bulk read (text packed by the database) returns exactly the stored closed spans,
    on SQLite and PostgreSQL, whole or by rank, in one window or many."""
    import polars as pl

    from modtrace.analysis.diff import CALL_SCHEMA
    from modtrace.store.analysis_store import read_span_rows
    from modtrace.store.engine import open_store
    from modtrace.store.runs import resolve_run
    from modtrace.store.samples import read_closed_calls

    record(any_db, "job", rank=0, world_size=2, steps=3)
    record(any_db, "job", {2: 300_000}, rank=1, world_size=2, steps=3)
    store = open_store(any_db)
    try:
        run = resolve_run(store, "job")
        cols = list(CALL_SCHEMA)
        stored = read_span_rows(store, run.id).filter(pl.col("duration_ns").is_not_null())
        expected = stored.select(cols).cast(CALL_SCHEMA).sort("rank", "span_id")  # type: ignore[arg-type]
        assert expected.height > 50 and expected["rank"].n_unique() == 2
        for window in (4_000_000, 7):  # 7 seqs: a window holds a few spans, many windows
            got = read_closed_calls(store, run.id, window_seq=window)
            assert got.schema == pl.Schema(CALL_SCHEMA)
            assert got.sort("rank", "span_id").equals(expected)
            one = read_closed_calls(store, run.id, rank=1, window_seq=window)
            assert one.sort("span_id").equals(expected.filter(pl.col("rank") == 1))
        assert read_closed_calls(store, run.id + 99).height == 0
    finally:
        store.dispose()


def test_a_run_never_analysed_is_diffed_from_its_events(runs_db: str, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    import shutil

    db = str(tmp_path / "copy.db")
    shutil.copy(runs_db, db)
    record(db, "raw", {1: 200_000}, analyze=False)
    stored = doc_of(run_cli("diff", "--db", db, "base", "slow", "--format", "json").out)
    raw = doc_of(run_cli("diff", "--db", db, "base", "raw", "--format", "json").out)
    assert regressions(raw) == [("Net.blocks.1.work", "forward")]
    # the same recording, analysed in memory or read back from the store, diffs the same
    assert raw["timing"] == stored["timing"]


def test_absolute_judges_absolute_times_only(runs_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    # Against the slow run, every module but the slow one takes a smaller share of the step.
    doc = doc_of(run_cli("diff", "--db", runs_db, "base", "slow", "--format", "json").out)
    assert doc["options"]["absolute"] is False
    row = doc["timing"][0]
    assert row["self_share"]["vs_rest_ratio"] == row["self"]["ratio"]  # everything else is unchanged
    assert row["self_share"]["cand_pct"] > row["self_share"]["base_pct"]
    assert [c["name"] for c in doc["step"]["checks"] if not c["passed"]] == ["history_runs"]
    absolute = doc_of(run_cli("diff", "--db", runs_db, "base", "slow", "--absolute", "--format", "json").out)
    assert absolute["options"]["absolute"] is True and regressions(absolute) == regressions(doc)
    table = run_cli("diff", "--db", runs_db, "base", "slow", "--absolute").out
    # each blamed module shows the checks that blamed it: the absolute ones, or the shares'
    assert "p_holm" in table and "level_ratio" in table and "vs_typical" not in table
    shares = run_cli("diff", "--db", runs_db, "base", "slow").out
    assert "vs_typical" in shares and "share_ratio" in shares and "p_holm" not in shares


def test_a_module_preempted_in_most_steps_is_blamed_on_its_median_too(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    """Against one base run.  A busy machine preempts block 1's work in most steps of both runs:
    the base ran it unpreempted in 3 of its 9 compared steps, the candidate (the same code) in 1.
    The candidate's level (the 10th percentile of its self time per step) is then a preempted
    step's, far above the base's, while the two medians agree: no blame.  The same candidate
    with block 1's work twice as long is blamed."""
    import sqlite3
    from statistics import median, quantiles

    from tests.helpers.diff_runs import PreemptedClock

    db = str(tmp_path / "preempted.db")
    cost, wait = 100_001, 400_000  # block 1's own work, and a preemption's wait (ns)

    def clock(work: int, quick: tuple[int, ...], seed: int) -> PreemptedClock:
        return PreemptedClock(work, wait, [i not in quick for i in range(STEPS)], jitter=0.05, seed=seed)

    record(db, "base", {1: cost}, clock=clock(cost, (2, 5, 8), 0))
    record(db, "aa", {1: cost}, clock=clock(cost, (5,), 1))
    record(db, "slow", {1: 2 * cost}, clock=clock(2 * cost, (5,), 2))
    with sqlite3.connect(db) as conn:
        def times(run: str) -> list[int]:  # block 1's work: self time per compared step
            out = [r[0] for r in conn.execute(
                "SELECT s.self_ns FROM spans s JOIN runs r ON r.id = s.run_id WHERE r.name = ? AND s.step >= 1 "
                "AND s.fqn = 'Net.blocks.1.work' AND s.phase = 'forward'", (run,))]
            assert len(out) == STEPS - 1
            return out

        base, aa = times("base"), times("aa")
    # from the stored spans: the candidate's level lies far above the base's (the level rule alone
    # would blame it), its median within 10% of the base's
    level = {name: quantiles(t, n=10, method="inclusive")[0] for name, t in (("base", base), ("aa", aa))}
    assert level["aa"] > 2 * level["base"] and abs(median(aa) / median(base) - 1) < 0.1
    res = run_cli("diff", "--db", db, "base", "aa", "--format", "json")
    doc = doc_of(res.out)
    assert (res.code, regressions(doc), doc["summary"]["improvements"]) == (0, [], 0), res.out
    res = run_cli("diff", "--db", db, "base", "slow", "--format", "json")
    assert (res.code, regressions(doc_of(res.out))) == (1, [("Net.blocks.1.work", "forward")]), res.out


def test_explain_lists_a_modules_checks_when_it_was_not_blamed(runs_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("diff", "--db", runs_db, "base", "slow", "--explain", "Net.blocks.0.work", "--explain", "Net.nosuch")
    assert res.code == 1, res.err  # the slowed block is still a regression
    lines = res.out.splitlines()
    at = lines.index("Net.blocks.0.work forward: unchanged")
    self_line, incl_line = lines[at + 1], lines[at + 2]
    assert self_line.startswith("  self time: steps ") and incl_line.startswith("  inclusive time: steps ")
    # every check of the rule, each marked; an unchanged module failed at least one
    names = [part.split()[0] for part in self_line.split(": ", 1)[1].split(", ")]
    assert names == ["steps", "level_delta_us", "share_ratio", "vs_typical", "median_ratio"]
    assert " FAIL" in self_line and " pass" in self_line
    doc = doc_of(run_cli("diff", "--db", runs_db, "base", "slow", "--format", "json").out)
    row = next(r for r in doc["timing"] if r["fqn"] == "Net.blocks.0.work" and r["phase"] == "forward")
    assert [c["passed"] for c in row["checks"]] == [part.endswith("pass") for part in self_line.split(", ")]
    assert "Net.nosuch: not compared (not called in both runs, or no such module)" in res.out
    md = run_cli("diff", "--db", runs_db, "base", "slow", "--format", "markdown", "--explain", "Net.blocks.0.work")
    assert "### Checks of Net.blocks.0.work" in md.out and "- self time: steps " in md.out


def test_too_few_steps_warn_with_the_true_minimum(runs_db: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    res = run_cli("diff", "--db", runs_db, "base", "slow", "--skip-steps", "6")
    assert res.code == 0, res.out  # nothing can be blamed on 4 compared steps per run
    text = " ".join(res.out.split())
    assert ("warning: too few steps (4 and 4 compared): the smallest p the test can reach is 0.03, not below "
            "alpha 0.01, so no module can be blamed; record at least 12 steps per run (6 compared after "
            "--skip-steps 6)") in text
