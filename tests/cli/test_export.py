"""modtrace export: the Perfetto / Chrome trace checked slice by slice against
the ``spans`` relation (counts, args, strict nesting per track, ranks aligned
through their wall-clock anchors), and Parquet / CSV read back with polars."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from decimal import Decimal
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import modtrace
from modtrace.renderers.perfetto import assign_lanes, trace_frame
from tests.helpers.database import db_rows
from tests.helpers.models import Pair, Reentrant, _crossed_run
from tests.helpers.recording import FakeClock
from tests.helpers.report import record_tiny, record_toy

REPO = Path(__file__).resolve().parents[2]
PHASES = {"forward", "backward", "recompute"}


def load_trace(text: str) -> dict[str, Any]:
    """The trace with every number exact (Decimal), so nanoseconds can be checked exactly."""
    trace: dict[str, Any] = json.loads(text, parse_float=Decimal)
    return trace


def ns(us: Decimal | int) -> int:
    value = Decimal(us) * 1000
    assert value == value.to_integral_value(), f"{us} µs is not a whole number of ns"
    return int(value)


def slices(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] in PHASES]


def track_names(trace: dict[str, Any]) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def nesting_violations(trace: dict[str, Any]) -> list[str]:
    """Slices of one (pid, tid) must nest strictly: inside the enclosing one, apart from siblings."""
    by_track: dict[tuple[int, int], list[tuple[int, int, str]]] = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            start = ns(e["ts"])
            by_track.setdefault((e["pid"], e["tid"]), []).append((start, start + ns(e["dur"]), e["name"]))
    bad = []
    for track, items in by_track.items():
        items.sort(key=lambda t: (t[0], -t[1]))
        open_: list[tuple[int, int, str]] = []
        for start, end, name in items:
            while open_ and open_[-1][1] <= start:
                open_.pop()
            if open_ and end > open_[-1][1]:
                bad.append(f"{track}: {name} [{start}, {end}] crosses {open_[-1][2]} [{open_[-1][0]}, {open_[-1][1]}]")
            open_.append((start, end, name))
    return bad


def span_rows(db: str, run_id: int = 1) -> dict[tuple[int, int], dict[str, Any]]:
    rows = db_rows(db, f"SELECT rank, span_id, fqn, phase, call_id, step, thread_id, start_ns, end_ns, device, stream, "
                   f"status, graph_task FROM spans WHERE run_id = {run_id}")
    keys = ("rank", "span_id", "fqn", "phase", "call_id", "step", "thread_id", "start_ns", "end_ns", "device",
            "stream", "status", "graph_task")
    return {(r[0], r[1]): dict(zip(keys, r, strict=True)) for r in rows}


def anchors(db: str, run_id: int = 1) -> dict[int, int]:
    return {int(r): int(a) for r, a in db_rows(db, f"SELECT rank, wall_anchor_ns FROM run_ranks WHERE run_id = {run_id}")}


def check_against_spans(trace: dict[str, Any], db: str, run_id: int = 1) -> None:
    """Every span is one slice on its own phase's track, at its exact aligned time, with its args."""
    spans = span_rows(db, run_id)
    xs = slices(trace)
    assert len(xs) == len(spans)
    wall = anchors(db, run_id)
    origin = min(wall.values())
    assert trace["otherData"]["wall_origin_ns"] == origin
    names = track_names(trace)
    seen = set()
    for x in xs:
        a = x["args"]
        span = spans[(a["rank"], a["span_id"])]
        seen.add((a["rank"], a["span_id"]))
        assert x["pid"] == span["rank"] + 1
        assert x["cat"] == a["phase"] == span["phase"]
        assert x["name"] == a["fqn"] == span["fqn"]
        for key in ("call_id", "step", "thread_id", "device", "stream", "status", "graph_task"):
            assert a[key] == span[key], (key, a, span)
        assert ns(x["ts"]) == wall[span["rank"]] - origin + span["start_ns"]
        assert ns(x["dur"]) == span["end_ns"] - span["start_ns"]
        track = names[(x["pid"], x["tid"])]
        assert track.startswith(f"thread {span['thread_id']} ") and span["phase"] in track
    assert seen == set(spans)
    assert nesting_violations(trace) == []


# -- Perfetto --------------------------------------------------------------------------


