"""Many writers, and readers during a recording: real processes on one database.

- 4 ``modtrace record`` processes start together on one SQLite file that
  does not exist yet (they race to create it), each flushing after every
  step: all succeed, no lock error reaches the user, and every run holds
  exactly the forward calls its program counted with hooks of its own.
- 8 torchrun ranks (gloo on CPU) record one run into PostgreSQL.
- While a recording is being written, ``modtrace runs``, ``show``,
  ``tree`` and ``check`` answer, and read commands write nothing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.helpers.ports import free_port

REPO = Path(__file__).resolve().parents[2]

# Trains until it has done ``steps`` steps (or, with a stop file, until that file exists),
# counting forward calls with its own global hooks; prints READY after 5 steps.
TARGET = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import torch.nn.modules.module as module_hooks
    from torch import nn

    steps, count_path = int(sys.argv[1]), sys.argv[2]
    stop = sys.argv[3] if len(sys.argv) > 3 else None
    counts = {"enter": 0, "exit": 0, "steps": 0}

    def count_enter(module, args):
        counts["enter"] += 1

    def count_exit(module, args, output):
        counts["exit"] += 1

    module_hooks.register_module_forward_pre_hook(count_enter)
    module_hooks.register_module_forward_hook(count_exit, always_call=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Sequential(nn.Linear(16, 16), nn.Tanh()), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        while True:
            model(torch.randn(4, 8)).sum().backward()
            opt.step()
            counts["steps"] += 1
            if counts["steps"] == 5:
                print("READY", flush=True)
            if stop is not None:
                if os.path.exists(stop):
                    break
            elif counts["steps"] >= steps:
                break
    finally:
        with open(count_path, "w") as fh:
            json.dump(counts, fh)
    """
)


