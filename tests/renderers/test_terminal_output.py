"""Output that fits where it is read: tables at the terminal's width (``COLUMNS`` honoured),
whole lines in a pipe, errors in colour on a terminal only (``NO_COLOR`` honoured), and a
``tree`` named by indentation and leaf names, sortable and cut to its top nodes."""

from __future__ import annotations

import fcntl
import itertools
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest
import torch

import modtrace
from modtrace.core.contracts import Batch
from modtrace.store.engine import open_store
from modtrace.store.runs import add_rank, create_run, finish_rank
from modtrace.store.writer import RankWriter
from tests.helpers.analysis_streams import ENTER, EXIT, ev, model, to_rows
from tests.helpers.models import Net

LONG = "x" * 150 + " " + "y" * 100  # one cell wider than any terminal here
SQL = f"SELECT '{LONG}' AS long_value, 1 AS n"
SGR = re.compile(r"\x1b\[[0-9;]*m")


def _net_run(db: str, run: str = "net") -> None:
    torch.manual_seed(0)
    net = Net(blocks=2)
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    clock = itertools.count(0, 10)
    with modtrace.Recorder(db=db, run=run, clock=lambda: next(clock), handle_sigterm=False) as rec:
        for _ in range(2):
            net(torch.randn(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    rec.wait_analyzed()


def _broken_run(db: str) -> None:
    """A run whose forward lost an exit row: ``check`` reports errors."""
    store = open_store(db, create=True)
    try:
        run_id, _ = create_run(store, "broken", {})
        add_rank(store, run_id, 0, 0)
        mods = model(blocks=1, per_block=1)
        rows = to_rows([ev(ENTER, 0, 0, 1), ev(ENTER, 1, 0, 2), ev(ENTER, 2, 0, 3), ev(EXIT, 1, 0, 2), ev(EXIT, 0, 0, 1)])
        RankWriter(store, run_id, 0).write(
            Batch(rows, modules=mods.rows, threads=[(0, 1, "MainThread")], devices=[(0, "cpu")], progress=(len(rows), 1))
        )
        finish_rank(store, run_id, 0, "completed")
    finally:
        store.dispose()


def in_terminal(args: list[str], db: Path, columns: int = 100, **env_over: str) -> str:
    """``modtrace ARGS`` on a pseudo-terminal ``columns`` wide; what the terminal received."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    env.update(MODTRACE_DB=str(db), TERM="xterm-256color", **env_over)
    proc = subprocess.Popen([sys.executable, "-m", "modtrace", *args], stdin=subprocess.DEVNULL, stdout=slave,
                            stderr=slave, env=env)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    proc.wait(timeout=60)
    return b"".join(chunks).decode().replace("\r\n", "\n")


@pytest.fixture
def some_db(db_path: Path) -> Path:
    _net_run(str(db_path))
    return db_path


def test_a_pipe_gets_every_row_whole(some_db: Path, run_cli, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("COLUMNS", "60")  # a terminal's width means nothing to a pipe
    res = run_cli("query", SQL)
    assert res.code == 0
    lines = res.out.splitlines()
    assert len(lines) == 2 and lines[1].startswith(LONG) and lines[1].endswith(" 1"), lines
    assert SGR.search(res.out) is None


def test_tables_fit_the_terminal_and_its_columns(some_db: Path) -> None:
    for columns, env in ((100, {}), (100, {"COLUMNS": "60"})):
        width = int(env.get("COLUMNS", columns))
        out = SGR.sub("", in_terminal(["query", SQL], some_db, columns, **env))
        lines = out.splitlines()
        assert max(len(line) for line in lines) <= width, (width, lines)
        assert "".join(line.split()[0] for line in lines[1:] if line.strip()) .startswith("x" * 150), lines


def test_errors_stand_out_in_colour_on_a_terminal_only(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    _broken_run(str(db_path))
    shown = in_terminal(["check", "broken"], db_path)
    error_rows = [line for line in shown.splitlines() if "error" in SGR.sub("", line).split()[:1]]
    assert error_rows and all(re.search(r"\x1b\[[0-9;]*31[;m]", line) for line in error_rows), shown
    assert SGR.search(in_terminal(["check", "broken"], db_path, NO_COLOR="1")) is None
    piped = run_cli("check", "broken")
    assert piped.code == 1 and SGR.search(piped.out) is None


def _tree_json(run_cli, *args: str) -> list[dict]:  # type: ignore[no-untyped-def,type-arg]
    res = run_cli("tree", "net", "--format", "json", *args)
    assert res.code == 0, res
    flat: list[dict] = []  # type: ignore[type-arg]

    def walk(nodes: list[dict], level: int) -> None:  # type: ignore[type-arg]
        for node in nodes:
            flat.append({**node, "level": level})
            walk(node["children"], level + 1)

    walk(json.loads(res.out), 0)
    return flat


def test_tree_names_nodes_below_their_parent_and_sorts_and_cuts(some_db: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    nodes = _tree_json(run_cli)
    table = run_cli("tree", "net").out.splitlines()[1:]
    assert len(table) == len(nodes)
    path: list[str] = []
    for node, line in zip(nodes, table, strict=True):
        del path[node["level"]:]
        parent = path[-1] if path else None
        leaf = node["fqn"][len(parent) + 1:] if parent and node["fqn"].startswith(parent + ".") else node["fqn"]
        assert line.startswith("  " * node["level"] + leaf + " "), (line, node["fqn"])
        path.append(node["fqn"])
    assert any(line.lstrip().startswith("fc1 ") for line in table)
    full = run_cli("tree", "net", "--full-names").out.splitlines()[1:]
    assert [line.split()[0] for line in full] == [n["fqn"] for n in nodes]

    # --sort: every node's children, largest total self time first (JSON and table alike)
    by_self = _tree_json(run_cli, "--sort", "self")
    assert sorted(n["fqn"] for n in by_self) == sorted(n["fqn"] for n in nodes)
    for i, node in enumerate(by_self):
        siblings = [m for m in by_self[i + 1:] if m["level"] <= node["level"]]
        nxt = siblings[0] if siblings else None
        if nxt is not None and nxt["level"] == node["level"]:
            assert node["self_total_ns"] >= nxt["self_total_ns"], (node["fqn"], nxt["fqn"])
    sorted_table = run_cli("tree", "net", "--sort", "self", "--full-names").out.splitlines()[1:]
    assert [line.split()[0] for line in sorted_table] == [n["fqn"] for n in by_self]

    # --top N: the N heaviest nodes by self time, each under its ancestors
    top = _tree_json(run_cli, "--top", "3")
    heaviest = sorted(nodes, key=lambda n: -n["self_total_ns"])[:3]
    cutoff = heaviest[-1]["self_total_ns"]
    shown = {(n["fqn"], n["phase"], n["level"]) for n in top}
    assert {(n["fqn"], n["phase"], n["level"]) for n in heaviest} <= shown
    assert all(n["self_total_ns"] >= cutoff or any(m["level"] > n["level"] for m in top) for n in top)
    assert len(top) < len(nodes)


def test_runs_on_a_narrow_terminal_drops_columns_instead_of_folding_cells(some_db: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    wide = SGR.sub("", in_terminal(["runs"], some_db, 200)).splitlines()
    assert wide[0].split() == ["id", "name", "status", "started", "duration", "events", "steps", "step_on", "ranks",
                               "analysis", "tags"]
    started = wide[1].split()[3]
    for columns, env in ((60, {}), (100, {"COLUMNS": "60"})):
        lines = SGR.sub("", in_terminal(["runs"], some_db, columns, **env)).splitlines()
        assert len(lines) == 2 and all(len(line) <= 60 for line in lines), lines  # one line per run, whole cells
        assert lines[0].split() == ["id", "name", "status", "started", "steps"], lines
        assert lines[1].split()[1:] == ["net", "completed", started, "2"], lines
    assert run_cli("runs").out.splitlines()[0].split() == wide[0].split()  # a pipe gets every column


def test_a_table_drops_its_droppable_columns_in_order_until_it_fits() -> None:
    from modtrace.renderers import Table, Terminal, get_renderer

    table = Table(["key", "wide", "wider", "widest"], [["k", "w" * 10, "x" * 20, "y" * 30]],
                  droppable=("wider", "wide", "widest"))

    def shown(width: int | None) -> list[str]:
        return get_renderer("rows", "table", terminal=Terminal(width=width)).render(table).splitlines()[0].split()

    assert shown(None) == shown(200) == ["key", "wide", "wider", "widest"]
    assert shown(60) == ["key", "wide", "widest"]  # 3 + 10 + 30 and two spaces apart: 47
    assert shown(40) == ["key", "widest"]
    assert shown(20) == ["key"]
