"""The public Python API (``modtrace.open``) on real recordings, SQLite and PostgreSQL."""

from __future__ import annotations

import polars as pl
import pytest

import modtrace
import modtrace.api
from modtrace.analysis import analyze_events
from modtrace.api import _cli
from modtrace.core.contracts import EVENT_FRAME, ISSUE_FRAME, SPAN_COUNTS, SPAN_FRAME, SPAN_MEMORY
from modtrace.core.errors import RunNotFound, UsageError
from tests.helpers.diff_runs import STEPS, record


def _analysis(db: modtrace.api.Database, run: str) -> str:
    """What the runs frame says of the run's stored analysis."""
    return str(db.runs().filter(pl.col("name") == run)["analysis"].item())


@pytest.fixture
def recorded(any_db: str) -> str:
    record(any_db, "base")
    record(any_db, "slow", {1: 200_000})  # twice as slow: 1.5x sits at the share threshold
    record(any_db, "raw", steps=3, analyze=False)  # events only: never analysed
    return any_db


def test_runs_and_run_references(recorded: str) -> None:
    with modtrace.open(recorded) as db:
        runs = db.runs()
        assert runs["name"].to_list() == ["raw", "slow", "base"]
        assert runs["status"].to_list() == ["completed"] * 3
        assert db.run("@") == db.run("raw") == db.run(int(runs["id"][0]))
        assert db.run("@~2").name == "base"
        assert db.run("base").details["steps"] == STEPS
        assert db.events("base")["rank"].unique().to_list() == [0]
        with pytest.raises(RunNotFound):
            db.run("nope")


def test_frames_follow_the_contracts_and_match_the_analysis_of_the_events(recorded: str) -> None:
    with modtrace.open(recorded) as db:
        events = db.events("base")
        spans, issues = db.spans("base"), db.issues("base")
        assert events.schema == pl.Schema(EVENT_FRAME.polars())
        assert spans.schema == pl.Schema({**SPAN_FRAME.polars(), **SPAN_COUNTS.polars(), **SPAN_MEMORY.polars()})
        assert issues.schema == pl.Schema(ISSUE_FRAME.polars())
        assert _analysis(db, "base") == "stored"
        # the stored analysis is what analysing the events gives
        computed = analyze_events(events, *_lookups(db, "base"))
        assert spans.drop(*SPAN_COUNTS.names, *SPAN_MEMORY.names).sort("rank", "span_id").equals(
            computed.spans.sort("rank", "span_id"))
        assert spans.height * 2 == events.height