def test_perfetto_trace_is_the_spans_on_phase_tracks(any_db: str, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    record_tiny(any_db, "ck", steps=2, checkpoint=True)
    out = tmp_path / "trace.json"
    result = run_cli("export", "ck", "--db", any_db, "-o", str(out))
    assert result.code == 0, result
    n = db_rows(any_db, "SELECT COUNT(*) FROM spans")[0][0]
    assert (result.out, result.err) == ("", f"modtrace: wrote {n:,} spans of run 'ck' to {out}\n")
    trace = load_trace(out.read_text())
    check_against_spans(trace, any_db)

    meta = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert {(e["pid"], e["args"]["name"]) for e in meta if e["name"] == "process_name"} == {(1, "rank 0")}
    assert sorted(track_names(trace).values()) == sorted([
        "steps", "thread 0 MainThread forward", "thread 0 MainThread backward", "thread 0 MainThread recompute",
    ])
    # one phase per track, so forward, backward and recompute never share one
    cats: dict[int, set[str]] = {}
    for x in slices(trace):
        cats.setdefault(x["tid"], set()).add(x["cat"])
    assert sorted(len(c) for c in cats.values()) == [1, 1, 1]
    # the steps track: one slice per step, spanning the step's spans
    steps = [e for e in trace["traceEvents"] if e["ph"] == "X" and e["cat"] == "step"]
    assert [(e["name"], e["args"]["spans"]) for e in steps] == [
        (f"step {s}", c) for s, c in db_rows(any_db, "SELECT step, COUNT(*) FROM spans GROUP BY step ORDER BY step")
    ]
    for e in steps:
        inside = [x for x in slices(trace) if x["args"]["step"] == e["args"]["step"]]
        assert min(ns(x["ts"]) for x in inside) == ns(e["ts"])
        assert max(ns(x["ts"]) + ns(x["dur"]) for x in inside) == ns(e["ts"]) + ns(e["dur"])
    assert trace["displayTimeUnit"] == "ms" and trace["otherData"]["run"] == "ck"






def test_nested_graph_tasks_keep_every_track_strictly_nested(db_path: Path, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    net = Reentrant()
    with modtrace.Recorder(db=str(db_path), run="reentrant", clock=FakeClock()) as _rec:
        for _ in range(2):
            net(torch.randn(4, 6, requires_grad=True)).sum().backward()
    _rec.wait_analyzed()  # the writer process analyses the run after the with
    db = str(db_path)
    tasks = db_rows(db, "SELECT COUNT(DISTINCT graph_task) FROM spans WHERE phase = 'backward' AND step = 0")[0][0]
    assert tasks > 1  # the nested graph tasks this test is about
    out = tmp_path / "t.json"
    assert run_cli("export", "reentrant", "-o", str(out)).code == 0
    check_against_spans(load_trace(out.read_text()), db)




def test_a_crossing_or_unclosed_span_moves_to_a_second_lane(db_path: Path, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    _crossed_run(str(db_path))
    out = tmp_path / "t.json"
    result = run_cli("export", "broken", "-o", str(out))
    assert result.code == 0, result
    trace = load_trace(out.read_text())
    assert nesting_violations(trace) == []
    by_name = {x["name"]: x for x in slices(trace)}
    fc0 = by_name["Net.blocks.0.fc0"]
    assert fc0["args"]["status"] == "unclosed"
    # ts_ns 10, 20, 30, 40, 50: the unclosed call runs to the rank's last timestamp
    assert (ns(fc0["ts"]), ns(fc0["ts"]) + ns(fc0["dur"])) == (30, 50)
    names = track_names(trace)
    assert names[(1, by_name["Net"]["tid"])] == names[(1, by_name["Net.blocks.0"]["tid"])] == "thread 0 MainThread forward"
    assert names[(1, fc0["tid"])] == "thread 0 MainThread forward #2"


def test_ranks_align_through_their_wall_clock_anchors(db_path: Path, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    db = str(db_path)
    torch.manual_seed(0)
    net = Pair()
    for rank in (0, 1):  # rank 1 starts after rank 0 ended; both clocks start at 0
        with modtrace.Recorder(db=db, run="dist", join=True, rank=rank, world_size=2, clock=FakeClock()) as _rec:
            for _ in range(2):
                net(torch.randn(2, 6)).sum().backward()
        _rec.wait_analyzed()  # the writer process analyses the run after the with
    raw = db_rows(db, "SELECT rank, MIN(start_ns), MAX(end_ns) FROM spans GROUP BY rank ORDER BY rank")
    assert raw[0][1] == raw[1][1]  # identical clocks: unaligned, the ranks would overlap
    out = tmp_path / "t.json"
    assert run_cli("export", "dist", "-o", str(out)).code == 0
    trace = load_trace(out.read_text())
    check_against_spans(trace, db)
    procs = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert procs == {1: "rank 0", 2: "rank 1"}
    per_rank: dict[int, list[tuple[int, int]]] = {1: [], 2: []}
    for x in slices(trace):
        per_rank[x["pid"]].append((ns(x["ts"]), ns(x["ts"]) + ns(x["dur"])))
    assert min(s for s, _ in per_rank[1]) == raw[0][1]  # rank 0 started first: its anchor is the origin
    assert max(e for _, e in per_rank[1]) <= min(s for s, _ in per_rank[2])  # rank 1 came later, in wall time
    # tracks of different ranks never share a tid
    tids = {pid: {x["tid"] for x in slices(trace) if x["pid"] == pid} for pid in (1, 2)}
    assert not tids[1] & tids[2]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 50), st.integers(0, 20)), max_size=40))
