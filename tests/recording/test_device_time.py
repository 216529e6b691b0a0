"""Device time end to end without a GPU: a real Recorder over a real model, the
test device clock injected in place of CUDA (``tests/device_clock.py``: streams
run launched work in order, late; events complete only as the device gets to
them), a real SQLite file, the real analysis, API and CLI.

What a GPU run would show is known exactly here: the device is kept behind
the launches, so a call's device duration is the work launched inside it
(``tests/device_recording.py``).
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch
from torch import nn

import modtrace
import modtrace.api
from modtrace.api import _cli
from tests.helpers.database import db_rows
from tests.helpers.device_clock import FakeDeviceClock, FakeEvent, FakeStream
from tests.helpers.device_recording import (
    ALLOC,
    BACKWARD_NS,
    BEHIND,
    FORWARD_NS,
    STEP_WORK,
    STEPS,
    DeviceNet,
    _record,
    train_on_device,
)
from tests.helpers.recording import FakeClock


def _spans(db: Path, run: str) -> pl.DataFrame:
    with modtrace.open(str(db)) as database:
        return database.spans(run).with_columns(pl.col("fqn").cast(pl.String), pl.col("phase").cast(pl.String))


def _flat(nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``tree --format json``'s nested nodes, flattened."""
    return [n for node in nodes for n in (node, *_flat(node.get("children", [])))]


def _by(spans: pl.DataFrame, phase: str, column: str) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for fqn, value in spans.filter(pl.col("phase") == phase).select("fqn", column).iter_rows():
        out.setdefault(fqn, set()).add(value)
    return out


# -- rows and spans -----------------------------------------------------------------


@pytest.mark.parametrize("writer", ["thread", "process"])
def test_every_event_gets_its_device_time_and_spans_the_work_launched_inside(db_path: Path, writer: str) -> None:
    device = _record(db_path, "gpu", writer=writer)

    events = db_rows(db_path, "SELECT seq, ts_ns, device_ts_ns, mem_bytes, stream FROM event_log ORDER BY seq")
    assert events and all(ts is not None and mem is not None for _, _, ts, mem, _ in events)
    assert {stream for *_, stream in events} == {device.stream(0).handle}
    device_ts = [ts for _, _, ts, _, _ in events]
    assert device_ts == sorted(device_ts)  # one stream runs its work in order
    # The device falls behind the launches: it was kept behind.
    lags = [dts - ts for _, ts, dts, _, _ in events]
    assert lags[-1] > lags[0] + (STEPS - 1) * (STEP_WORK - BEHIND)

    spans = _spans(db_path, "gpu")
    fwd = _by(spans, "forward", "device_duration_ns")
    assert fwd == {"DeviceNet": {sum(FORWARD_NS.values())}, "DeviceNet.a": {FORWARD_NS["a"]},
                   "DeviceNet.b": {FORWARD_NS["b"]}, "DeviceNet.head": {FORWARD_NS["head"]},
                   "DeviceNet.a.fc": {0}, "DeviceNet.b.fc": {0}, "DeviceNet.head.fc": {0}}
    assert _by(spans, "forward", "device_self_ns")["DeviceNet"] == {0}  # all of it is in its children
    # Gradients flow through head and b (the input needs none): each launched its backward work.
    bwd = _by(spans, "backward", "device_duration_ns")
    assert bwd["DeviceNet"] == {2 * BACKWARD_NS}
    assert bwd["DeviceNet.head"] == bwd["DeviceNet.b"] == {BACKWARD_NS} and bwd["DeviceNet.a"] == {0}
    # Memory: each forward call leaves its allocation; nothing is freed, the backward adds none.
    assert _by(spans, "forward", "mem_delta_bytes") == {
        "DeviceNet": {sum(ALLOC.values())}, "DeviceNet.a": {ALLOC["a"]}, "DeviceNet.b": {ALLOC["b"]},
        "DeviceNet.head": {ALLOC["head"]}, "DeviceNet.a.fc": {0}, "DeviceNet.b.fc": {0}, "DeviceNet.head.fc": {0}}
    assert set(spans.filter(pl.col("phase") != "forward")["mem_delta_bytes"]) == {0}
    last = spans.filter(pl.col("step") == STEPS - 1)
    assert last["mem_max_bytes"].max() == STEPS * sum(ALLOC.values())


