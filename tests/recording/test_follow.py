"""The analysis that follows a recording (``results.incremental``) stores what a fresh analysis
of the same rows stores.

Each test records a real program with the real ``modtrace record`` (in a process of its own),
its writer process cut into rounds of a few thousand events (``MODTRACE_FOLLOW_ROWS``; not niced,
so that rounds happen before the end on a busy machine), and
checks: the follow ran several rounds (its ``MODTRACE_FOLLOW_TIMES`` line), the run's analysis
is stored, and every stored analysis relation of the run, and the ``tree``, ``check`` and
``diff`` JSON, are the same after ``materialize`` analysed the run again from its events
(the oracle: the one-piece analysis ``modtrace analyze`` runs).
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
from click.testing import CliRunner

from tests.helpers.database import db_rows

REPO = Path(__file__).resolve().parents[2]
ROUND_ROWS = "1000"

# The rows a recording writes (inputs of the analysis); every other table keyed by run is
# the analysis' output, compared whole (a table added later is compared too).
RECORDED = {"runs", "run_ranks", "events", "modules", "threads", "devices", "root_calls", "device_events",
            "call_counters", "counted_steps", "speed_probes", "alembic_version"}

PREAMBLE = """
import os, signal, sys, threading, time, torch
from torch import nn
from torch.utils.checkpoint import checkpoint
torch.manual_seed(0)
torch.set_num_threads(1)

def pace():
    # a step of a few ms at least, on any host: the writer process is up and takes rounds
    # while the program runs (a fast host ran these loops before its first round)
    time.sleep(0.004)

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin, self.act = nn.Linear(8, 8), nn.ReLU()
    def forward(self, x):
        return self.act(self.lin(x))

class Net(nn.Module):
    def __init__(self, blocks=6, ckpt=False):
        super().__init__()
        self.blocks = nn.ModuleList(Block() for _ in range(blocks))
        self.ckpt = ckpt
    def forward(self, x):
        for i, b in enumerate(self.blocks):
            x = checkpoint(b, x, use_reentrant=False) if self.ckpt and i % 2 else b(x)
        return x
"""

SCRIPTS = {
    # forward, backward, optimizer steps; every other block checkpointed (recomputed in backward)
    "train": """
model = Net(ckpt=True)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(300):
    model(torch.randn(4, 8, requires_grad=True)).sum().backward()
    opt.step(); opt.zero_grad()
    pace()
""",
    # the optimizer steps inside a module's forward: that call is open across every step boundary
    "cross": """
class TrainStep(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = Net()
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.01)
    def forward(self, x):
        self.net(x).sum().backward()
        self.opt.step(); self.opt.zero_grad()
        return x
outer = TrainStep()
for step in range(300):
    outer(torch.randn(4, 8))
    pace()
""",
    # a serving loop on three threads, no optimizer: each root call is a step (long enough for
    # rounds before the end: a thread that has stopped is looked for 65,536 rows ahead, stream.py)
    "threads": """
model = Net()
def serve(n):
    with torch.no_grad():
        for _ in range(n):
            model(torch.randn(2, 8))
            pace()
workers = [threading.Thread(target=serve, args=(900,)) for _ in range(3)]
for w in workers: w.start()
for w in workers: w.join()
""",
    # requests of one shape, then of another: the second kind's first step (counted, its memory
    # followed) is step 300, far from the first
    "kinds": """
model = Net()
with torch.no_grad():
    for rows in [2] * 300 + [3] * 300:
        model(torch.randn(rows, 8))
        pace()
""",
    # stopped by SIGTERM in the middle of a step: the run is interrupted, calls left open
    "sigterm": """
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
class Stop(nn.Module):
    def forward(self, x):
        os.kill(os.getpid(), signal.SIGTERM)
        return x
stop = Stop()
for step in range(300):
    y = model(torch.randn(4, 8))
    if step == 250:
        stop(y)
    y.sum().backward(); opt.step(); opt.zero_grad()
    pace()
""",
    # killed outright (SIGKILL) in the middle of a step: the writer process sees its pipe close
    "sigkill": """
import time
model = Net()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(300):
    y = model(torch.randn(4, 8))
    if step == 250:
        time.sleep(1.5)  # the steps before are handed over; the batches of this one are lost
        os.kill(os.getpid(), signal.SIGKILL)
    y.sum().backward(); opt.step(); opt.zero_grad()
    pace()
