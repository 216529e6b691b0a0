"""The fast paths of the Perfetto export give what the plain ones give: slice order and lanes as a
sort by six keys and a walk of every track; span rows read column by column as the ordinary read
reads them (and that read when the fast one cannot vouch for the rows); each span's line byte for
byte as a plain Python formatting of its fields writes it."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import polars as pl
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import modtrace
import modtrace.api
from modtrace.api import _cli
from modtrace.core.contracts import SPAN_COUNTS, SPAN_MEMORY
from modtrace.renderers.perfetto_lines import line_parts, span_lines
from modtrace.renderers.perfetto_tracks import assign_lanes, trace_frame
from modtrace.renderers.trace_columns import TRACE_SPAN_COLUMNS
from modtrace.results.materialize import load_spans
from modtrace.store.analysis_store import read_span_rows
from modtrace.store.engine import open_store
from modtrace.store.span_columns import start_span_columns
from tests.helpers.device_clock import FakeStream
from tests.helpers.device_recording import _record
from tests.helpers.models import Pair
from tests.helpers.recording import FakeClock

PHASES = ["forward", "backward", "recompute"]


def _plain_lanes(starts: list[int], ends: list[int], keys: list[int]) -> list[int]:
    """The lane walk at its plainest: per key, the first lane whose innermost open interval holds it."""
    out: list[int] = []
    lanes: dict[int, list[list[int]]] = {}
    for start, end, key in zip(starts, ends, keys, strict=True):
        stacks = lanes.setdefault(key, [])
        for i, stack in enumerate(stacks):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or stack[-1] >= end:
                stack.append(end)
                out.append(i)
                break
        else:
            stacks.append([end])
            out.append(len(stacks) - 1)
    return out


def _plain_trace(frame: pl.DataFrame) -> pl.DataFrame:
    """trace_frame the plain way: every span sorted by the six keys, every track walked."""
    out = frame.with_columns(pl.col("end_ns").is_null().alias("unclosed"), pl.col("start_ns").alias("t0"),
                             pl.col("end_ns").fill_null(pl.max_horizontal(pl.col("end_ns").max(), pl.col("start_ns").max()))
                             .alias("t1"))
    names = sorted(set(out["phase"].to_list()))
    by_name = pl.col("phase").replace_strict(names, list(range(len(names))), return_dtype=pl.Int8)
    out = out.sort(["rank", "thread_id", by_name, "t0", "t1", "depth"],
                   descending=[False, False, False, False, True, False], nulls_last=[False] * 6)
    keys = out.select(pl.struct("rank", "thread_id", "phase").rle_id())["rank"].to_list()
    return out.with_columns(pl.Series("lane", _plain_lanes(out["t0"].to_list(), out["t1"].to_list(), keys),
                                      dtype=pl.Int32))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.sampled_from(PHASES), st.integers(0, 40), st.integers(0, 25),
                          st.integers(0, 14), st.integers(0, 2), st.booleans()), min_size=1, max_size=40))
def test_slices_take_the_order_and_lanes_of_the_plain_walk(raw: list[tuple[int, str, int, int, int, int, bool]]) -> None:
    """Spans in span_id order, starts rising per thread or not, with parent links right, wrong,
    on other tracks or pointing forward, equal starts and ends (ties broken by depth), unclosed ones."""
    rows = []
    for i, (thread, phase, start, dur, parent, depth, closed) in enumerate(raw):
        rows.append({"rank": 0, "span_id": i, "parent_span_id": parent if parent != i else None, "depth": depth,
                     "thread_id": thread, "phase": phase, "start_ns": start,
                     "end_ns": start + dur if closed or i == 0 else None, "step": 0})
    frame = pl.DataFrame(rows, schema={"rank": pl.Int32, "span_id": pl.Int64, "parent_span_id": pl.Int64,
                                       "depth": pl.Int32, "thread_id": pl.Int32, "phase": pl.String,
                                       "start_ns": pl.Int64, "end_ns": pl.Int64, "step": pl.Int32})
    got = trace_frame(frame, {0: 0}, 0)
    want = _plain_trace(frame)
    assert got.select("span_id", "t0", "t1", "lane").rows() == want.select("span_id", "t0", "t1", "lane").rows()


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 30), st.integers(0, 12)), max_size=60))
def test_assign_lanes_is_the_plain_walk(intervals: list[tuple[int, int, int]]) -> None:
    items = sorted(((k, s, s + d) for k, s, d in intervals), key=lambda t: (t[0], t[1], -t[2]))
    starts, ends, keys = ([t[i] for t in items] for i in (1, 2, 0))
    assert assign_lanes(starts, ends, keys) == _plain_lanes(starts, ends, keys)


def test_nested_spans_in_start_order_stay_in_the_first_lane_and_a_crossing_does_not() -> None:
    # a parent (0..100) with two children; then a span crossing the parent's end
    frame = pl.DataFrame({
        "rank": [0, 0, 0, 0], "span_id": [1, 2, 3, 4], "parent_span_id": [None, 1, 1, None], "depth": [0, 1, 1, 0],
        "thread_id": [0, 0, 0, 0], "phase": ["forward"] * 4, "start_ns": [0, 10, 50, 90], "end_ns": [100, 40, 80, 120],
        "step": [0, 0, 0, 0],
    }, schema_overrides={"rank": pl.Int32, "depth": pl.Int32, "thread_id": pl.Int32, "step": pl.Int32})
    got = trace_frame(frame, {0: 0}, 0)
    assert got["lane"].to_list() == [0, 0, 0, 1]
    assert trace_frame(frame.head(3), {0: 0}, 0)["lane"].to_list() == [0, 0, 0]


def _read_both(db: str, run: str) -> tuple[pl.DataFrame, pl.DataFrame]:
    wanted = tuple(dict.fromkeys(("rank", "span_id", "module_id", "device_id", *TRACE_SPAN_COLUMNS)))
    with modtrace.api.open(db) as database:
        run_id = database.run(run).id
    store = open_store(db)
    try:
        fast = start_span_columns(store, run_id, wanted).result()
        assert fast is not None, "the column-wise read fell back to the ordinary read"
        plain = read_span_rows(store, run_id, columns=wanted)
    finally:
        store.dispose()
    return fast, plain


def test_column_wise_read_is_the_ordinary_read_on_two_ranks(any_db: str) -> None:
    torch.manual_seed(0)
    pair = Pair()
    for rank in (0, 1):
        with modtrace.Recorder(db=any_db, run="dist", join=True, rank=rank, world_size=2, clock=FakeClock()) as rec:
            for _ in range(3):
                pair(torch.randn(2, 6)).sum().backward()
        rec.wait_analyzed()
    fast, plain = _read_both(any_db, "dist")
    assert fast.height > 20 and set(fast["rank"].unique().to_list()) == {0, 1}
    assert fast.equals(plain)


def test_column_wise_read_is_the_ordinary_read_with_device_streams(db_path: Path) -> None:
    _record(db_path, "side", side=FakeStream(0, 0x9000), writer="thread")
    fast, plain = _read_both(str(db_path), "side")
    assert fast["stream"].drop_nulls().len() > 0 and fast["graph_task"].drop_nulls().len() > 0
    assert fast.equals(plain)


def test_a_rank_the_run_does_not_list_falls_back_to_the_ordinary_read(db_path: Path) -> None:
    with modtrace.Recorder(db=str(db_path), run="r", clock=FakeClock()) as rec:
        Pair()(torch.randn(2, 6)).sum().backward()
    rec.wait_analyzed()
    with sqlite3.connect(db_path) as conn:  # a copy of one span row under a rank the run never had
        cols = [r[1] for r in conn.execute("PRAGMA table_info(span_rows)")]
        picked = ", ".join("7" if c == "rank" else c for c in cols)
        conn.execute(f"INSERT INTO span_rows ({', '.join(cols)}) SELECT {picked} FROM span_rows LIMIT 1")
    store = open_store(str(db_path))
    wanted = ("rank", "span_id", "start_ns", "end_ns")
    try:
        declined = start_span_columns(store, 1, wanted).result() is None
        got = load_spans(store, 1, wanted)  # the read export uses: the ordinary one answers
    finally:
        store.dispose()
    assert declined and 7 in got["rank"].to_list()


# -- lines ---------------------------------------------------------------------------------


def _plain_us(ns: int) -> str:
    return f"{ns // 1000}.{ns % 1000:03d}"


def _plain_line(r: dict[str, Any]) -> str:
    """A span's event formatted field by field in Python, as the renderer's format documents it."""
    def num(v: Any) -> str:
        return "null" if v is None else str(v)

    def text(v: Any) -> str:
        return "null" if v is None else json.dumps(v)

    status = "unclosed" if r["unclosed"] else r["status"]
    self_us = _plain_us(r["self_ns"]) if r["self_ns"] is not None and r["self_ns"] >= 0 else "null"
    return (f'{{"ph": "X", "cat": "{r["phase"]}", "name": {text(r["fqn"])}, "pid": {r["rank"] + 1}, "tid": {r["tid"]}, '
            f'"ts": {_plain_us(r["t0"])}, "dur": {_plain_us(r["t1"] - r["t0"])}, "args": {{"fqn": {text(r["fqn"])}, '
            f'"module_type": {text(r["module_type"])}, "phase": "{r["phase"]}", "call_id": {num(r["call_id"])}, '
            f'"step": {num(r["step"])}, "rank": {num(r["rank"])}, "thread_id": {num(r["thread_id"])}, '
            f'"device": {text(r["device"])}, "stream": {num(r["stream"])}, "status": "{status}", '
            f'"graph_task": {num(r["graph_task"])}, "span_id": {num(r["span_id"])}, '
            f'"parent_span_id": {num(r["parent_span_id"])}, "self_us": {self_us}}}}}')


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(
    st.integers(-3000, 10**13), st.integers(-2500, 10**7), st.one_of(st.none(), st.integers(-5, 10**6)),
    st.sampled_from(["Net", "Net.blocks.0", 'odd "name" é\\', None]), st.sampled_from(["Linear", None]),
    st.sampled_from([None, 0, 94_000_000_000_000]), st.one_of(st.none(), st.integers(0, 3), st.integers(10**9, 10**9 + 2)),
    st.one_of(st.none(), st.integers(0, 70_000)), st.booleans(), st.integers(1, 4),
), min_size=1, max_size=25))
def test_each_span_line_is_its_fields_formatted_one_by_one(raw: list[tuple[Any, ...]]) -> None:
    rows = []
    for i, (t0, dur, self_ns, fqn, mtype, stream, graph_task, step, unclosed, tid) in enumerate(raw):
        rows.append({"rank": tid % 2, "span_id": 10 * i + 7, "parent_span_id": None if i == 0 else 10 * i,
                     "thread_id": 0, "phase": PHASES[tid % 3], "tid": tid, "fqn": fqn, "module_type": mtype,
                     "device": "cuda:0" if stream else "cpu", "stream": stream, "status": "ok", "unclosed": unclosed,
                     "call_id": i * 1_000_003, "step": step, "graph_task": graph_task, "t0": t0, "t1": t0 + dur,
                     "self_ns": self_ns})
    frame = pl.DataFrame(rows, schema={
        "rank": pl.Int32, "span_id": pl.Int64, "parent_span_id": pl.Int64, "thread_id": pl.Int32, "phase": pl.String,
        "tid": pl.Int64, "fqn": pl.Categorical, "module_type": pl.Categorical, "device": pl.Categorical,
        "stream": pl.Int64, "status": pl.Enum(["ok", "error"]), "unclosed": pl.Boolean, "call_id": pl.Int64,
        "step": pl.Int32, "graph_task": pl.Int64, "t0": pl.Int64, "t1": pl.Int64, "self_ns": pl.Int64})
    got = span_lines(frame, line_parts(frame)).to_list()
    assert got == [_plain_line(r) for r in rows]


# -- the read begun early ------------------------------------------------------------------


def test_a_read_begun_early_gives_what_the_plain_read_gives(any_db: str) -> None:
    """start_spans_with (its read runs while other queries are made) is spans_with, and the
    spans of the analysis, on a real recording."""
    torch.manual_seed(0)
    with modtrace.Recorder(db=any_db, run="early", clock=FakeClock()) as rec:
        for _ in range(3):
            Pair()(torch.randn(2, 6)).sum().backward()
    rec.wait_analyzed()
    with modtrace.api.open(any_db) as database:
        begun = _cli.start_spans_with(database, "early", TRACE_SPAN_COLUMNS)
        details = database.run("early").details  # other work meanwhile, on other connections
        early = begun()
    with modtrace.api.open(any_db) as database:
        plain = _cli.start_spans_with(database, "early", TRACE_SPAN_COLUMNS)()
        whole = database.spans("early")
    assert details["events"] > 0 and early.height > 10
    assert early.equals(plain)
    assert early.select(TRACE_SPAN_COLUMNS).equals(whole.select(TRACE_SPAN_COLUMNS))


def test_a_read_begun_early_of_a_run_never_analysed_is_its_computed_spans(db_path: Path) -> None:
    torch.manual_seed(0)
    with modtrace.Recorder(db=str(db_path), run="raw", clock=FakeClock(), analyze=False):
        Pair()(torch.randn(2, 6)).sum().backward()
    with modtrace.api.open(str(db_path)) as database:
        assert not _cli.has_analysis(database, "raw")
        early = _cli.start_spans_with(database, "raw", TRACE_SPAN_COLUMNS)()
        computed = database.spans("raw")
    # Database.spans adds the counters and memory
    assert early.height > 0 and early.equals(computed.drop(*SPAN_COUNTS.names, *SPAN_MEMORY.names))


def test_export_leaves_the_cycle_collector_as_it_found_it(db_path: Path, run_cli: Any, tmp_path: Path) -> None:
    import gc

    with modtrace.Recorder(db=str(db_path), run="gc", clock=FakeClock()) as rec:
        Pair()(torch.randn(2, 6)).sum().backward()
    rec.wait_analyzed()
    assert gc.isenabled()
    assert run_cli("export", "gc", "-o", str(tmp_path / "t.json"), "-q").code == 0
    assert gc.isenabled()
    gc.disable()
    try:
        assert run_cli("export", "gc", "-o", str(tmp_path / "t.json"), "-q").code == 0
        assert not gc.isenabled()
    finally:
        gc.enable()
