"""The Perfetto renderer as it was before it was made fast (commit 07e48b3, one Python string per
span, tracks by a second sort): kept as the reference the fast one must match event for event
(tests/test_export_reference.py).  Not used by modtrace itself.

Chrome trace event JSON of a run's spans, for the Perfetto UI and chrome://tracing."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TextIO

import polars as pl

from modtrace.core.contracts import PHASES
from modtrace.renderers.base import Renderer

CHUNK_ROWS = 50_000


@dataclass(frozen=True)
class Trace:
    """What a trace shows of one run: its spans, each rank's wall-clock anchor, thread names and
    the run's metadata (name, id, modtrace_version)."""

    spans: pl.DataFrame
    anchors: Mapping[int, int]
    thread_names: Mapping[tuple[int, int], str | None]
    run: Mapping[str, Any]
    device_tracks: bool = False  # the spans' device times on tracks per stream too


# Device tracks take thread ids from here up (one per rank, device and stream), after every thread.
DEVICE_TRACK_BASE = 1 << 30


def device_spans(spans: pl.DataFrame) -> tuple[pl.DataFrame, dict[tuple[int, int], str]]:
    """The spans with device times, on them (start, end, self) and on a track per (rank, device,
    stream) -- ``thread_id`` from ``DEVICE_TRACK_BASE`` -- and each track's name."""
    if "device_start_ns" not in spans.columns:
        return spans.clear(), {}
    timed = spans.filter(pl.col("device_start_ns").is_not_null() & pl.col("device_end_ns").is_not_null())
    keys = timed.select("rank", "device_id", "stream", pl.col("device").cast(pl.String)).unique().sort(
        "rank", "device_id", "stream", nulls_last=True)
    keys = keys.with_columns((pl.int_range(pl.len()).over("rank") + DEVICE_TRACK_BASE).cast(pl.Int32).alias("_track"))
    names = {(int(r), int(t)): f"{d or 'device'} stream {s if s is not None else '-'}"
             for r, d, s, t in keys.select("rank", "device", "stream", "_track").iter_rows()}
    out = timed.join(keys.drop("device"), on=["rank", "device_id", "stream"], how="left", nulls_equal=True,
                     maintain_order="left").with_columns(
        pl.col("device_start_ns").alias("start_ns"), pl.col("device_end_ns").alias("end_ns"),
        pl.col("device_self_ns").alias("self_ns"), pl.col("_track").alias("thread_id"),
    ).drop("_track")
    return out, names


def assign_lanes(starts: Iterable[int], ends: Iterable[int], keys: Iterable[Any]) -> list[int]:
    """Lane per interval, so that the intervals of one (key, lane) nest strictly.

    Intervals must come sorted by (key, start, end descending).  Each lane
    keeps the ends of its open intervals; an interval goes to the first lane
    where it fits inside the innermost open one (or where none is open).
    """
    lanes_out: list[int] = []
    lanes: list[list[int]] = []
    current: Any = object()
    for start, end, key in zip(starts, ends, keys, strict=True):
        if key != current:
            current, lanes = key, []
        for i, stack in enumerate(lanes):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or stack[-1] >= end:
                stack.append(end)
                lanes_out.append(i)
                break
        else:
            lanes.append([end])
            lanes_out.append(len(lanes) - 1)
    return lanes_out