def test_events_pending_at_a_step_resolve_later_and_nothing_waits_until_the_end(db_path: Path) -> None:
    device = FakeDeviceClock()
    net = DeviceNet(device)
    seen: list[int] = []
    with modtrace.Recorder(db=str(db_path), run="lag", device_clock=device, clock=FakeClock(),
                           writer="thread") as rec:
        for _ in range(STEPS):
            torch.manual_seed(0)
            net(torch.randn(2, 4)).sum().backward()
            rec.step()
            device.advance(BEHIND)
            rec.flush()
            seen.append(db_rows(db_path, "SELECT count(*) FROM device_events")[0][0])
        total = rec.events_recorded
        assert device.waits == 0  # polls only asked: the program never waited for the device
    assert device.waits == 1  # the end: one wait, for the last event of the one stream
    # Some were resolved between steps, more later, and every one at the end, each once.
    assert 0 < seen[0] < seen[-1] < total
    assert db_rows(db_path, "SELECT count(*), count(DISTINCT seq), count(device_ts_ns) FROM device_events")[0] == (
        total, total, total)
    # resolved events went back to the pool and were recorded again: fewer events than marks
    assert len(device.events) < total and max(ev.records for ev in device.events) > 1


def test_device_time_off_records_no_device_event(db_path: Path) -> None:
    device = _record(db_path, "off", device_time=False)
    assert device.events == [] and device.memory_reads == 0
    assert db_rows(db_path, "SELECT count(*) FROM device_events")[0][0] == 0
    assert db_rows(db_path, "SELECT count(*), count(device_ts_ns), count(stream) FROM event_log")[0][1:] == (0, 0)
    assert "device_start_ns" not in _spans(db_path, "off").columns


class _DeadAtTheEnd(FakeDeviceClock):
    """A device that fails when the host waits for it (a CUDA error surfacing at the sync)."""

    def wait(self, event: FakeEvent) -> None:
        raise RuntimeError("CUDA error: an illegal memory access was encountered")


def test_a_device_failing_at_the_end_loses_only_the_pending_device_times(db_path: Path) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _record(db_path, "dead", _DeadAtTheEnd(), writer="thread")
    assert any("device times of" in str(w.message) and "illegal memory access" in str(w.message) for w in caught)
    assert db_rows(db_path, "SELECT status FROM runs")[0][0] == "completed"
    n, timed = db_rows(db_path, "SELECT count(*), count(device_ts_ns) FROM event_log")[0]
    assert 0 < timed < n  # what resolved between steps is kept; every host row is there


def test_a_module_on_a_side_stream_carries_that_streams_handle_and_times(db_path: Path) -> None:
    side = FakeStream(0, 0x9000)
    device = _record(db_path, "side", side=side, writer="thread")
    rows = db_rows(db_path, "SELECT fqn, phase, stream, count(*), count(device_ts_ns) FROM event_log "
                            "GROUP BY fqn, phase, stream")
    streams = {(fqn, phase): stream for fqn, phase, stream, _, _ in rows}
    assert streams[("DeviceNet.b.fc", "forward")] == side.handle  # launched inside b, on the side stream
    assert streams[("DeviceNet.a", "forward")] == streams[("DeviceNet.b", "forward")] == device.stream(0).handle
    assert all(n == timed for *_, n, timed in rows)
    # b's own enter and exit are on the default stream: its kernels ran beside it, on the side stream.
    spans = _spans(db_path, "side")
    assert _by(spans, "forward", "device_duration_ns")["DeviceNet.b"] == {0}


# -- stored and computed analysis -----------------------------------------------------