def test_assign_lanes_always_nests(intervals: list[tuple[int, int, int]]) -> None:
    items = sorted(((k, s, s + d) for k, s, d in intervals), key=lambda t: (t[0], t[1], -t[2]))
    lanes = assign_lanes([s for _, s, _ in items], [e for _, _, e in items], [k for k, _, _ in items])
    tracks: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for (k, s, e), lane in zip(items, lanes, strict=True):
        tracks.setdefault((k, lane), []).append((s, e))
    for ivs in tracks.values():
        stack: list[int] = []
        for s, e in ivs:
            while stack and stack[-1] <= s:
                stack.pop()
            assert not stack or e <= stack[-1]
            stack.append(e)
    # a properly nested set stays in lane 0
    nested = [(0, 100), (0, 40), (10, 20), (40, 100), (50, 60)]
    assert assign_lanes([s for s, _ in nested], [e for _, e in nested], [0] * 5) == [0] * 5
    assert assign_lanes([0, 5, 12], [10, 15, 20], [0, 0, 0]) == [0, 1, 0]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.sampled_from(["forward", "backward", "recompute"]),
                          st.integers(0, 60), st.integers(0, 30), st.integers(0, 12)), min_size=1, max_size=30))
def test_trace_tracks_nest_whatever_the_parent_links_say(raw: list[tuple[int, str, int, int, int]]) -> None:
    """Parent links that agree with the times take the fast path; any that do not get lanes."""
    rows = []
    for i, (thread, phase, start, dur, parent) in enumerate(raw):
        rows.append({"rank": 0, "span_id": i, "parent_span_id": parent if parent < i else None, "depth": 0,
                     "thread_id": thread, "phase": phase, "start_ns": start, "end_ns": start + dur, "step": 0})
    frame = pl.DataFrame(rows, schema={"rank": pl.Int32, "span_id": pl.Int64, "parent_span_id": pl.Int64,
                                       "depth": pl.Int32, "thread_id": pl.Int32, "phase": pl.String,
                                       "start_ns": pl.Int64, "end_ns": pl.Int64, "step": pl.Int32})
    out = trace_frame(frame, {0: 0}, 0)
    tracks: dict[tuple[Any, ...], list[tuple[int, int]]] = {}
    for thread, phase, lane, t0, t1 in out.select("thread_id", "phase", "lane", "t0", "t1").iter_rows():
        tracks.setdefault((thread, phase, lane), []).append((t0, t1))
    for ivs in tracks.values():
        ivs.sort(key=lambda t: (t[0], -t[1]))
        stack: list[int] = []
        for t0, t1 in ivs:
            while stack and stack[-1] <= t0:
                stack.pop()
            assert not stack or t1 <= stack[-1], ivs
            stack.append(t1)


# -- Parquet and CSV ----------------------------------------------------------------------


