"""``modtrace delete`` and ``modtrace runs --tag/--status`` on real recordings, SQLite and PostgreSQL.

The oracle for "every row of the run" is the database's own catalog: every table that has a
``run_id`` column (``runs`` by its ``id``), listed by SQLAlchemy's inspector, not modtrace's list.
"""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
import torch

import modtrace
from modtrace.store.engine import open_store
from modtrace.store.runs import add_rank, create_run, finish_rank
from modtrace.store.schema import run_ranks
from tests.helpers.device_clock import FakeDeviceClock
from tests.helpers.device_recording import DeviceNet, train_on_device
from tests.helpers.models import Net
from tests.helpers.recording import FakeClock
from tests.helpers.training import record_training

REPO = Path(__file__).resolve().parents[2]
OLD = "2026-01-01T00:00:00.000000Z"
# A Net recorded: checkpoint recompute (its nesting issues), a stored analysis and tree.
NET: dict[str, Any] = {"model": Net, "inputs": lambda _: torch.ones(2, 4), "handle_sigterm": False}


def _device_run(db: str, run: str) -> None:
    """Device times (device_events, span_device_rows) and a stored analysis and tree."""
    device = FakeDeviceClock()
    with modtrace.Recorder(db=db, run=run, device_clock=device, clock=FakeClock(), writer="thread",
                           tags={"branch": "main"}) as rec:
        train_on_device(rec, DeviceNet(device, None), device, 3, 50_000)
    rec.wait_analyzed()


def rows_per_run(db: str) -> dict[tuple[str, int], int]:
    """(table, run id) -> rows, for every table of the database keyed by run."""
    store = open_store(db)
    try:
        with store.engine.connect() as conn:
            inspector = sa.inspect(conn)
            out: dict[tuple[str, int], int] = {}
            for table in inspector.get_table_names():
                columns = {c["name"] for c in inspector.get_columns(table)}
                key = "id" if table == "runs" else "run_id" if "run_id" in columns else None
                if key is None:
                    continue
                for run_id, n in conn.exec_driver_sql(f"SELECT {key}, COUNT(*) FROM {table} GROUP BY {key}"):
                    out[(table, int(run_id))] = int(n)
    finally:
        store.dispose()
    return out


def run_ids(db: str) -> dict[str, int]:
    with modtrace.open(db) as database:
        return dict(zip(database.runs()["name"].to_list(), database.runs()["id"].to_list(), strict=True))


@pytest.fixture
def recorded(any_db: str) -> str:
    _device_run(any_db, "gpu")
    record_training(any_db, "ckpt", 3, **NET, tags={"branch": "main", "seed": "1"}, speed_probe=True)
    record_training(any_db, "keep", 3, **NET, tags={"branch": "dev"})
    return any_db


def test_delete_leaves_no_orphan_row_and_other_runs_untouched(recorded: str, run_cli: Any) -> None:
    db = recorded
    ids = run_ids(db)
    before = rows_per_run(db)
    gone = {ids["gpu"], ids["ckpt"]}
    tables = {t for t, _ in before}
    # The two deleted runs between them have rows in every table keyed by run, so each is checked.
    assert {t for t, r in before if r in gone} == tables, tables - {t for t, r in before if r in gone}
    assert {"events", "span_rows", "span_device_rows", "device_events", "nesting_issues", "tree_nodes",
            "root_calls", "modules", "threads", "devices", "run_ranks", "runs", "step_speeds"} <= tables

    res = run_cli("delete", "gpu", "ckpt", "--db", db, "--yes")
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    assert [line.split(":")[0] for line in lines] == [f"deleted run 'gpu' (id {ids['gpu']}, completed)",
                                                      f"deleted run 'ckpt' (id {ids['ckpt']}, completed)"]
    for line, name in zip(lines, ("gpu", "ckpt"), strict=True):
        total = sum(n for (_, r), n in before.items() if r == ids[name])
        assert f": {total:,} rows (" in line, line
        events = before[("events", ids[name])]
        assert f"{events:,} events" in line, line

    after = rows_per_run(db)
    assert [k for k in after if k[1] in gone] == []
    assert after == {k: n for k, n in before.items() if k[1] not in gone}
    # what is left still reads as before
    assert run_cli("tree", "keep", "--db", db).code == 0
    assert run_cli("check", "keep", "--db", db).code == 0
    assert run_cli("show", "gpu", "--db", db).code == 2