def _lookups(db: modtrace.api.Database, run: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    from modtrace.store.reader import read_devices, read_modules

    ref = db.run(run)
    return read_modules(db._store, ref.id), read_devices(db._store, ref.id)


def test_a_run_never_analysed_is_computed_without_writing_until_analyze(recorded: str) -> None:
    with modtrace.open(recorded) as db:
        assert _analysis(db, "raw") == "none"
        spans = db.spans("raw")
        assert spans.height > 0 and spans.height * 2 == db.events("raw").height
        assert _analysis(db, "raw") == "none"  # reading computed it, wrote nothing
        done = db.analyze("raw")
        assert done.run.name == "raw" and done.spans == spans.height
        assert done.issues.filter(pl.col("severity") != "info").height == 0
        assert _analysis(db, "raw") == "stored"
        assert db.spans("raw").sort("span_id").equals(spans.sort("span_id"))


def test_tree_filters_and_refuses_what_is_not_there(recorded: str) -> None:
    with modtrace.open(recorded) as db:
        tree = db.tree("base", phase="forward")
        assert tree.height > 0
        assert set(tree["phase"].to_list()) == {"forward"}
        assert "Net.blocks.1.work" in tree["fqn"].to_list()
        shallow = db.tree("base", max_depth=0)
        assert set(shallow["level"].to_list()) == {0}
        assert db.tree("base", step=2).height > 0
        with pytest.raises(UsageError, match="no spans on rank 3"):
            db.tree("base", rank=3)
        with pytest.raises(UsageError, match="no spans in step 99"):
            db.tree("base", step=99)
        with pytest.raises(UsageError, match="phase 'sideways'"):
            db.tree("base", phase="sideways")


def test_diff_blames_the_slower_module_and_is_typed(recorded: str) -> None:
    with modtrace.open(recorded) as db:
        result = db.diff("base", "slow")
        assert isinstance(result, modtrace.api.DiffResult)
        blamed = result.timing.filter(pl.col("verdict") == "regression")
        assert ("Net.blocks.1.work", "forward") in list(zip(blamed["fqn"], blamed["phase"], strict=True))
        same = db.diff("base", "base")
        assert same.timing.filter(pl.col("verdict") == "regression").height == 0
        # a run never analysed is diffed from its events
        assert db.diff("base", "raw").summary.cand_steps


def test_event_log_and_spans_table_carry_names_and_wall_clock(recorded: str) -> None:
    with modtrace.open(recorded) as db:
        log = db.events("base", named=True)
        anchors = _cli.anchors(db, "base")
        assert log.height == db.events("base").height
        assert set(log["kind"].unique().to_list()) == {"enter", "exit"}
        assert (log["wall_ns"] - log["ts_ns"]).unique().to_list() == [anchors[0]]
        table = db.spans("base", named=True)
        assert table["phase"].dtype == pl.String and table["status"].null_count() == 0


def test_schema_and_query_helpers(recorded: str) -> None:
    assert modtrace.api.current_revision(recorded).state == "head"
    assert modtrace.api.check_schema(recorded)
    names = [q.name for q in modtrace.api.query_library()]
    assert names
    result = modtrace.api.query(recorded, "SELECT name FROM runs ORDER BY id")
    assert [r[0] for r in result.rows] == ["base", "slow", "raw"]


def test_importing_the_api_stays_light() -> None:
    import subprocess
    import sys

    code = "import sys, modtrace, modtrace.api; modtrace.open; print(' '.join(sorted(sys.modules)))"
    names = set(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split())
    assert "modtrace.api" in names
    heavy = ("torch", "polars", "alembic", "sqlalchemy.orm")
    assert sorted(n for n in names if any(n == h or n.startswith(h + ".") for h in heavy)) == []


def test_the_database_is_a_small_documented_product() -> None:
    """At most fourteen public members, each with a docstring; the methods name their parameters
    and show an example (numpydoc), and none of them speaks of the command line's flags."""
    import inspect
    import re

    from modtrace.api import Database

    members = {name: value for name, value in vars(Database).items() if not name.startswith("_")}
    assert len(members) <= 14, sorted(members)
    for name, value in members.items():
        doc = inspect.getdoc(value.fget if isinstance(value, property) else value)
        assert doc, name
        assert not re.search(r"--[a-z]", doc), f"{name} speaks of a CLI flag"
        if callable(value) and len(inspect.signature(value).parameters) > 1:
            assert "Examples" in doc or "Parameters" in doc, name
    assert set(modtrace.api.__all__) >= {"Database", "Run", "open", "query", "upgrade"}
    assert not {n for n in modtrace.api.__all__ if "like_with_like" in n or n.startswith("preload")}


def test_errors_speak_of_the_api_and_the_cli_of_its_options(recorded: str, run_cli) -> None:  # type: ignore[no-untyped-def]
    """One error, two wordings: the API's names its parameters, the command line its options."""
    import pytest

    from modtrace.core.errors import UsageError

    with modtrace.open(recorded) as db, pytest.raises(UsageError) as raised:
        db.tree("base", step_kind="nope")
    assert str(raised.value).startswith("step_kind='nope': run 'base' has no steps of that kind"), raised.value
    assert "--" not in str(raised.value)
    cli = run_cli("tree", "base", "--db", recorded, "--step-kind", "nope")
    assert cli.code == 2 and cli.err.startswith("modtrace: error: --step-kind nope: run 'base' has no steps"), cli
    with modtrace.open(recorded) as db, pytest.raises(UsageError) as raised:
        db.spans("base", clock="device")
    assert str(raised.value).startswith("clock='device': run 'base' has no device times"), raised.value