def test_parquet_directory_round_trips_spans_and_events(any_db: str, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    record_toy(any_db, "toy", steps=3)
    out = tmp_path / "pq"
    result = run_cli("export", "toy", "--db", any_db, "--format", "parquet", "-o", str(out))
    assert result.code == 0, result
    assert sorted(p.name for p in out.iterdir()) == ["events.parquet", "spans.parquet"]

    spans = pl.read_parquet(out / "spans.parquet")
    cols = ["rank", "span_id", "parent_span_id", "depth", "fqn", "module_type", "phase", "call_id", "step",
            "thread_id", "start_ns", "end_ns", "duration_ns", "self_ns", "device", "stream", "status"]
    expected = db_rows(any_db, f"SELECT {', '.join(cols)} FROM spans WHERE run_id = 1 ORDER BY rank, span_id")
    assert spans.select(cols).rows() == expected
    wall = anchors(any_db)
    assert (spans["wall_start_ns"] - spans["start_ns"]).unique().to_list() == [wall[0]]
    assert spans.schema["phase"] == pl.String and spans.schema["start_ns"] == pl.Int64

    events = pl.read_parquet(out / "events.parquet")
    log_cols = ["seq", "ts_ns", "kind", "fqn", "module_type", "phase", "call_id", "step", "rank", "thread_id",
                "device", "stream", "status", "graph_task", "tie", "wall_ns"]
    expected_events = db_rows(any_db, f"SELECT {', '.join(log_cols)} FROM event_log WHERE run_id = 1 ORDER BY rank, seq")
    assert events.select(log_cols).rows() == expected_events
    assert set(events["kind"].unique()) == {"enter", "exit"}

    # CSV holds the same tables; an existing directory is written into
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    assert run_cli("export", "toy", "--db", any_db, "--format", "csv", "-o", str(csv_dir)).code == 0
    for name, frame in (("spans", spans), ("events", events)):
        back = pl.read_csv(csv_dir / f"{name}.csv", schema=frame.schema)
        assert back.equals(frame), name


def test_one_table_to_a_file_a_directory_or_stdout(db_path: Path, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    record_toy(str(db_path), "toy", steps=2)
    n_spans = db_rows(str(db_path), "SELECT COUNT(*) FROM spans")[0][0]
    n_events = db_rows(str(db_path), "SELECT COUNT(*) FROM events")[0][0]

    one = tmp_path / "s.csv"
    assert run_cli("export", "toy", "--format", "csv", "--what", "spans", "-o", str(one)).code == 0
    assert pl.read_csv(one).height == n_spans
    assert run_cli("export", "toy", "--format", "parquet", "--what", "events", "-o", str(tmp_path)).code == 0
    assert pl.read_parquet(tmp_path / "events.parquet").height == n_events

    stdout = run_cli("export", "toy", "--format", "csv", "--what", "events", "-o", "-")
    assert stdout.code == 0 and stdout.err == ""
    lines = stdout.out.splitlines()
    assert lines[0].startswith("run_id,rank,seq,ts_ns,wall_ns,kind,fqn,") and len(lines) == n_events + 1
    trace = run_cli("export", "toy", "-o", "-")
    assert trace.code == 0 and trace.err == ""
    assert len(slices(load_trace(trace.out))) == n_spans


def test_export_usage_errors_leave_nothing_behind(db_path: Path, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    record_toy(str(db_path), "toy", steps=1)
    a_file = tmp_path / "taken"
    a_file.write_text("keep")
    cases = [
        (("--what", "events", "-o", str(tmp_path / "t.json")),
         "--format perfetto exports spans only; --what events|all needs --format parquet or csv"),
        (("--format", "parquet", "--what", "spans", "-o", "-"),
         "-o - (stdout) takes text: Parquet is binary, give it a file or directory "
         "(--format csv or perfetto can write to stdout)"),
        (("--format", "csv", "-o", "-"), "-o - (stdout) takes one table: add --what spans or --what events"),
        (("--format", "parquet", "-o", str(a_file)),
         f"-o {a_file}: exists and is not a directory (exporting spans and events writes a directory; use --what spans|events for a single file)"),
        (("-o", str(tmp_path / "no" / "t.json")), f"-o {tmp_path / 'no' / 't.json'}: directory {tmp_path / 'no'} does not exist"),
        (("-o", str(tmp_path)), f"-o {tmp_path}: is a directory"),
    ]
    for args, message in cases:
        result = run_cli("export", "toy", *args)
        assert (result.code, result.out, result.err) == (2, "", f"modtrace: error: {message}\n"), args
    assert a_file.read_text() == "keep"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["modtrace.db", "taken"]
    missing = run_cli("export", "nope", "-o", str(tmp_path / "t.json"))
    assert missing.code == 2 and missing.err.startswith("modtrace: error: no run 'nope'")
    assert not (tmp_path / "t.json").exists()


def test_a_run_without_calls_exports_valid_empty_files(db_path: Path, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    with modtrace.Recorder(db=str(db_path), run="empty") as _rec:
        pass
    _rec.wait_analyzed()  # the writer process analyses the run after the with
    trace = run_cli("export", "empty", "-o", "-")
    assert (trace.code, trace.err) == (0, "")
    parsed = load_trace(trace.out)
    assert [(e["name"], e["args"]) for e in parsed["traceEvents"]] == [
        ("process_name", {"name": "rank 0"}), ("process_sort_index", {"sort_index": 0}),
    ]
    assert run_cli("export", "empty", "--format", "parquet", "-o", str(tmp_path / "pq")).code == 0
    events = pl.read_parquet(tmp_path / "pq" / "events.parquet")
    assert events.height == 0 and events.columns[:6] == ["run_id", "rank", "seq", "ts_ns", "wall_ns", "kind"]
    assert pl.read_parquet(tmp_path / "pq" / "spans.parquet").height == 0
    report = run_cli("report", "empty", "-o", "-")
    assert report.code == 0 and report.err == "" and "</html>" in report.out


# -- progress ----------------------------------------------------------------------------


def _run_with_tty_stderr(args: list[str], env: dict[str, str]) -> tuple[int, bytes, bytes]:
    """Run modtrace with stdout on a pipe and stderr on a pseudo-terminal."""
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "modtrace", *args], stdout=subprocess.PIPE, stderr=slave,
                            env=env, cwd=REPO)
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO once the child closed the terminal
            break
        if not chunk:
            break
        err += chunk
    out = proc.stdout.read() if proc.stdout else b""
    code = proc.wait(timeout=120)
    os.close(master)
    return code, out, err


def test_progress_bar_goes_to_a_terminal_stderr_and_never_into_the_output(  # type: ignore[no-untyped-def]
    db_path: Path, monkeypatch: pytest.MonkeyPatch, run_cli
) -> None:
    record_toy(str(db_path), "toy", steps=2)
    n = db_rows(str(db_path), "SELECT COUNT(*) FROM spans")[0][0]
    env = {**os.environ, "MODTRACE_DB": str(db_path), "MODTRACE_PROGRESS_MIN_ROWS": "1", "COLUMNS": "100"}
    code, out, err = _run_with_tty_stderr(["export", "toy", "-o", "-"], env)
    assert code == 0, err
    assert len(slices(load_trace(out.decode()))) == n  # stdout is the trace and nothing else
    assert b"modtrace: reading run 'toy'" in err and b"modtrace: writing trace" in err
    code, out, err = _run_with_tty_stderr(["report", "toy", "-o", "-"], env)
    assert code == 0, err
    assert out.startswith(b"<!DOCTYPE html>") and out.rstrip().endswith(b"</html>")
    assert b"modtrace: building report" in err
    code, _, err = _run_with_tty_stderr(["export", "toy", "-o", "-", "--quiet"], env)
    assert (code, err) == (0, b"")
    # stderr not a terminal: no bar even above the threshold
    monkeypatch.setenv("MODTRACE_PROGRESS_MIN_ROWS", "1")
    piped = run_cli("export", "toy", "-o", "-")
    assert piped.code == 0 and piped.err == "" and len(slices(load_trace(piped.out))) == n


def test_exports_are_deterministic(db_path: Path, tmp_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    """Two exports of one run are byte-identical (deterministic track ids, ordering and formatting)."""
    record_toy(str(db_path), "toy", steps=2)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert run_cli("export", "toy", "-o", str(a)).code == 0
    assert run_cli("export", "toy", "-o", str(b)).code == 0
    assert a.read_bytes() == b.read_bytes()
