"""The Perfetto export against golden traces (tests/data/golden/perfetto_*.json), event
for event, on real recordings with injected clocks: device tracks on side streams, two
ranks aligned by their anchors, nested graph tasks, a crossing and an unclosed span.

Only what the wall clock or the process decides is normalised before the comparison: the
run's wall origin, autograd's graph task ids, and the offset between two ranks' anchors (each rank's slices keep their times
relative to that rank's first slice; the alignment itself is checked separately).
"""

from __future__ import annotations

import copy
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import torch

import modtrace
from modtrace.api import _cli
from tests.helpers.device_clock import FakeStream
from tests.helpers.device_recording import _record
from tests.helpers.golden import check_golden
from tests.helpers.models import Pair, Reentrant, _crossed_run
from tests.helpers.recording import FakeClock


def _normalised(trace: dict[str, Any]) -> str:
    """The trace as golden text: one event a line, wall-clock facts taken out, and autograd's
    graph task ids (a counter of the whole process, so they depend on what ran before) numbered
    from 1 in the order the trace first names them."""
    trace["otherData"]["wall_origin_ns"] = 0
    tasks: dict[Any, int] = {}
    for e in trace["traceEvents"]:
        args = e.get("args") or {}
        if args.get("graph_task") is not None:
            args["graph_task"] = tasks.setdefault(args["graph_task"], len(tasks) + 1)
    first: dict[int, Decimal] = {}
    for e in trace["traceEvents"]:
        if "ts" in e:
            first[e["pid"]] = min(first.get(e["pid"], e["ts"]), e["ts"])
    for e in trace["traceEvents"]:
        if "ts" in e:
            e["ts"] = e["ts"] - first[e["pid"]]
    def number(value: Any) -> Any:
        return float(value) if isinstance(value, Decimal) else value

    head = json.dumps({k: v for k, v in trace.items() if k != "traceEvents"}, default=number)
    return head + "\n" + "".join(json.dumps(e, default=number) + "\n" for e in trace["traceEvents"])


def _exported(db: Path, run: str, clock: str, tmp_path: Path, run_cli: Any) -> dict[str, Any]:
    out = tmp_path / f"{run}-{clock}.json"
    result = run_cli("export", run, "--db", str(db), "-o", str(out), "-q", "--clock", clock)
    assert result.code == 0, result
    trace: dict[str, Any] = json.loads(out.read_text(), parse_float=Decimal)
    return trace


def _check(db: Path, run: str, clock: str, tmp_path: Path, run_cli: Any) -> dict[str, Any]:
    trace = _exported(db, run, clock, tmp_path, run_cli)
    check_golden(f"perfetto_{run}_{clock}.json", _normalised(copy.deepcopy(trace)))
    return trace


@pytest.mark.parametrize("clock", ["device", "host"])
def test_device_tracks_on_side_streams(db_path: Path, tmp_path: Path, run_cli: Any, clock: str) -> None:
    _record(db_path, "side", side=FakeStream(0, 0x9000), writer="thread")
    got = _check(db_path, "side", clock, tmp_path, run_cli)
    names = [e["args"]["name"] for e in got["traceEvents"] if e.get("name") == "thread_name"]
    assert any(n.endswith("(device)") for n in names) == (clock == "device")


def test_two_ranks_and_nested_graph_tasks(db_path: Path, tmp_path: Path, run_cli: Any) -> None:
    db = str(db_path)
    torch.manual_seed(0)
    pair, net = Pair(), Reentrant()
    for rank in (0, 1):
        with modtrace.Recorder(db=db, run="dist", join=True, rank=rank, world_size=2, clock=FakeClock()) as rec:
            for _ in range(2):
                pair(torch.randn(2, 6)).sum().backward()
        rec.wait_analyzed()
    with modtrace.Recorder(db=db, run="reentrant", clock=FakeClock()) as rec:
        for _ in range(2):
            net(torch.randn(4, 6, requires_grad=True)).sum().backward()
    rec.wait_analyzed()
    got = _check(db_path, "dist", "host", tmp_path, run_cli)
    assert {e["pid"] for e in got["traceEvents"] if e["ph"] == "X"} == {1, 2}
    # The ranks are aligned by their wall-clock anchors: each rank starts one clock tick after its anchor,
    # and the later rank starts later by the difference of the two anchors.
    with modtrace.open(db) as database:
        anchors = _cli.anchors(database, "dist")
    starts = {pid: min(e["ts"] for e in got["traceEvents"] if e["ph"] == "X" and e["pid"] == pid) for pid in (1, 2)}
    assert abs((starts[2] - starts[1]) * 1000 - Decimal(anchors[1] - anchors[0])) <= 1, (starts, anchors)
    got = _check(db_path, "reentrant", "host", tmp_path, run_cli)
    assert len({e["args"]["graph_task"] for e in got["traceEvents"] if e.get("cat") == "backward"}) > 1


def test_a_crossing_and_an_unclosed_span(db_path: Path, tmp_path: Path, run_cli: Any) -> None:
    _crossed_run(str(db_path))
    got = _check(db_path, "broken", "host", tmp_path, run_cli)
    assert any(e.get("name") == "thread_name" and e["args"]["name"].endswith("#2") for e in got["traceEvents"])