def test_retention_older_than_with_a_tag(any_db: str, run_cli: Any) -> None:
    store = open_store(any_db, create=True)
    try:
        for name, started, tags in (("old-main", OLD, {"branch": "main"}), ("old-dev", OLD, {"branch": "dev"}),
                                    ("new-main", None, {"branch": "main"})):
            meta: dict[str, Any] = {"tags": tags}
            if started:
                meta["started_at"] = started
            run_id, _ = create_run(store, name, meta)
            add_rank(store, run_id, 0, wall_anchor_ns=0)
            finish_rank(store, run_id, 0, "completed")
    finally:
        store.dispose()
    res = run_cli("delete", "--db", any_db, "--older-than", "30d", "--tag", "branch=main", "--yes")
    assert res.code == 0, res.err
    assert res.out.startswith("deleted run 'old-main' ") and res.out.count("\n") == 1
    assert sorted(run_ids(any_db)) == ["new-main", "old-dev"]
    # nothing left to take: not an error, a note
    res = run_cli("delete", "--db", any_db, "--older-than", "30d", "--tag", "branch=main", "--yes")
    assert (res.code, res.out) == (0, "")
    assert res.err == f"modtrace: no run matches tag branch=main, older than 30d in {any_db}; nothing deleted\n"
    # filters on their own select too
    assert run_cli("delete", "--db", any_db, "--tag", "branch=dev", "--yes").code == 0
    assert sorted(run_ids(any_db)) == ["new-main"]


@pytest.mark.parametrize(("args", "message"), [
    ((), "name the runs to delete (RUN...) or select them with --older-than, --tag or --status"),
    (("--older-than", "30 days"), "age '30 days': write a number and a unit, s, m, h, d or w (e.g. 30d, 12h)"),
    (("--older-than", "d30"), "age 'd30': write a number and a unit, s, m, h, d or w (e.g. 30d, 12h)"),
    (("--tag", "branch"), "tag 'branch': write KEY=VALUE, e.g. branch=main"),
    (("--tag", "=main"), "tag '=main': write KEY=VALUE, e.g. branch=main"),
    (("keep", "--tag", "branch=dev"), "give runs (RUN...) or filters (--older-than, --tag, --status), not both"),
    (("nosuch",), "no run 'nosuch' in {db}"),
    (("keep",), "deleting 1 run needs --yes when stdin is not a terminal"),
    (("keep", "--status", "lost", "--yes"), None),
])
def test_bad_selectors_are_one_line_exit_2_and_delete_nothing(recorded: str, run_cli: Any, args: tuple[str, ...],
                                                               message: str | None) -> None:
    before = rows_per_run(recorded)
    res = run_cli("delete", "--db", recorded, *args)
    assert (res.code, res.out) == (2, ""), res
    assert res.err.count("\n") == 1 and res.err.startswith("modtrace: error: "), res.err
    if message is not None:
        assert res.err == f"modtrace: error: {message.format(db=recorded)}\n"
    assert rows_per_run(recorded) == before


def _live_run(db: str, name: str) -> int:
    """A run marked running whose rank's process is this test's (alive)."""
    store = open_store(db, create=True)
    try:
        run_id, _ = create_run(store, name, {})
        add_rank(store, run_id, 0, wall_anchor_ns=0)
    finally:
        store.dispose()
    return run_id


def test_a_run_still_recording_is_refused_unless_force_and_nothing_else_goes(recorded: str, run_cli: Any) -> None:
    live = _live_run(recorded, "live")
    before = rows_per_run(recorded)
    res = run_cli("delete", "live", "keep", "--db", recorded, "--yes")
    assert (res.code, res.out) == (2, "")
    assert res.err == (f"modtrace: error: run 'live' (id {live}) is still recording (status running, its process "
                       "alive); nothing deleted (force deletes it anyway)\n")
    assert rows_per_run(recorded) == before  # one transaction: 'keep' is still there too
    res = run_cli("delete", "live", "keep", "--db", recorded, "--yes", "--force")
    assert res.code == 0, res.err
    assert "'live'" not in run_ids(recorded) and "keep" not in run_ids(recorded)