def test_the_stored_analysis_keeps_the_device_columns_and_a_cpu_run_stores_none(db_path: Path) -> None:
    _record(db_path, "gpu", writer="thread")
    cpu = nn.Linear(4, 4)
    with modtrace.Recorder(db=str(db_path), run="cpu", clock=FakeClock()):
        cpu(torch.randn(1, 4))
    stored = db_rows(db_path, "SELECT r.name, count(*) FROM span_device_rows d JOIN runs r ON r.id = d.run_id "
                              "GROUP BY r.name")
    assert stored == [("gpu", db_rows(db_path, "SELECT count(*) FROM spans WHERE run_id = 1")[0][0])]
    from modtrace.results.materialize import compute
    from modtrace.store.engine import open_store

    store = open_store(str(db_path))
    try:
        computed = compute(store, 1).spans
    finally:
        store.dispose()
    columns = ["span_id", "device_start_ns", "device_end_ns", "device_duration_ns", "device_self_ns",
               "mem_delta_bytes", "mem_max_bytes"]
    assert _spans(db_path, "gpu").select(columns).equals(computed.select(columns).sort("span_id"))
    # the spans view joins them
    view = db_rows(db_path, "SELECT sum(device_duration_ns), sum(mem_delta_bytes) FROM spans WHERE run_id = 1")[0]
    assert view == tuple(int(computed[c].sum()) for c in ("device_duration_ns", "mem_delta_bytes"))
    # analysed in many small rounds (as a long run is), it stores the same device rows
    from modtrace.results.materialize import materialize

    before = db_rows(db_path, "SELECT * FROM span_device_rows ORDER BY run_id, rank, span_id")
    store = open_store(str(db_path))
    try:
        materialize(store, 1, round_rows=7, chunk_rows=7)
    finally:
        store.dispose()
    assert db_rows(db_path, "SELECT * FROM span_device_rows ORDER BY run_id, rank, span_id") == before


# -- tree, diff, report, export and their --clock ---------------------------------------


def test_tree_reads_device_time_by_default_and_host_time_when_asked(db_path: Path, run_cli: Any) -> None:
    _record(db_path, "gpu", writer="thread")
    with modtrace.open(str(db_path)) as database:
        assert _cli.clock(database, "gpu", None) == "device"
        device_tree = database.tree("gpu", phase="forward")
        host_tree = database.tree("gpu", phase="forward", clock="host")
    a = device_tree.filter(pl.col("fqn") == "DeviceNet.a").row(0, named=True)
    assert a["inclusive_total_ns"] == STEPS * FORWARD_NS["a"]
    assert host_tree.filter(pl.col("fqn") == "DeviceNet.a")["inclusive_total_ns"][0] != a["inclusive_total_ns"]
    out = _flat(json.loads(run_cli("tree", "gpu", "--db", str(db_path), "--format", "json", "--phase",
                                   "forward").out))
    assert {r["fqn"]: r["inclusive_total_ns"] for r in out}["DeviceNet.b"] == STEPS * FORWARD_NS["b"]
    host = _flat(json.loads(run_cli("tree", "gpu", "--db", str(db_path), "--format", "json", "--clock",
                                    "host").out))
    assert {r["fqn"]: r["inclusive_total_ns"] for r in host if r["phase"] == "forward"}["DeviceNet.b"] != (
        STEPS * FORWARD_NS["b"])


def test_clock_device_on_a_run_without_device_times_is_one_line_and_exit_2(db_path: Path, run_cli: Any) -> None:
    with modtrace.Recorder(db=str(db_path), run="cpu", clock=FakeClock()):
        nn.Linear(4, 4)(torch.randn(1, 4))
    for args in (("tree", "cpu"), ("export", "cpu", "-o", str(db_path.parent / "t.json")),
                 ("report", "cpu", "-o", str(db_path.parent / "r.html")), ("diff", "cpu", "cpu")):
        got = run_cli(*args, "--db", str(db_path), "--clock", "device")
        assert got.code == 2, (args, got)
        assert got.err.count("\n") == 1 and "has no device times" in got.err and "Traceback" not in got.err
    assert not (db_path.parent / "t.json").exists() and not (db_path.parent / "r.html").exists()
    # without --clock the run is read on the host clock
    assert run_cli("tree", "cpu", "--db", str(db_path)).code == 0


