"""Slices on tracks for the Perfetto trace: their order, and a lane for each that keeps a track nested.

Slices on one track must nest strictly (a child inside its parent, siblings
apart), or viewers draw them wrongly.  ``assign_lanes`` guarantees that: a
span that would cross the slices already on its track goes to the next lane
of that track.  It walks every slice: one Python step per slice costs less
than proving in polars which tracks already nest (the parent links' join
alone costs more than the walk of a track whose spans nest), and on a run
whose backward passes cross on every step nearly every track needs the walk
anyway.

Spans arrive by (rank, span_id), which is by start on each thread; when
they are then in order of start on every track, ordering them is a stable
sort by track instead of a sort by six keys (``_in_track_order``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from itertools import chain, repeat
from typing import Any

import polars as pl

_SORT_DESCENDING = [False, False, False, False, True, False]


def assign_lanes(starts: Iterable[int], ends: Iterable[int], keys: Iterable[Any]) -> list[int]:
    """Lane per interval, so that the intervals of one (key, lane) nest strictly.

    Intervals must come sorted by (key, start, end descending).  Each lane
    keeps the ends of its open intervals; an interval goes to the first lane
    where it fits inside the innermost open one (or where none is open).
    """
    lanes_out: list[int] = []
    put = lanes_out.append
    lanes: list[list[int]] = []
    current: Any = object()
    for start, end, key in zip(starts, ends, keys, strict=True):
        if key != current:
            current, lanes = key, []
        # the first lane is tried inline: nearly every span fits there
        if lanes:
            stack = lanes[0]
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or stack[-1] >= end:
                stack.append(end)
                put(0)
                continue
        for i in range(1, len(lanes)):
            stack = lanes[i]
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or stack[-1] >= end:
                stack.append(end)
                put(i)
                break
        else:
            lanes.append([end])
            put(len(lanes) - 1)
    return lanes_out


def trace_frame(spans: pl.DataFrame, anchors: Mapping[int, int], origin_ns: int) -> pl.DataFrame:
    """Spans frame -> one row per slice with its track and trace-relative nanoseconds, in track order.

    Adds ``t0`` and ``t1`` (ns since ``origin_ns``), ``lane``, ``unclosed``.
    A span never exited ends at the last timestamp of its rank.  Rows come
    by (rank, thread_id, phase name, t0, t1 descending, depth).
    """
    # each rank's anchor relative to the origin (0 for a rank without one)
    anchor = pl.col("rank").replace_strict(
        pl.Series(list(anchors), dtype=pl.Int32), pl.Series([anchors[r] - origin_ns for r in anchors], dtype=pl.Int64),
        default=0, return_dtype=pl.Int64,
    ).fill_null(0)
    last = pl.max_horizontal(pl.col("end_ns").max(), pl.col("start_ns").max()).over("rank")
    frame = (
        spans.with_columns(anchor.alias("_anchor"))
        .with_columns(
            pl.col("end_ns").is_null().alias("unclosed"),
            (pl.col("_anchor") + pl.col("start_ns")).alias("t0"),
            (pl.col("_anchor") + pl.col("end_ns").fill_null(last)).alias("t1"),
            pl.col("phase").cast(pl.String).alias("phase"),
        )
        .drop("_anchor")
    )
    # phases in name order (as text sorts), as small integers: a cheaper sort key than the text
    names = sorted(set(frame["phase"].unique().drop_nulls().to_list()))
    frame = frame.with_columns(
        pl.col("phase").replace_strict(names, list(range(len(names))), default=None, return_dtype=pl.Int8)
        .alias("_phase")
    )
    keyed = not any(frame[c].null_count() for c in ("rank", "thread_id", "_phase", "t0", "t1", "depth"))
    frame = _in_track_order(frame) if keyed else _sorted(frame)
    # in track order: a track is a run of equal (rank, thread_id, phase)
    frame = frame.with_columns(pl.struct("rank", "thread_id", "_phase").rle_id().cast(pl.Int64).alias("_track"))
    if keyed:
        # the walk's key changes only where a track does: one repeated key per run, not a list of them
        runs = frame.select(pl.col("_track").rle()).unnest("_track")
        keys = chain.from_iterable(repeat(k, n) for n, k in runs.select("len", "value").iter_rows())
        lane = pl.Series("lane", assign_lanes(frame["t0"].to_list(), frame["t1"].to_list(), keys), dtype=pl.Int32)
    else:  # a slice without times has no place on its track: the first lane, and no part in the walk
        timed = frame.select("t0", "t1", "_track").with_row_index("_i").drop_nulls()
        lane = pl.Series("lane", [0] * frame.height, dtype=pl.Int32).scatter(
            timed["_i"], pl.Series(assign_lanes(timed["t0"].to_list(), timed["t1"].to_list(), timed["_track"].to_list()),
                                   dtype=pl.Int32))
    return frame.with_columns(lane).drop("_phase", "_track")


def _sorted(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort(["rank", "thread_id", "_phase", "t0", "t1", "depth"], descending=_SORT_DESCENDING,
                      nulls_last=[False] * 6)


def _in_track_order(frame: pl.DataFrame) -> pl.DataFrame:
    """The frame sorted as ``_sorted`` sorts it, by a stable sort on the track alone when each
    track's rows are then strictly in order of (t0, t1 descending, depth): the order is then the
    only one the six keys allow, so the same."""
    if frame.height < 2:
        return _sorted(frame)
    track = pl.col("rank").cast(pl.Int64) * (1 << 40) + (pl.col("thread_id").cast(pl.Int64) + (1 << 31)) * 8 \
        + pl.col("_phase").cast(pl.Int64)
    low, high, thread_low, thread_high, phases = frame.select(
        pl.col("rank").min().alias("r_lo"), pl.col("rank").max().alias("r_hi"), pl.col("thread_id").min().alias("t_lo"),
        pl.col("thread_id").max().alias("t_hi"), pl.col("_phase").max(),
    ).row(0)
    if not (-(1 << 22) < low and high < (1 << 22) and -(1 << 31) <= thread_low and thread_high < (1 << 31)
            and phases < 8):
        return _sorted(frame)
    keys = frame.select(track.alias("_key"))["_key"]
    ordered = frame if keys.is_sorted() else frame.sort(track, maintain_order=True)
    t0, t1, depth = pl.col("t0"), pl.col("t1"), pl.col("depth")
    key = track
    after = (
        (key != key.shift(1)) | (t0 > t0.shift(1))
        | ((t0 == t0.shift(1)) & ((t1 < t1.shift(1)) | ((t1 == t1.shift(1)) & (depth > depth.shift(1)))))
    ).fill_null(True)
    if ordered.select(after.all()).item():
        return ordered
    return _sorted(frame)
