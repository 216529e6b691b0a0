"""Chrome trace event JSON of a run's spans, for the Perfetto UI and chrome://tracing.

One "X" (complete) event per span.  Each rank is a process (pid = rank + 1:
pid 0 is the idle task to Perfetto's trace processor, google/perfetto#394),
named ``rank N``.  Each recording thread gets one track per phase --
``thread 0 MainThread forward``, ``... backward``, ``... recompute`` -- and a
``steps`` track per rank spans each step.  With ``Trace.device_tracks`` (a
run with device times, on the device clock) the spans' device times go on
tracks of their own, one per device stream and phase (``cuda:0 stream 94...
forward (device)``): when the GPU ran each module, beside when Python did.

Slices on one track must nest strictly (a child inside its parent, siblings
apart), or viewers draw them wrongly.  ``assign_lanes`` guarantees that: a
span that would cross the slices already on its track (two backward graph
tasks interleaving on one thread, a span left open) goes to the next lane of
that track, shown as ``... backward #2``.

Timestamps are microseconds from the earliest rank's wall-clock anchor
(``run_ranks.wall_anchor_ns``), so ranks line up.  They are written as exact
decimals of the nanosecond values (``1234.567``), never rounded to whole
microseconds, and kept small (relative to that origin) so that a double
parses them to nanosecond precision; the origin itself is in ``otherData``.
"""

from __future__ import annotations

import io
import json
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, BinaryIO, TextIO

import polars as pl

from modtrace.core.contracts import PHASES
from modtrace.renderers.base import Renderer
from modtrace.renderers.perfetto_lines import line_parts, span_lines
from modtrace.renderers.perfetto_tracks import assign_lanes, trace_frame

CHUNK_ROWS = 128_000
BUILDERS = 2  # threads building chunks' lines
BUILT_AHEAD = 2  # chunks built before the one being written is done


# What of a spans frame the trace's slices are made of (names rather than their ids).
SHOWN_COLUMNS: tuple[str, ...] = (
    "rank", "span_id", "parent_span_id", "depth", "fqn", "module_type", "phase", "call_id", "step", "thread_id",
    "graph_task", "start_ns", "end_ns", "self_ns", "device", "stream", "status",
)


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


def _us(ns: pl.Expr) -> pl.Expr:
    """Non-negative integer nanoseconds -> exact decimal microseconds as text (``1234.567``)."""
    return pl.concat_str((ns // 1000).cast(pl.String), pl.lit("."), (ns % 1000 + 1000).cast(pl.String).str.slice(1))


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
        trace = trace_frame(self._shown(spans), anchors, origin)
        steps = step_frame(trace)
        if model.device_tracks:
            on_device, stream_names = device_spans(spans)
            if on_device.height:
                trace = pl.concat([trace, trace_frame(self._shown(on_device), anchors, origin)], how="vertical_relaxed")
                thread_names = {**thread_names, **stream_names}
        # each slice's (rank, thread, phase, lane) as one integer: a run of one track, and the lane
        lanes = trace.select(pl.col("lane").max().fill_null(0).cast(pl.Int64)).item()
        track_lane = (pl.struct("rank", "thread_id", "phase").rle_id().cast(pl.Int64) * (int(lanes) + 1)
                      + pl.col("lane")).alias("_track_lane")
        keyed = trace.select(track_lane)["_track_lane"]
        distinct = trace.select(track_lane, "rank", "thread_id", "phase", "lane").unique("_track_lane", keep="first")
        tracks = self._tracks(distinct, steps, thread_names)
        tid_of = {(t["rank"], t["thread_id"], t["phase"], t["lane"]): t["tid"] for t in tracks}
        tid_frame = pl.DataFrame(
            [(r, th, ph, ln, tid) for (r, th, ph, ln), tid in tid_of.items()],
            schema={"rank": pl.Int32(), "thread_id": pl.Int32(), "phase": pl.String(), "lane": pl.Int32(), "tid": pl.Int64()},
            orient="row",
        )
        # a slice without a phase gets no tid (its line is left empty)
        tid_by_key = {k: tid_of.get((r, th, ph, ln)) if ph is not None else None
                      for k, r, th, ph, ln in distinct.iter_rows()}
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
        # a UTF-8 file's bytes, for polars to write into; else text through ``out``
        utf8 = str(getattr(out, "encoding", None) or "").lower().replace("-", "") == "utf8"
        raw: BinaryIO | None = getattr(out, "buffer", None) if utf8 else None

        def emit(lines: list[str]) -> None:
            nonlocal sep
            if lines:
                out.write(sep)
                out.write(",\n".join(lines))
                sep = ",\n"

        def emit_column(frame: pl.DataFrame) -> None:
            """One event per row of ``frame``'s one text column, written by polars in one piece."""
            nonlocal sep
            if frame.height:
                out.write(sep)
                head = frame.head(frame.height - 1)
                if head.height and raw is not None:
                    out.flush()  # polars writes the bytes straight into the file, after what is buffered
                    head.write_csv(raw, include_header=False, quote_style="never", line_terminator=",\n")
                elif head.height:
                    out.write(head.write_csv(include_header=False, quote_style="never", line_terminator=",\n"))
                out.write(frame[-1, 0])
                sep = ",\n"

        emit(self._metadata(tracks, sorted(set(anchors) | set(trace["rank"].unique().to_list()))))

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
        )
        emit_column(step_lines)

        trace = trace.with_columns(keyed.replace_strict(
            pl.Series(list(tid_by_key), dtype=pl.Int64), pl.Series(list(tid_by_key.values()), dtype=pl.Int64),
            default=None, return_dtype=pl.Int64).alias("tid"))
        parts = line_parts(trace)
        trace = parts.keyed(trace)
        # Chunks' lines are built by two threads (polars lets go of Python's lock) while this one
        # writes the chunk before them, in order; at most BUILT_AHEAD chunks wait in memory.
        def build(start: int) -> pl.DataFrame:
            return span_lines(trace.slice(start, CHUNK_ROWS), parts).to_frame()

        with ThreadPoolExecutor(BUILDERS, thread_name_prefix="modtrace-trace") as builders:
            pending: deque[Future[pl.DataFrame]] = deque()
            for start in range(0, trace.height, CHUNK_ROWS):
                pending.append(builders.submit(build, start))
                if len(pending) > BUILT_AHEAD:
                    self._emit_next(pending, emit_column)
            while pending:
                self._emit_next(pending, emit_column)
        out.write("\n]}\n")

    @staticmethod
    def _shown(spans: pl.DataFrame) -> pl.DataFrame:
        """Only the columns a trace shows or places slices by (less for the sort to move)."""
        return spans.select(c for c in SHOWN_COLUMNS if c in spans.columns)

    def _emit_next(self, pending: deque[Future[pl.DataFrame]], emit: Callable[[pl.DataFrame], None]) -> None:
        lines = pending.popleft().result()
        emit(lines)
        if self.progress is not None:
            self.progress(lines.height)

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
