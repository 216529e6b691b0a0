"""The stored module call tree (table tree_nodes): ``modtrace tree`` answered from it prints
exactly what the spans give, on real recordings (a recompute, two ranks, device time), on
SQLite and PostgreSQL; options that select spans read the spans; re-analysis replaces it;
a run analysed before it existed still works."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import polars as pl
import torch
from polars.testing import assert_frame_equal

import modtrace
from modtrace.analysis.aggregate import TREE_SPAN_COLUMNS, module_tree
from modtrace.core.contracts import TREE_NODE_FRAME
from modtrace.results.materialize import load_spans, materialize
from modtrace.store.engine import open_store
from tests.helpers.database import db_rows
from tests.helpers.device_clock import FakeDeviceClock
from tests.helpers.device_recording import DeviceNet, train_on_device
from tests.helpers.models import Net
from tests.helpers.recording import FakeClock
from tests.helpers.training import record_training

FROZEN = Path(__file__).resolve().parents[1] / "data" / "frozen"
# What most tests here record: a Net (its block 1 checkpointed: backward recomputes it).
NET: dict[str, Any] = {"model": Net, "inputs": lambda _: torch.ones(2, 4), "handle_sigterm": False}

# Options the stored tree answers (filters on the whole tree, the run's own rule said again)...
STORED = [
    [], ["--phase", "forward"], ["--phase", "backward"], ["--phase", "recompute"], ["--max-depth", "0"],
    ["--max-depth", "1"], ["--min-percent", "5"], ["--format", "json"], ["--step-kind", "all"],
    ["--format", "json", "--phase", "backward", "--max-depth", "2", "--min-percent", "1"],
    ["--step-on", "optimizer"], ["--step-on", "auto"], ["--clock", "host"],
]
# ...and options that read the spans.
FROM_SPANS = [["--step", "1"], ["--rank", "0"], ["--step-on", "root"], ["--step-on", "manual"],
              ["--step-kind", "-"], ["--step", "0", "--format", "json", "--phase", "forward"]]


def _nodes(db: str) -> list[tuple[Any, ...]]:
    return db_rows(db, "SELECT r.name, t.clock, count(*) FROM tree_nodes t JOIN runs r ON r.id = t.run_id "
                       "GROUP BY r.name, t.clock ORDER BY r.name, t.clock")


def _trees(run_cli: Any, db: str, run: str, options: list[list[str]]) -> list[tuple[int, str, str]]:
    out = []
    for opts in options:
        res = run_cli("tree", run, "--db", db, *opts)
        out.append((res.code, res.out, res.err))
    return out


def _same_either_way(run_cli: Any, db: str, run: str, options: list[list[str]]) -> list[tuple[int, str, str]]:
    """``tree``'s outputs for ``options`` answered from the stored tree, asserted equal to the
    spans' (the stored tree deleted, as for a run analysed before it existed); the outputs."""
    stored = _trees(run_cli, db, run, options)
    with modtrace.open(db) as database:
        frames = [database.tree(run), database.tree(run, phase="forward", max_depth=1)]
    db_rows(db, "DELETE FROM tree_nodes")
    spans = _trees(run_cli, db, run, options)
    for opts, a, b in zip(options, stored, spans, strict=True):
        assert a == b, opts
    with modtrace.open(db) as database:
        assert_frame_equal(frames[0], database.tree(run))
        assert_frame_equal(frames[1], database.tree(run, phase="forward", max_depth=1))
    assert all(code == 0 for (code, _, _), opts in zip(stored, options, strict=True) if opts in STORED), stored
    return stored


def test_tree_from_the_stored_nodes_prints_what_the_spans_give(any_db: str, run_cli: Any) -> None:
    record_training(any_db, "net", 4, **NET)
    assert _nodes(any_db) == [("net", "host", 19)]  # the recorder stored it (one rank)
    outputs = _same_either_way(run_cli, any_db, "net", STORED + FROM_SPANS)
    # leaf names below their parent; the recompute subtree's root, under a backward call, by its full name
    assert "recompute" in outputs[0][1] and "  fc2 " in outputs[0][1] and "  Net.blocks.1 " in outputs[0][1]


def test_tree_reads_the_stored_nodes_when_its_options_allow_and_the_spans_otherwise(
        db_path: Path, run_cli: Any) -> None:
    db = str(db_path)
    record_training(db, "net", 4, **NET)
    before = {tuple(o): run_cli("tree", "net", "--db", db, *o).out for o in STORED + FROM_SPANS}
    # a root node's call count, changed in the stored tree only, shows where tree read from
    db_rows(db, "UPDATE tree_nodes SET calls = 4242 WHERE node = 0")
    for opts in ([], ["--max-depth", "0"], ["--step-on", "optimizer"], ["--clock", "host"]):
        assert "4242" in run_cli("tree", "net", "--db", db, *opts).out, opts
    assert '"calls": 4242' in run_cli("tree", "net", "--db", db, "--format", "json").out
    for opts in FROM_SPANS:
        assert run_cli("tree", "net", "--db", db, *opts).out == before[tuple(opts)], opts
    # re-analysis replaces it
    assert run_cli("analyze", "net", "--db", db).code == 0
    assert _nodes(db) == [("net", "host", 19)]
    assert run_cli("tree", "net", "--db", db).out == before[()]