def test_a_run_whose_process_is_gone_needs_no_force(recorded: str, run_cli: Any) -> None:
    run_id = _live_run(recorded, "crashed")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    store = open_store(recorded)
    try:
        with store.engine.begin() as conn:
            conn.execute(sa.update(run_ranks).where(run_ranks.c.run_id == run_id).values(pid=gone.pid))
    finally:
        store.dispose()
    res = run_cli("delete", "crashed", "--db", recorded, "--yes")
    assert res.code == 0 and res.out.startswith(f"deleted run 'crashed' (id {run_id}, incomplete): "), res


def test_on_a_terminal_delete_asks_first(db_path: Path) -> None:
    db = str(db_path)
    record_training(db, "a", 3, **NET, tags={})
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}

    def answer(text: str) -> tuple[int, str]:
        master, slave = pty.openpty()
        try:
            proc = subprocess.Popen([sys.executable, "-m", "modtrace", "delete", "a", "--db", db], stdin=slave,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
            os.write(master, text.encode())
            out, err = proc.communicate(timeout=120)
        finally:
            os.close(master)
            os.close(slave)
        return proc.returncode, out + err

    code, text = answer("n\n")
    assert code == 1 and "about to delete 1 run from" in text and "'a' (id 1, completed)" in text, text
    assert "nothing deleted" in text and run_ids(db) == {"a": 1}
    code, text = answer("y\n")
    assert code == 0 and "deleted run 'a' (id 1, completed): " in text, text
    assert run_ids(db) == {}


def test_runs_filters_by_tag_and_status_and_shows_tags(recorded: str, run_cli: Any) -> None:
    _live_run(recorded, "live")
    listed = json.loads(run_cli("runs", "--db", recorded, "--tag", "branch=main", "--format", "json").out)
    assert [(r["name"], r["tags"]) for r in listed] == [("ckpt", {"branch": "main", "seed": "1"}),
                                                        ("gpu", {"branch": "main"})]
    both = run_cli("runs", "--db", recorded, "--tag", "branch=main", "--tag", "seed=1").out.splitlines()
    assert [line.split()[1] for line in both[1:]] == ["ckpt"] and both[1].split()[-1] == "branch=main,seed=1"
    assert both[0].split()[-1] == "tags"
    running = json.loads(run_cli("runs", "--db", recorded, "--status", "running", "--format", "json").out)
    assert [r["name"] for r in running] == ["live"]
    none = run_cli("runs", "--db", recorded, "--tag", "branch=nosuch")
    assert (none.code, none.out) == (0, f"no runs with tag branch=nosuch in {recorded}\n")
    assert run_cli("runs", "--db", recorded, "--tag", "branch=main", "--limit", "1", "--format", "csv").out.splitlines()[1:] \
        == [line for line in run_cli("runs", "--db", recorded, "--tag", "branch=main", "--format", "csv").out.splitlines()[1:2]]
    bad = run_cli("runs", "--db", recorded, "--tag", "branch")
    assert (bad.code, bad.err) == (2, "modtrace: error: tag 'branch': write KEY=VALUE, e.g. branch=main\n")
    assert run_cli("runs", "--db", recorded, "--status", "lost").code == 2


def test_the_api_selects_and_deletes(recorded: str) -> None:
    import polars as pl

    from modtrace.core.errors import UsageError

    with modtrace.open(recorded) as db:
        main = db.runs(tags={"branch": "main"})
        assert main["name"].to_list() == ["ckpt", "gpu"]
        assert main.filter(pl.col("name") == "ckpt")["tags"].to_list() == [
            [{"key": "branch", "value": "main"}, {"key": "seed", "value": "1"}]]
        assert db.runs(status="completed").height == 3 and db.runs(older_than="1d").height == 0
        with pytest.raises(UsageError):
            db.runs(older_than="soon")
        gone = db.delete(main["id"].to_list())
        assert [(d.name, d.rows["runs"]) for d in gone] == [("gpu", 1), ("ckpt", 1)]
        assert db.runs()["name"].to_list() == ["keep"]