""",
}


def record(tmp_path: Path, db: str, name: str, script: str, *args: str, ok: tuple[int, ...] = (0,),
           env: dict[str, str] | None = None) -> str:
    """``modtrace record`` of ``script`` (after PREAMBLE) as run ``name``; its stderr."""
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(PREAMBLE) + textwrap.dedent(SCRIPTS[script]))
    env = {**os.environ, "MODTRACE_FOLLOW_ROWS": ROUND_ROWS, "MODTRACE_FOLLOW_TIMES": "1", "MODTRACE_ANALYSIS_NICE": "0",
           "OMP_NUM_THREADS": "1", **(env or {})}
    # capture_output: the run returns once the writer process, which shares stderr, has exited
    done = subprocess.run([sys.executable, "-m", "modtrace", "record", "--db", db, "--run", name, *args, str(path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode in ok, done.stderr
    assert "Traceback" not in done.stderr and "analysing it again" not in done.stderr, done.stderr
    return done.stderr


def follow_rounds(stderr: str, *, tree: str = "folded", events: str = "handed") -> int:
    """The rounds the follow took (its ``MODTRACE_FOLLOW_TIMES`` line), checking where its events
    came from (``events``: handed over by the writer, or read back), that its steps were folded
    as they went, and its tree as ``tree`` says (``none``: a run of several ranks stores none at
    a rank's end)."""
    found = re.search(r"modtrace: follow: (\d+) rounds; events (\w+); .*; steps (.*); tree (.*); end", stderr)
    assert found, stderr
    assert found.group(2, 3, 4) == (events, "folded", tree), found.group(0)
    return int(found.group(1))


def run_id(db: str, name: str) -> int:
    return int(db_rows(db, "SELECT id FROM runs WHERE name = :n", n=name)[0][0])


def analysis_tables(db: str) -> list[str]:
    if "://" in db:
        names = db_rows(db, "SELECT table_name FROM information_schema.columns WHERE column_name = 'run_id' "
                            "AND table_schema = current_schema()")
    else:
        names = [(t,) for (t,) in db_rows(db, "SELECT name FROM sqlite_master WHERE type = 'table'")
                 if any(c[1] == "run_id" for c in db_rows(db, f"PRAGMA table_info({t})"))]
    return sorted({n for (n,) in names} - RECORDED)


def stored(db: str, rid: int) -> dict[str, Any]:
    """Every analysis relation of the run (rows sorted), and its analysis state."""
    out: dict[str, Any] = {t: sorted(map(repr, db_rows(db, f"SELECT * FROM {t} WHERE run_id = {rid}")))
                           for t in analysis_tables(db)}
    out["state"] = (db_rows(db, f"SELECT analysis FROM runs WHERE id = {rid}"),
                    db_rows(db, f"SELECT rank, analysis FROM run_ranks WHERE run_id = {rid} ORDER BY rank"))
    return out


def cli_json(db: str, *args: str) -> Any:
    from modtrace.cli import cli

    got = CliRunner().invoke(cli, [*args, "--db", db, "--format", "json"])
    assert got.exit_code in (0, 1), got.output
    return json.loads(got.stdout)


def reanalysed(db: str, rid: int, *, by_rank: bool) -> None:
    """The run analysed again from its events, as ``modtrace analyze`` does (rank by rank when
    the recording analysed it so: a run of several ranks then stores no whole-run tree)."""
    from modtrace.results.materialize import materialize
    from modtrace.store.engine import open_store

    store = open_store(db)
    try:
        ranks = [r for (r,) in db_rows(db, f"SELECT rank FROM run_ranks WHERE run_id = {rid} ORDER BY rank")]
        for r in ranks if by_rank else [None]:
            materialize(store, rid, rank=r)
    finally:
        store.dispose()


def assert_same_as_fresh(db: str, name: str, *, other: str | None = None, by_rank: bool = False) -> dict[str, Any]:
    rid = run_id(db, name)
    before = stored(db, rid)
    assert before["state"][0] == [("stored",)], before["state"]
    assert before["span_rows"], "no spans stored"
    views = {"tree": cli_json(db, "tree", name), "check": cli_json(db, "check", name)}
    if other is not None:
        views["diff"] = cli_json(db, "diff", other, name)
    reanalysed(db, rid, by_rank=by_rank)
    after = stored(db, rid)
    for table in before:
        assert before[table] == after[table], f"{table} differs from a fresh analysis"
    assert views["tree"] == cli_json(db, "tree", name)
    assert views["check"] == cli_json(db, "check", name)
    if other is not None:
        assert views["diff"] == cli_json(db, "diff", other, name)
    return before


@pytest.mark.parametrize("db_kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_training_with_recompute_and_backward(tmp_path: Path, db_kind: str, request: pytest.FixtureRequest) -> None:
    db = str(tmp_path / "t.db") if db_kind == "sqlite" else request.getfixturevalue("pg_url")
    assert follow_rounds(record(tmp_path, db, "base", "train")) >= 2
    assert follow_rounds(record(tmp_path, db, "train", "train")) >= 2
    got = assert_same_as_fresh(db, "train", other="base")
    phases = {row.split(", ")[5] for row in got["span_rows"]}  # forward, backward and recompute spans
    assert len(phases) == 3, phases
    if db_kind == "postgres":  # the planner's statistics count the spans (analysed as the rounds went)
        ((tuples,),) = db_rows(db, "SELECT reltuples FROM pg_class WHERE oid = 'span_rows'::regclass")
        assert tuples >= len(got["span_rows"]) / 2, tuples


def test_a_call_open_across_step_boundaries(tmp_path: Path) -> None:
    db = str(tmp_path / "t.db")
    assert follow_rounds(record(tmp_path, db, "cross", "cross")) >= 2
    assert_same_as_fresh(db, "cross")


def test_serving_threads(tmp_path: Path) -> None:
    db = str(tmp_path / "t.db")
    assert follow_rounds(record(tmp_path, db, "serve", "threads")) >= 2
    assert_same_as_fresh(db, "serve")
    assert len(db_rows(db, "SELECT DISTINCT thread_id FROM events")) == 3


def test_a_follow_behind_drops_the_rows_handed_and_reads_them_back(tmp_path: Path) -> None:
    """More than MODTRACE_FOLLOW_HANDED rows waiting for the analysis thread: they are dropped,
    and the pass goes on reading the events back from the last one it took."""
    db = str(tmp_path / "t.db")
    err = record(tmp_path, db, "behind", "train", env={"MODTRACE_FOLLOW_HANDED": "300"})
    assert follow_rounds(err, events="read") >= 2
    assert_same_as_fresh(db, "behind")


def test_a_follow_setting_that_is_no_number_leaves_the_analysis_to_the_end(tmp_path: Path) -> None:
    """One line says so; the recording and its analysis are whole."""
    db = str(tmp_path / "t.db")
    err = record(tmp_path, db, "bad", "kinds", env={"MODTRACE_FOLLOW_HANDED": "lots"})
    notes = [line for line in err.splitlines() if "cannot follow" in line]
    assert notes == ["modtrace: note: the analysis cannot follow the recording (invalid literal for int() with "
                     "base 10: 'lots'); it runs at the end"], err
    assert "modtrace: follow:" not in err
    assert_same_as_fresh(db, "bad")


def test_a_step_kind_first_seen_late(tmp_path: Path) -> None:
    db = str(tmp_path / "t.db")
    assert follow_rounds(record(tmp_path, db, "kinds", "kinds")) >= 2
    got = assert_same_as_fresh(db, "kinds")
    assert len(got["step_memory"]) == 2, got["step_memory"]
    assert [row.split(", ")[3] for row in sorted(got["step_memory"])] == ["0", "300"], got["step_memory"]


def test_a_schedule(tmp_path: Path) -> None:
    db = str(tmp_path / "t.db")
    err = record(tmp_path, db, "sched", "train", "--schedule", "skip_first=3,wait=4,warmup=1,active=20,repeat=10")
    assert follow_rounds(err) >= 2
    assert_same_as_fresh(db, "sched")


def test_a_program_stopped_by_sigterm(tmp_path: Path) -> None:
    db = str(tmp_path / "t.db")
    assert follow_rounds(record(tmp_path, db, "term", "sigterm", ok=(143, 130, 1, -15))) >= 2
    assert db_rows(db, "SELECT status FROM runs WHERE name = 'term'") == [("interrupted",)]
    assert_same_as_fresh(db, "term")


def test_a_program_killed_outright(tmp_path: Path) -> None:
    db = str(tmp_path / "t.db")
    err = record(tmp_path, db, "kill", "sigkill", ok=(-9, 137))
    assert follow_rounds(err) >= 2
    deadline = time.monotonic() + 60
    while db_rows(db, "SELECT analysis FROM runs WHERE name = 'kill'") != [("stored",)] and time.monotonic() < deadline:
        time.sleep(0.2)
    got = assert_same_as_fresh(db, "kill")
    assert got["nesting_issues"], "the killed step's open calls are reported"


@pytest.mark.parametrize("db_kind", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_two_ranks_each_follow_their_own(tmp_path: Path, db_kind: str, request: pytest.FixtureRequest) -> None:
    """Two ranks record one run at the same time; each writer process analyses its own rank."""
    db = str(tmp_path / "t.db") if db_kind == "sqlite" else request.getfixturevalue("pg_url")
    path = tmp_path / "train.py"
    path.write_text(textwrap.dedent(PREAMBLE) + textwrap.dedent(SCRIPTS["train"]))
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "MODTRACE_FOLLOW_ROWS": ROUND_ROWS, "MODTRACE_FOLLOW_TIMES": "1", "MODTRACE_ANALYSIS_NICE": "0",
           "OMP_NUM_THREADS": "1",
               "RANK": str(rank), "WORLD_SIZE": "2"}
        procs.append(subprocess.Popen([sys.executable, "-m", "modtrace", "record", "--db", db, "--run", "ranks",
                                       str(path)], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        assert "Traceback" not in err and "analysing it again" not in err, err
        assert follow_rounds(err, tree="none") >= 2
    assert db_rows(db, "SELECT rank, analysis FROM run_ranks ORDER BY rank") == [(0, "stored"), (1, "stored")]
    assert_same_as_fresh(db, "ranks", by_rank=True)
