"""The fast Perfetto export writes the same trace as the renderer did before it was made fast
(``tests/perfetto_reference.py``), event for event, on real recordings: device tracks on side
streams, two ranks aligned by their anchors, nested graph tasks, a crossing and an unclosed span."""

from __future__ import annotations

import io
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import torch

import modtrace
import modtrace.api
import tests.helpers.perfetto_reference as reference
from tests.helpers.device_clock import FakeStream
from tests.helpers.device_recording import _record
from tests.helpers.models import Pair, Reentrant, _crossed_run
from tests.helpers.recording import FakeClock


def _reference(db: Path, run: str, clock: str) -> dict[str, Any]:
    """The trace of ``run`` as the reference renderer writes it from the run's full spans frame."""
    with modtrace.api.open(str(db)) as database:
        info = database.details(database.run(run))
        trace = reference.Trace(database.analysis(run).spans, database.anchors(run), database.thread_names(run), info,
                                device_tracks=clock == "device")
    out = io.StringIO()
    reference.PerfettoRenderer().write(trace, out)
    return json.loads(out.getvalue(), parse_float=Decimal)


def _same_trace(db: Path, run: str, clock: str, tmp_path: Path, run_cli: Any) -> dict[str, Any]:
    out = tmp_path / f"{run}-{clock}.json"
    result = run_cli("export", run, "--db", str(db), "-o", str(out), "-q", "--clock", clock)
    assert result.code == 0, result
    got = json.loads(out.read_text(), parse_float=Decimal)
    want = _reference(db, run, clock)
    assert got["otherData"] == want["otherData"]
    assert len(got["traceEvents"]) == len(want["traceEvents"])
    for i, (g, w) in enumerate(zip(got["traceEvents"], want["traceEvents"], strict=True)):
        assert g == w, f"event {i}"
    return got


@pytest.mark.parametrize("clock", ["device", "host"])
def test_device_tracks_on_side_streams_are_todays_trace(db_path: Path, tmp_path: Path, run_cli: Any, clock: str) -> None:
    _record(db_path, "side", side=FakeStream(0, 0x9000), writer="thread")
    got = _same_trace(db_path, "side", clock, tmp_path, run_cli)
    names = [e["args"]["name"] for e in got["traceEvents"] if e.get("name") == "thread_name"]
    assert any(n.endswith("(device)") for n in names) == (clock == "device")


def test_two_ranks_and_nested_graph_tasks_are_todays_trace(db_path: Path, tmp_path: Path, run_cli: Any) -> None:
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
    got = _same_trace(db_path, "dist", "host", tmp_path, run_cli)
    assert {e["pid"] for e in got["traceEvents"] if e["ph"] == "X"} == {1, 2}
    got = _same_trace(db_path, "reentrant", "host", tmp_path, run_cli)
    assert len({e["args"]["graph_task"] for e in got["traceEvents"] if e.get("cat") == "backward"}) > 1


def test_a_crossing_and_an_unclosed_span_are_todays_trace(db_path: Path, tmp_path: Path, run_cli: Any) -> None:
    _crossed_run(str(db_path))
    got = _same_trace(db_path, "broken", "host", tmp_path, run_cli)
    assert any(e.get("name") == "thread_name" and e["args"]["name"].endswith("#2") for e in got["traceEvents"])