def test_diff_reads_both_runs_on_one_clock_and_says_which(db_path: Path, run_cli: Any) -> None:
    _record(db_path, "base", writer="thread")
    _record(db_path, "cand", writer="thread")
    with modtrace.Recorder(db=str(db_path), run="cpu", clock=FakeClock()):
        DeviceNet(FakeDeviceClock())(torch.randn(2, 4))

    both = run_cli("diff", "base", "cand", "--db", str(db_path), "--format", "json", "--skip-steps", "0")
    doc = json.loads(both.out)
    assert doc["base"]["clock"] == doc["cand"]["clock"] == "device"
    by = {(t["fqn"], t["phase"]): t for t in doc["timing"]}
    assert by[("DeviceNet.b", "forward")]["inclusive"]["base_us"] == FORWARD_NS["b"] / 1000
    assert "device clock" in run_cli("diff", "base", "cand", "--db", str(db_path), "--skip-steps", "0").out
    # one side without device times: host for both by default; --clock device is refused
    mixed = json.loads(run_cli("diff", "base", "cpu", "--db", str(db_path), "--format", "json",
                               "--skip-steps", "0", "--fail-on", "never").out)
    assert mixed["base"]["clock"] == mixed["cand"]["clock"] == "host"
    refused = run_cli("diff", "base", "cpu", "--db", str(db_path), "--clock", "device")
    assert refused.code == 2 and "'cpu' has no device times" in refused.err
    host = json.loads(run_cli("diff", "base", "cand", "--db", str(db_path), "--format", "json", "--skip-steps", "0",
                              "--clock", "host").out)
    assert host["base"]["clock"] == "host"
    host_by = {(t["fqn"], t["phase"]): t for t in host["timing"]}
    assert host_by[("DeviceNet.b", "forward")]["inclusive"]["base_us"] != FORWARD_NS["b"] / 1000


def test_export_puts_device_times_on_tracks_of_their_own_per_stream(db_path: Path, run_cli: Any) -> None:
    side = FakeStream(0, 0x9000)
    device = _record(db_path, "side", side=side, writer="thread")
    out = db_path.parent / "trace.json"
    assert run_cli("export", "side", "--db", str(db_path), "-o", str(out), "-q").code == 0
    trace = json.loads(out.read_text())
    assert trace["otherData"]["clock"] == "device"
    names = {e["tid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "thread_name"}
    device_tracks = {tid: name for tid, name in names.items() if name.endswith("(device)")}
    assert {f"cpu stream {device.stream(0).handle} forward (device)",
            f"cpu stream {side.handle} forward (device)"} <= set(device_tracks.values())
    slices = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["tid"] in device_tracks]
    a = [e for e in slices if e["name"] == "DeviceNet.a" and e["cat"] == "forward"]
    assert len(a) == STEPS and all(e["dur"] == FORWARD_NS["a"] / 1000 for e in a)
    # host tracks are still there, on host time
    host = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "forward"
            and e["tid"] not in device_tracks and e["name"] == "DeviceNet.a"]
    assert len(host) == STEPS and all(e["dur"] != FORWARD_NS["a"] / 1000 for e in host)
    # on the host clock: no device track
    assert run_cli("export", "side", "--db", str(db_path), "-o", str(out), "-q", "--clock", "host").code == 0
    assert not any(e.get("name") == "thread_name" and e["args"]["name"].endswith("(device)")
                   for e in json.loads(out.read_text())["traceEvents"])


def test_exported_spans_and_the_report_use_the_clock(db_path: Path, run_cli: Any) -> None:
    _record(db_path, "gpu", writer="thread")
    csv = db_path.parent / "spans.csv"
    assert run_cli("export", "gpu", "--db", str(db_path), "--format", "csv", "--what", "spans", "-o", str(csv),
                   "-q").code == 0
    spans = pl.read_csv(csv)
    assert (spans["duration_ns"] == spans["device_duration_ns"]).all()
    report = db_path.parent / "r.html"
    assert run_cli("report", "gpu", "--db", str(db_path), "-o", str(report), "-q", "--vs", "gpu",
                   "--clock", "host").code == 2  # --vs the same run: refused as before
    assert run_cli("report", "gpu", "--db", str(db_path), "-o", str(report), "-q").code == 0
    assert re.search(r'"clock":\s*"device"', report.read_text())
    assert run_cli("report", "gpu", "--db", str(db_path), "-o", str(report), "-q", "--clock", "host").code == 0
    assert re.search(r'"clock":\s*"host"', report.read_text())


