"""Load: many writers into one database at once, tiny models, real processes.

8 concurrent ``modtrace record`` processes into one SQLite file, and 16
torchrun ranks into PostgreSQL: each process counts its own module calls
with a global hook of its own; every run holds exactly twice that many
events (enter and exit), seqs without gaps or repeats, status completed,
``check`` clean.  The wall time of each launch is printed (run with ``-s``
to see it); it is a measurement, not an assertion.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.helpers.ports import free_port

pytestmark = pytest.mark.slow

TARGET = textwrap.dedent(
    """
    import os, sys, torch
    from torch import nn
    torch.set_num_threads(1)
    calls = [0]
    def count(module, args, out):
        calls[0] += 1
    nn.modules.module.register_module_forward_hook(count)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(10)])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(int(sys.argv[2])):
        with torch.no_grad():
            model(torch.ones(2, 8))
        opt.step()  # a step boundary
    with open(os.path.join(sys.argv[1], f"count-{os.environ.get('RANK', sys.argv[3] if len(sys.argv) > 3 else '0')}"), "w") as fh:
        fh.write(str(calls[0]))
    """
)


def per_rank(url: str) -> dict[tuple[str, int], tuple[int, int, int, int, str]]:
    engine = sa.create_engine(url if "://" in url else f"sqlite:///{url}", poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT r.name, e.rank, COUNT(*), COUNT(DISTINCT e.seq), MAX(e.seq), "
            "(SELECT event_count FROM run_ranks k WHERE k.run_id = r.id AND k.rank = e.rank), r.status "
            "FROM events e JOIN runs r ON r.id = e.run_id GROUP BY r.id, r.name, e.rank, r.status").all()
    engine.dispose()
    return {(r[0], int(r[1])): (int(r[2]), int(r[3]), int(r[4]), int(r[5]), str(r[6])) for r in rows}


def check_whole(stored: tuple[int, int, int, int, str], counted: int) -> None:
    total, distinct, top, event_count, status = stored
    assert total == distinct == top + 1 == event_count, stored
    assert status == "completed", stored
    assert total == 2 * counted, (stored, counted)  # an enter and an exit per call the program counted


def test_eight_concurrent_records_into_one_sqlite_file(tmp_path: Path, run_cli: Any) -> None:
    script = tmp_path / "target.py"
    script.write_text(TARGET)
    db = tmp_path / "shared.db"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    procs = [
        subprocess.Popen([sys.executable, "-m", "modtrace", "record", "--db", str(db), "--run", f"p{i}", "-q",
                          str(script), str(tmp_path), "20", str(i)], env=env, cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(8)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    wall = time.monotonic() - started
    assert [p.returncode for p in procs] == [0] * 8, [o[1] for o in outs]
    assert not any("locked" in o[1] or "Traceback" in o[1] for o in outs), outs
    got = per_rank(str(db))
    assert sorted(got) == [(f"p{i}", 0) for i in range(8)]
    for i in range(8):
        check_whole(got[(f"p{i}", 0)], int((tmp_path / f"count-{i}").read_text()))
        assert run_cli("check", f"p{i}", "--db", str(db)).code == 0
    print(f"\nload: 8 concurrent modtrace record into one SQLite file: wall {wall:.1f} s")


@pytest.mark.postgres
def test_sixteen_torchrun_ranks_into_postgres(pg_url: str, tmp_path: Path, run_cli: Any) -> None:
    script = tmp_path / "target.py"
    script.write_text(TARGET)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "16", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), "-m", "modtrace", "record", "--db", pg_url, "--run-name", "R16", "-q",
           str(script), str(tmp_path), "10"]
    started = time.monotonic()
    out = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    wall = time.monotonic() - started
    assert out.returncode == 0, out.stderr[-3000:]
    got = per_rank(pg_url)
    assert sorted(got) == [("R16", r) for r in range(16)]
    for r in range(16):
        check_whole(got[("R16", r)], int((tmp_path / f"count-{r}").read_text()))
    assert run_cli("check", "R16", "--db", pg_url).code == 0
    shown = run_cli("show", "R16", "--db", pg_url)
    assert any(line.split()[:2] == ["status", "completed"] for line in shown.out.splitlines()), shown.out
    print(f"\nload: 16 torchrun ranks into PostgreSQL: wall {wall:.1f} s")
