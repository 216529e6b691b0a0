"""Ranks of one torchrun launch record into one run: 2 real processes, gloo on CPU.

Note the option spelling: torchrun's own parser rejects ``--run`` anywhere on
its command line (``torchrun: error: ambiguous option: --run could match
--run-path, --run_path``, from argparse's prefix matching, before modtrace
starts), so under torchrun the run is named with ``--run-name`` -- or not at
all, and the ranks derive one shared name from the launch.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from modtrace.store.engine import open_store
from modtrace.store.runs import list_runs, run_details
from tests.helpers.ports import free_port

REPO = Path(__file__).resolve().parents[2]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]

pytestmark = pytest.mark.slow


def launch(db: str, *record_args: str) -> subprocess.CompletedProcess[str]:
    cmd = [
        *TORCHRUN, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        "-m", "modtrace", "record", "--db", db, *record_args,
        "scripts/train_tiny.py", "--steps", "2", "--distributed", "--threads", "1", "--quiet",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def check_one_run_two_ranks(db: str, name_pattern: str, out: subprocess.CompletedProcess[str]) -> None:
    assert out.returncode == 0, out.stderr
    assert "locked" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    store = open_store(db)
    try:
        rows = list_runs(store)
        assert len(rows) == 1, rows
        run = rows[0]
        assert re.fullmatch(name_pattern, run["name"]), run["name"]
        info = run_details(store, run["id"])
        with store.engine.connect() as conn:
            per_rank = dict(
                conn.execute(sa.text(f"SELECT rank, count(*) FROM events WHERE run_id = {run['id']} GROUP BY rank")).all()
            )
            steps = dict(conn.execute(sa.text(f"SELECT rank, max(step) FROM events WHERE run_id = {run['id']} GROUP BY rank")).all())
            gaps = conn.execute(
                sa.text(f"SELECT rank, count(*), min(seq), max(seq) FROM events WHERE run_id = {run['id']} GROUP BY rank")
            ).all()
    finally:
        store.dispose()
    assert info["status"] == "completed" and info["world_size"] == 2 and info["ranks"] == 2
    assert info["command"].startswith("modtrace record --db ")
    ranks = {r["rank"]: r for r in info["rank_details"]}
    assert sorted(ranks) == [0, 1]
    assert ranks[0]["pid"] != ranks[1]["pid"]
    for rank in (0, 1):
        # Every event the rank counted is in the table (no lost rows), under its own rank.
        assert per_rank[rank] == ranks[rank]["events"] > 0
        assert ranks[rank]["status"] == "completed" and ranks[rank]["steps"] == 2
        assert steps[rank] == 1  # steps 0 and 1, advanced by the optimizer hook
    # Each rank stored its analysis as it ended, the two maybe at once: the run reads stored.
    assert info["analysis"] == "stored" and [ranks[r]["analysis"] for r in (0, 1)] == ["stored", "stored"]
    # The same model on both ranks records the same number of events; seq is dense per rank.
    assert per_rank[0] == per_rank[1]
    for _rank, n, lo, hi in gaps:
        assert hi - lo + 1 == n
    # Only rank 0 prints the training log; both ranks print their summary line.
    assert out.stdout.count("done: 2 steps") == 1
    assert len(re.findall(r"modtrace: rank [01]: run '.*' \(id \d+\) completed", out.stderr)) == 2


def test_two_ranks_record_one_run_in_one_sqlite_file(tmp_path: Path) -> None:
    db = str(tmp_path / "ranks.db")
    out = launch(db)  # no name: both ranks derive the launch's shared name
    check_one_run_two_ranks(db, r"train_tiny-\d{8}-\d{6}-\d+", out)


@pytest.mark.postgres
def test_two_ranks_record_one_run_in_postgres(pg_url: str) -> None:
    out = launch(pg_url, "--run-name", "R", "--tag", "launch=torchrun")
    check_one_run_two_ranks(pg_url, "R", out)