def test_record_no_device_time_option(tmp_path: Path, run_cli: Any) -> None:
    script = tmp_path / "job.py"
    script.write_text("import torch\ntorch.nn.Linear(2, 2)(torch.randn(1, 2))\n")
    db = tmp_path / "r.db"
    got = run_cli("record", "--db", str(db), "--run", "nodev", "-q", "--no-device-time", str(script))
    assert got.code == 0, got
    assert db_rows(db, "SELECT name, status FROM runs") == [("nodev", "completed")]
    assert "--no-device-time" in run_cli("record", "--help").out


# -- on a real GPU ---------------------------------------------------------------------


gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@gpu
@pytest.mark.gpu
def test_on_cuda_spans_get_device_times_and_memory(db_path: Path) -> None:
    dev = torch.device("cuda")
    net = nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)).to(dev)
    with modtrace.Recorder(db=str(db_path), run="cuda", writer="thread") as rec:
        for _ in range(3):
            net(torch.randn(256, 1024, device=dev)).sum().backward()
            rec.step()
        torch.cuda.synchronize()
    n, timed, mem = db_rows(db_path, "SELECT count(*), count(device_ts_ns), count(mem_bytes) FROM event_log")[0]
    assert n == timed == mem > 0
    spans = _spans(db_path, "cuda")
    linear = spans.filter((pl.col("fqn") == "Sequential.0") & (pl.col("phase") == "forward"))
    assert (linear["device_duration_ns"] > 0).all()


def test_device_times_round_trip_on_every_backend(any_db: str) -> None:
    _record_url(any_db, "gpu")
    with modtrace.open(any_db) as database:
        assert _cli.clock(database, "gpu", None) == "device"
        spans = database.spans("gpu").with_columns(pl.col("fqn").cast(pl.String), pl.col("phase").cast(pl.String))
        events = database.events("gpu", named=True)
    rows = modtrace.api.query(any_db, "SELECT count(*), count(device_ts_ns), count(mem_bytes) FROM event_log").rows
    stored = modtrace.api.query(any_db, "SELECT count(*) FROM spans WHERE device_duration_ns IS NOT NULL").rows
    assert rows == [(events.height, events.height, events.height)]
    assert stored == [(spans.height,)]
    assert _by(spans, "forward", "device_duration_ns")["DeviceNet.a"] == {FORWARD_NS["a"]}


def _record_url(db: str, run: str) -> None:
    device = FakeDeviceClock()
    net = DeviceNet(device)
    with modtrace.Recorder(db=db, run=run, device_clock=device, clock=FakeClock(), writer="thread") as rec:
        train_on_device(rec, net, device, STEPS, BEHIND)


def test_a_schedule_keeps_device_times_to_the_recorded_steps(db_path: Path) -> None:
    """Warm-up steps run the hooks but their events are dropped and their seqs used again:
    they get no timing event, so every stored device time belongs to a recorded event."""
    device = FakeDeviceClock()
    net = DeviceNet(device)
    with modtrace.Recorder(db=str(db_path), run="sched", device_clock=device, clock=FakeClock(), writer="thread",
                           schedule="wait=1,warmup=1,active=2") as rec:
        train_on_device(rec, net, device, 6, BEHIND)
    events = db_rows(db_path, "SELECT seq, step, device_ts_ns FROM event_log ORDER BY seq")
    assert {step for _, step, _ in events} == {2, 3}
    assert [seq for seq, _, _ in events] == list(range(len(events)))
    assert all(ts is not None for *_, ts in events)
    assert db_rows(db_path, "SELECT count(*) FROM device_events")[0][0] == len(events)
    device_ts = [ts for *_, ts in events]
    assert device_ts == sorted(device_ts)  # one stream, in order: no warm-up time mixed in
    fwd = _by(_spans(db_path, "sched"), "forward", "device_duration_ns")
    assert fwd["DeviceNet"] == {sum(FORWARD_NS.values())} and fwd["DeviceNet.b"] == {FORWARD_NS["b"]}
