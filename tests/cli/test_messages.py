"""Messages that say what is wrong and what exists: export to stdout, close run names only,
the recorded steps of a scheduled run, and a query parameter that names a run but binds as text."""

from __future__ import annotations

from pathlib import Path

import modtrace
from tests.helpers.recording import FakeClock
from tests.helpers.training import record_training


def test_stdout_export_messages_name_what_does_work(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    record_training(str(db_path), "toy", 1, clock=FakeClock(), handle_sigterm=False)
    parquet = run_cli("export", "toy", "--format", "parquet", "--what", "spans", "-o", "-")
    assert (parquet.code, parquet.out) == (2, "")
    # Perfetto writes to stdout, so the message must not claim only csv does.
    assert "perfetto" in parquet.err and "needs --format csv" not in parquet.err
    both = run_cli("export", "toy", "--format", "csv", "-o", "-")
    assert (both.code, both.err) == (2, "modtrace: error: -o - (stdout) takes one table: add --what spans or --what events\n")
    assert run_cli("export", "toy", "-o", "-").code == 0  # what the parquet message offers works


def test_unknown_run_suggests_only_close_names(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    for name in ("sched", "baseline"):
        record_training(str(db_path), name, 1, clock=FakeClock(), handle_sigterm=False)
    far = run_cli("tree", "nosuch")
    assert far.code == 2
    assert far.err == f"modtrace: error: no run 'nosuch' in {db_path}\n", far.err
    typo = run_cli("tree", "baselin")
    assert typo.code == 2 and typo.err.endswith("; did you mean 'baseline'?\n")


def test_a_missing_step_names_the_recorded_steps(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    # two windows of two recorded steps, with a gap between them
    record_training(str(db_path), "sched", 8, clock=FakeClock(), handle_sigterm=False,
                    schedule="skip_first=2,wait=1,active=2,repeat=2")
    with modtrace.open(str(db_path)) as database:
        recorded = sorted(r[0] for r in database.spans("sched").select("step").unique().rows())
    assert len(recorded) == 4 and recorded[1] == recorded[0] + 1 and recorded[2] > recorded[1] + 1, recorded
    shown = f"{recorded[0]}-{recorded[1]}, {recorded[2]}-{recorded[3]}"
    res = run_cli("tree", "sched", "--step", str(recorded[1] + 1))
    assert res.code == 2
    assert res.err == f"modtrace: error: run sched has no spans in step {recorded[1] + 1}; its steps are {shown}\n"
    assert run_cli("tree", "sched", "--step", str(recorded[0])).code == 0


def test_a_text_parameter_that_names_a_run_is_pointed_out(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    record_training(str(db_path), "baseline", 1, clock=FakeClock(), handle_sigterm=False)
    sql = "SELECT COUNT(*) AS n FROM spans WHERE run_id = :rid HAVING COUNT(*) > 0"
    res = run_cli("query", sql, "-p", "rid=baseline")
    assert res.code == 0 and res.out.split() == ["n"]
    assert res.err == (
        "modtrace: note: no rows: :rid was bound as the text 'baseline', not as run 'baseline' (id 1); only "
        "parameters named run_id or ending in _run take a run reference (give --param rid=1 for its id)\n"
    )
    by_id = run_cli("query", sql, "-p", "rid=1")
    assert by_id.code == 0 and by_id.err == "" and by_id.out.split()[0] == "n"
    unrelated = run_cli("query", sql, "-p", "rid=nothing")
    assert unrelated.err == ""  # a word that names no run is the user's own business