def _us(ns: pl.Expr) -> pl.Expr:
    """Non-negative integer nanoseconds -> exact decimal microseconds as text."""
    return pl.format("{}.{}", ns // 1000, (ns % 1000).cast(pl.String).str.zfill(3))


def _json_text(col: str) -> pl.Expr:
    """A string column as JSON string literals (null -> null), escaping each distinct value once."""
    return pl.col(col).cast(pl.String).map_batches(
        lambda s: s.replace_strict(
            {v: json.dumps(v) for v in s.unique().drop_nulls().to_list()}, default=None, return_dtype=pl.String
        ),
        return_dtype=pl.String,
    ).fill_null("null")


def _num(col: str) -> pl.Expr:
    return pl.col(col).cast(pl.String).fill_null("null")


def trace_frame(spans: pl.DataFrame, anchors: Mapping[int, int], origin_ns: int) -> pl.DataFrame:
    """Spans frame -> one row per slice with its track and trace-relative nanoseconds.

    Adds ``t0`` and ``t1`` (ns since ``origin_ns``), ``lane``, ``unclosed``.
    A span never exited ends at the last timestamp of its rank.
    """
    anchor = pl.DataFrame(
        {"rank": list(anchors), "_anchor": [anchors[r] - origin_ns for r in anchors]},
        schema={"rank": pl.Int32(), "_anchor": pl.Int64()},
    )
    last = pl.max_horizontal(pl.col("end_ns").max(), pl.col("start_ns").max()).over("rank")
    frame = (
        spans.join(anchor, on="rank", how="left", maintain_order="left")
        .with_columns(pl.col("_anchor").fill_null(0))
        .with_columns(
            pl.col("end_ns").is_null().alias("unclosed"),
            (pl.col("_anchor") + pl.col("start_ns")).alias("t0"),
            (pl.col("_anchor") + pl.col("end_ns").fill_null(last)).alias("t1"),
            pl.col("phase").cast(pl.String).alias("phase"),
        )
        .sort("rank", "thread_id", "phase", "t0", pl.col("t1"), "depth", descending=[False, False, False, False, True, False])
    )
    frame = frame.with_columns(
        pl.struct("rank", "thread_id", "phase").rank("dense").cast(pl.Int64).alias("_track")
    )
    dirty = _unnested_tracks(frame)
    lane = pl.Series("lane", [0] * frame.height, dtype=pl.Int32)
    if dirty:
        # Only tracks whose spans do not already nest take the row-by-row walk.
        idx = frame.with_row_index("_i").filter(pl.col("_track").is_in(dirty))
        lanes = assign_lanes(idx["t0"].to_list(), idx["t1"].to_list(), idx["_track"].to_list())
        lane = lane.scatter(idx["_i"], pl.Series(lanes, dtype=pl.Int32))
    return frame.with_columns(lane).drop("_anchor", "_track")


def _unnested_tracks(frame: pl.DataFrame) -> list[int]:
    """Tracks where some span is not inside its parent on that track, or overlaps a sibling.

    When every span lies inside its parent and siblings are disjoint, the
    track's spans nest strictly (by induction over the tree), and one lane
    holds them all.  A parent on another track (a recompute's backward
    parent) counts as none.
    """
    parents = frame.select(
        "rank", pl.col("span_id").alias("parent_span_id"), pl.col("_track").alias("_ptrack"),
        pl.col("t0").alias("_p0"), pl.col("t1").alias("_p1"),
    )
    linked = frame.select("rank", "span_id", "parent_span_id", "_track", "t0", "t1").join(
        parents, on=["rank", "parent_span_id"], how="left"
    ).with_columns(
        pl.when(pl.col("_ptrack") == pl.col("_track")).then(pl.col("parent_span_id")).alias("_parent")
    )
    outside = (pl.col("_parent").is_not_null() & ((pl.col("t0") < pl.col("_p0")) | (pl.col("t1") > pl.col("_p1"))))
    siblings = linked.sort("_track", "_parent", "t0", "t1", nulls_last=True).with_columns(
        pl.col("t1").shift(1).over("_track", "_parent").alias("_prev_end")
    )
    overlap = pl.col("_prev_end").is_not_null() & (pl.col("t0") < pl.col("_prev_end"))
    bad = siblings.filter(outside | overlap)["_track"].unique().sort()
    return [int(t) for t in bad.to_list()]


def step_frame(trace: pl.DataFrame) -> pl.DataFrame:
    """One row per (rank, step): from the step's first enter to its last exit, with its lane."""
    steps = (
        trace.group_by("rank", "step")
        .agg(pl.col("t0").min(), pl.col("t1").max(), pl.len().alias("spans"))
        .sort("rank", "t0", "t1", descending=[False, False, True])
    )
    lanes = assign_lanes(steps["t0"].to_list(), steps["t1"].to_list(), steps["rank"].to_list())
    return steps.with_columns(pl.Series("lane", lanes, dtype=pl.Int32))


class PerfettoRenderer(Renderer[Trace]):
    """Writes the trace of one run as a Chrome trace event JSON object, chunk by chunk: one slice
    per span."""

    kind = "trace"
    name = "perfetto"

    def render(self, model: Trace) -> str:
        buf = io.StringIO()
        self.write(model, buf)
        return buf.getvalue()

    def write(self, model: Trace, out: TextIO) -> None:
        spans, anchors, thread_names, run = model.spans, model.anchors, model.thread_names, model.run
        origin = min(anchors.values()) if anchors else 0
        trace = trace_frame(spans, anchors, origin)
        steps = step_frame(trace)
        if model.device_tracks:
            on_device, stream_names = device_spans(spans)
            if on_device.height:
                trace = pl.concat([trace, trace_frame(on_device, anchors, origin)], how="vertical_relaxed")
                thread_names = {**thread_names, **stream_names}
        tracks = self._tracks(trace, steps, thread_names)
        tid_of = {(t["rank"], t["thread_id"], t["phase"], t["lane"]): t["tid"] for t in tracks}
        tid_frame = pl.DataFrame(
            [(r, th, ph, ln, tid) for (r, th, ph, ln), tid in tid_of.items()],
            schema={"rank": pl.Int32(), "thread_id": pl.Int32(), "phase": pl.String(), "lane": pl.Int32(), "tid": pl.Int64()},
            orient="row",
        )
        other = {
            "run": run.get("name"),
            "run_id": run.get("id"),
            "wall_origin_ns": origin,
            "time_origin": "ts 0 is the earliest rank's wall-clock anchor (wall_origin_ns, ns since the Unix epoch)",
            "modtrace_version": run.get("modtrace_version"),
            "clock": "device" if model.device_tracks else "host",
        }
        out.write('{"displayTimeUnit": "ms", "otherData": ')
        out.write(json.dumps(other, default=str))
        out.write(', "traceEvents": [\n')
        sep = ""

        def emit(lines: list[str]) -> None:
            nonlocal sep
            if lines:
                out.write(sep)
                out.write(",\n".join(lines))
                sep = ",\n"

        emit(self._metadata(tracks, sorted(set(anchors) | set(trace["rank"].to_list()))))

        step_lines = steps.join(
            tid_frame.filter(pl.col("phase") == "step").drop("thread_id", "phase"), on=["rank", "lane"], how="left"
        ).select(
            pl.concat_str(
                pl.lit('{"ph": "X", "cat": "step", "name": "step '), pl.col("step").cast(pl.String),
                pl.lit('", "pid": '), (pl.col("rank") + 1).cast(pl.String),
                pl.lit(', "tid": '), pl.col("tid").cast(pl.String),
                pl.lit(', "ts": '), _us(pl.col("t0")),
                pl.lit(', "dur": '), _us(pl.col("t1") - pl.col("t0")),
                pl.lit(', "args": {"step": '), pl.col("step").cast(pl.String),
                pl.lit(', "rank": '), pl.col("rank").cast(pl.String),
                pl.lit(', "spans": '), pl.col("spans").cast(pl.String),
                pl.lit("}}"),
            ).alias("line")
        )["line"]
        emit(step_lines.to_list())

        for start in range(0, trace.height, CHUNK_ROWS):
            chunk = trace.slice(start, CHUNK_ROWS).join(
                tid_frame, on=["rank", "thread_id", "phase", "lane"], how="left", maintain_order="left"
            )
            emit(chunk.select(self._span_line().alias("line"))["line"].to_list())
            if self.progress is not None:
                self.progress(chunk.height)
        out.write("\n]}\n")

    @staticmethod
    def _span_line() -> pl.Expr:
        status = pl.when(pl.col("unclosed")).then(pl.lit("unclosed")).otherwise(pl.col("status").cast(pl.String))
        return pl.concat_str(
            pl.lit('{"ph": "X", "cat": "'), pl.col("phase"),
            pl.lit('", "name": '), _json_text("fqn"),
            pl.lit(', "pid": '), (pl.col("rank") + 1).cast(pl.String),
            pl.lit(', "tid": '), pl.col("tid").cast(pl.String),
            pl.lit(', "ts": '), _us(pl.col("t0")),
            pl.lit(', "dur": '), _us(pl.col("t1") - pl.col("t0")),
            pl.lit(', "args": {"fqn": '), _json_text("fqn"),
            pl.lit(', "module_type": '), _json_text("module_type"),
            pl.lit(', "phase": "'), pl.col("phase"),
            pl.lit('", "call_id": '), _num("call_id"),
            pl.lit(', "step": '), _num("step"),
            pl.lit(', "rank": '), _num("rank"),
            pl.lit(', "thread_id": '), _num("thread_id"),
            pl.lit(', "device": '), _json_text("device"),
            pl.lit(', "stream": '), _num("stream"),
            pl.lit(', "status": "'), status,
            pl.lit('", "graph_task": '), _num("graph_task"),
            pl.lit(', "span_id": '), _num("span_id"),
            pl.lit(', "parent_span_id": '), _num("parent_span_id"),
            pl.lit(', "self_us": '), pl.when(pl.col("self_ns").is_not_null() & (pl.col("self_ns") >= 0))
            .then(_us(pl.col("self_ns"))).otherwise(pl.lit("null")),
            pl.lit("}}"),
        )

    @staticmethod
    def _tracks(
        trace: pl.DataFrame, steps: pl.DataFrame, thread_names: Mapping[tuple[int, int], str | None]
    ) -> list[dict[str, Any]]:
        """Every track with its tid and name: per rank the steps lanes, then (thread, phase, lane)."""
        keys: set[tuple[int, int, str, int]] = set()
        keys.update((int(r), -1, "step", int(ln)) for r, ln in steps.select("rank", "lane").unique().iter_rows())
        keys.update(
            (int(r), int(t), str(p), int(ln))
            for r, t, p, ln in trace.select("rank", "thread_id", "phase", "lane").unique().iter_rows()
        )
        phase_order = {"step": -1, **{p: i for i, p in enumerate(PHASES)}}
        ordered = sorted(keys, key=lambda k: (k[0], k[1], phase_order.get(k[2], 9), k[3]))
        per_rank: dict[int, int] = {}
        for rank, *_ in ordered:
            per_rank[rank] = per_rank.get(rank, 0) + 1
        stride = 10_000
        while stride <= max(per_rank.values(), default=0):
            stride *= 10
        tracks = []
        index: dict[int, int] = {}
        for rank, thread, phase, lane in ordered:
            k = index.get(rank, 0)
            index[rank] = k + 1
            if phase == "step":
                name = "steps"
            elif thread >= DEVICE_TRACK_BASE:
                name = f"{thread_names.get((rank, thread))} {phase} (device)"
            else:
                tname = thread_names.get((rank, thread))
                name = f"thread {thread} {tname} {phase}" if tname else f"thread {thread} {phase}"
            if lane:
                name += f" #{lane + 1}"
            tracks.append(
                {"rank": rank, "thread_id": thread, "phase": phase, "lane": lane, "tid": rank * stride + k + 1,
                 "name": name, "sort": k}
            )
        return tracks

    @staticmethod
    def _metadata(tracks: list[dict[str, Any]], ranks: list[int]) -> list[str]:
        lines = []
        for rank in ranks:
            pid = rank + 1
            lines.append(json.dumps({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": f"rank {rank}"}}))
            lines.append(json.dumps({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": rank}}))
        for t in tracks:
            pid = t["rank"] + 1
            lines.append(json.dumps({"ph": "M", "name": "thread_name", "pid": pid, "tid": t["tid"], "args": {"name": t["name"]}}))
            lines.append(json.dumps({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": t["tid"], "args": {"sort_index": t["sort"]}}))
        return lines