def test_two_ranks_store_a_tree_once_analysed_as_a_whole(db_path: Path, run_cli: Any) -> None:
    db = str(db_path)
    for rank in (0, 1):
        record_training(db, "job", 3 + rank, **NET, rank=rank, world_size=2, join=True)
    assert _nodes(db) == []  # each rank analysed alone: no tree of the whole run
    assert run_cli("analyze", "job", "--db", db).code == 0
    assert _nodes(db) == [("job", "host", 19)]
    _same_either_way(run_cli, db, "job", [*STORED, ["--rank", "1"], ["--step", "3"]])
    # a rank analysed again alone drops the whole run's tree
    store = open_store(db)
    try:
        materialize(store, 1, rank=1)
    finally:
        store.dispose()
    assert _nodes(db) == []


def _device_run(db: str, run: str) -> None:
    device = FakeDeviceClock()
    with modtrace.Recorder(db=db, run=run, device_clock=device, clock=FakeClock(), writer="thread") as rec:
        train_on_device(rec, DeviceNet(device, None), device, 3, 50_000)


def test_a_run_with_device_times_stores_both_clocks(db_path: Path, run_cli: Any) -> None:
    db = str(db_path)
    _device_run(db, "gpu")
    assert [(c, n > 0) for _, c, n in _nodes(db)] == [("device", True), ("host", True)]
    device, host = db_rows(db, "SELECT clock, sum(inclusive_total_ns) FROM tree_nodes GROUP BY clock ORDER BY clock")
    assert device[1] != host[1]
    options = [[], ["--clock", "device"], ["--clock", "host"], ["--phase", "backward", "--clock", "host"],
               ["--format", "json", "--phase", "forward"], ["--step", "1"]]
    _same_either_way(run_cli, db, "gpu", options)


def test_a_run_analysed_in_rounds_stores_the_same_tree(db_path: Path) -> None:
    db = str(db_path)
    _device_run(db, "gpu")
    record_training(db, "net", 4, **NET)
    whole = db_rows(db, "SELECT * FROM tree_nodes ORDER BY run_id, clock, node")
    store = open_store(db)
    try:
        for run_id in (1, 2):
            materialize(store, run_id, round_rows=7, chunk_rows=7)  # its spans come back from the store
    finally:
        store.dispose()
    assert db_rows(db, "SELECT * FROM tree_nodes ORDER BY run_id, clock, node") == whole


def test_a_database_from_before_the_stored_tree_upgrades_and_tree_works_before_and_after_analyze(
        tmp_path: Path, run_cli: Any) -> None:
    db = tmp_path / "old.db"
    shutil.copyfile(FROZEN / "0008.db", db)
    assert run_cli("db", "upgrade", "--db", str(db)).code == 0
    assert _nodes(str(db)) == []
    runs = ("frozen-ddp", "frozen-crashed")  # two ranks with device times; one rank that crashed
    before = {run: _trees(run_cli, str(db), run, STORED) for run in runs}  # from their spans
    assert all(code == 0 for run in runs for code, _, _ in before[run]) and "forward" in before[runs[0]][0][1]
    for run in runs:
        assert run_cli("analyze", run, "--db", str(db)).code == 0
    assert [(name, clock) for name, clock, _ in _nodes(str(db))] == [
        (runs[1], "host"), (runs[0], "device"), (runs[0], "host")]
    assert {run: _trees(run_cli, str(db), run, STORED) for run in runs} == before


def test_module_tree_returns_the_tree_node_frame(db_path: Path) -> None:
    record_training(str(db_path), "net", 4, **NET)
    store = open_store(str(db_path))
    try:
        nodes = module_tree(load_spans(store, 1, TREE_SPAN_COLUMNS))
    finally:
        store.dispose()
    assert dict(nodes.schema) == TREE_NODE_FRAME.polars()
    assert nodes.height == 19 and nodes.filter(pl.col("level") == 0).height == 2  # forward, backward


def _imports(*args: str) -> set[str]:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "modtrace", *args], capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    return {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


def test_tree_from_a_stored_tree_imports_no_polars(db_path: Path) -> None:
    record_training(str(db_path), "net", 4, **NET)
    heavy = ("polars", "torch", "alembic", "sqlalchemy.orm")
    for opts in (["--phase", "forward"], ["--format", "json", "--max-depth", "1"]):
        names = _imports("tree", "net", "--db", str(db_path), *opts)
        assert "modtrace.results.tree" in names
        assert sorted(n for n in names if any(n == h or n.startswith(h + ".") for h in heavy)) == [], opts
    assert "polars" in _imports("tree", "net", "--db", str(db_path), "--step", "0")  # from the spans