def record(cwd: Path, db: str, run: str, *target_args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "modtrace", "record", "--db", db, "--run", run, "target.py", *target_args],
        cwd=cwd, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def facts(db: str, run: str) -> dict[str, Any]:
    """The run's rows counted in SQL, independently of modtrace's reader."""
    url = db if "://" in db else f"sqlite:///{db}"
    engine = sa.create_engine(url, poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            run_id, status = conn.execute(sa.text("SELECT id, status FROM runs WHERE name = :n"), {"n": run}).one()
            per_rank = conn.execute(sa.text(
                "SELECT e.rank, count(*), min(e.seq), max(e.seq), r.event_count, r.status, "
                "sum(CASE WHEN e.kind = 0 AND e.phase = 0 THEN 1 ELSE 0 END), "
                "sum(CASE WHEN e.kind = 1 AND e.phase = 0 THEN 1 ELSE 0 END) "
                "FROM events e JOIN run_ranks r ON r.run_id = e.run_id AND r.rank = e.rank "
                "WHERE e.run_id = :r GROUP BY e.rank, r.event_count, r.status ORDER BY e.rank"), {"r": run_id}).all()
    finally:
        engine.dispose()
    return {"id": run_id, "status": status,
            "ranks": {int(r[0]): {"rows": r[1], "lo": r[2], "hi": r[3], "event_count": r[4], "status": r[5],
                                  "fwd_enter": r[6], "fwd_exit": r[7]} for r in per_rank}}


def test_four_processes_record_into_one_new_sqlite_file(tmp_path: Path) -> None:
    (tmp_path / "target.py").write_text(TARGET)
    db = str(tmp_path / "shared.db")  # does not exist: the four race to create it
    procs = {f"p{i}": record(tmp_path, db, f"p{i}", "120", str(tmp_path / f"p{i}.json")) for i in range(4)}
    outs = {name: p.communicate(timeout=300) for name, p in procs.items()}
    for name, p in procs.items():
        out, err = outs[name]
        assert p.returncode == 0, err
        assert "locked" not in err and "Traceback" not in err and "error" not in err, err
        assert re.fullmatch(rf"modtrace: run '{name}' \(id \d+\) completed: [\d,]+ events, 120 steps\n", err), err
    for name in procs:
        counted = json.loads((tmp_path / f"{name}.json").read_text())
        got = facts(db, name)
        assert got["status"] == "completed"
        (rank,) = got["ranks"].values()
        assert rank["rows"] == rank["event_count"]  # no lost rows
        assert (rank["lo"], rank["hi"]) == (0, rank["rows"] - 1)  # seq dense 0..n-1
        assert rank["fwd_enter"] == rank["fwd_exit"] == counted["enter"] == counted["exit"] == 120 * 7
    engine = sa.create_engine(f"sqlite:///{db}", poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA integrity_check").scalar() == "ok"
            assert conn.exec_driver_sql("SELECT count(*) FROM runs").scalar() == 4
    finally:
        engine.dispose()


def test_readers_answer_while_a_recording_is_written(tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "target.py").write_text(TARGET)
    db = str(tmp_path / "live.db")
    stop = tmp_path / "stop"
    proc = record(tmp_path, db, "live", "0", str(tmp_path / "live.json"), str(stop))
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "READY\n", proc.stderr
        deadline = time.monotonic() + 60
        while True:  # READY comes after 5 steps; their first batch may still be on its way
            runs = run_cli("runs", "--db", db, "--format", "json")
            if runs.code == 0 and json.loads(runs.out) and json.loads(runs.out)[0]["events"] > 0:
                break
            assert time.monotonic() < deadline, f"nothing flushed within 60 s: {runs}"
            time.sleep(0.05)
        seen_steps = []
        for _ in range(3):  # each round reads while the recorder keeps flushing
            runs = run_cli("runs", "--db", db, "--format", "json")
            assert runs.code == 0, runs
            (row,) = json.loads(runs.out)
            assert (row["name"], row["status"]) == ("live", "running") and row["events"] > 0
            seen_steps.append(row["steps"])
            shown = run_cli("show", "live", "--db", db, "--format", "json")
            assert shown.code == 0 and json.loads(shown.out)["status"] == "running", shown
            tree = run_cli("tree", "live", "--db", db, "--full-names")
            assert tree.code == 0, tree
            assert re.search(r"^Sequential\s+Sequential\s+forward\s+\d+", tree.out, re.M), tree.out
            assert re.search(r"^    Sequential\.2\.0\s+Linear\s+forward", tree.out, re.M), tree.out
            check = run_cli("check", "live", "--db", db, "--format", "json")
            assert check.code == 0, check  # calls open at the moment of reading are warnings of a running run
            assert all(i["severity"] != "error" for i in json.loads(check.out))
        # The recording went on while we read (the reads did not block it).
        assert seen_steps[-1] > seen_steps[0], seen_steps
        # Read commands computed on the fly: nothing was stored.
        conn = sa.create_engine(f"sqlite:///{db}", poolclass=sa.pool.NullPool)
        try:
            with conn.connect() as c:
                assert c.exec_driver_sql("SELECT count(*) FROM span_rows").scalar() == 0
                assert c.exec_driver_sql("SELECT count(*) FROM nesting_issues").scalar() == 0
        finally:
            conn.dispose()
    finally:
        stop.touch()
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    counted = json.loads((tmp_path / "live.json").read_text())
    (rank,) = facts(db, "live")["ranks"].values()
    assert rank["rows"] == rank["event_count"] and rank["fwd_enter"] == counted["enter"] == 7 * counted["steps"]


@pytest.mark.slow
@pytest.mark.postgres
def test_eight_torchrun_ranks_record_one_run_into_postgres(pg_url: str) -> None:
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "8", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), "-m", "modtrace", "record", "--run-name", "eight", "--db", pg_url,
        "scripts/train_tiny.py", "--steps", "2", "--distributed", "--threads", "1", "--quiet",
        "--blocks", "1", "--d-model", "16", "--heads", "2", "--seq", "8", "--batch", "2", "--vocab", "32",
    ]
    out = subprocess.run(cmd, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                         timeout=400)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "locked" not in out.stderr and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert len(re.findall(r"modtrace: rank [0-7]: run 'eight' \(id \d+\) completed", out.stderr)) == 8, out.stderr
    got = facts(pg_url, "eight")
    assert got["status"] == "completed"
    assert sorted(got["ranks"]) == list(range(8))
    counts = set()
    for rank in got["ranks"].values():
        assert rank["status"] == "completed"
        assert rank["rows"] == rank["event_count"] > 0  # no lost rows
        assert (rank["lo"], rank["hi"]) == (0, rank["rows"] - 1)  # seq order per rank intact
        assert rank["fwd_enter"] == rank["fwd_exit"]
        counts.add(rank["rows"])
    assert len(counts) == 1  # the same model on every rank: the same events


@pytest.mark.slow
@pytest.mark.postgres
def test_two_nodes_record_one_run_into_postgres_through_modtrace_db(pg_url: str) -> None:
    """A multi-node launch as each node runs it: one torchrun per node (here both on this
    host, separate launchers), MODTRACE_DB naming the shared server, one --run-name."""
    port = str(free_port())
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MODTRACE_DB": pg_url}
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
             "--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", port,
             "-m", "modtrace", "record", "--run-name", "multinode",
             "scripts/train_tiny.py", "--steps", "2", "--distributed", "--threads", "1", "--quiet",
             "--blocks", "1", "--d-model", "16", "--heads", "2", "--seq", "8", "--batch", "2", "--vocab", "32"],
            cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        for node in (0, 1)
    ]
    outs = [p.communicate(timeout=300) for p in nodes]
    for p, (_, err) in zip(nodes, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
        assert re.search(r"modtrace: rank [01]: run 'multinode' \(id \d+\) completed", err), err[-3000:]
    got = facts(pg_url, "multinode")
    assert got["status"] == "completed" and sorted(got["ranks"]) == [0, 1]
    for rank in got["ranks"].values():
        assert rank["rows"] == rank["event_count"] > 0 and (rank["lo"], rank["hi"]) == (0, rank["rows"] - 1)
    assert got["ranks"][0]["rows"] == got["ranks"][1]["rows"]
