"""Slices on tracks for the Perfetto trace: their order, and a lane for each that keeps a track nested.

Slices on one track must nest strictly (a child inside its parent, siblings
apart), or viewers draw them wrongly.  ``assign_lanes`` guarantees that: a
span that would cross the slices already on its track goes to the next lane
of that track.  Walking every span in Python is slow, so ``trace_frame``
walks only the stretches of a track where the walk can give a lane other
than the first:

* A track's spans, in order of start, fall into *stretches*: a stretch ends
  where every span so far has ended.  There every lane's stack would empty,
  so each stretch can be walked on its own, with the same lanes.
* In a stretch where each span's innermost open span (the walk's stack top,
  found by climbing from the span before it through parent links) is its
  parent on the same track, and the span lies inside that parent, the walk
  keeps every span in the first lane.  The climb is done for all spans at
  once, a few steps of parent links (``_stray_rows``); a span that fails it
  marks its stretch for the walk.

Spans arrive by (rank, span_id), which is by start on each thread; when
they are already in order of start on every track, ordering them is a
stable sort by track instead of a sort by six keys.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
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
        .drop("_anchor")
    )
    # phases in name order (as text sorts), as small integers: a cheaper sort key than the text
    names = sorted(set(frame["phase"].unique().drop_nulls().to_list()))
    frame = frame.with_columns(
        pl.col("phase").replace_strict(names, list(range(len(names))), default=None, return_dtype=pl.Int8)
        .alias("_phase")
    )
    keyed = not any(frame[c].null_count() for c in ("rank", "thread_id", "_phase", "t0", "t1", "depth", "span_id"))
    frame = _in_track_order(frame) if keyed else _sorted(frame)
    # in track order: a track is a run of equal (rank, thread_id, phase)
    frame = frame.with_columns(pl.struct("rank", "thread_id", "_phase").rle_id().cast(pl.Int64).alias("_track"))
    stray = _stray_rows(frame) if keyed else pl.Series([True] * frame.height)
    lane = pl.Series("lane", [0] * frame.height, dtype=pl.Int32)
    if stray.any():
        walk = frame.select("t0", "t1", "_track").with_row_index("_i").with_columns(_stretch().alias("_stretch"))
        walked = walk.filter(pl.col("_stretch").is_in(walk.filter(stray)["_stretch"].unique().implode()))
        lanes = assign_lanes(walked["t0"].to_list(), walked["t1"].to_list(), walked["_stretch"].to_list())
        lane = lane.scatter(walked["_i"], pl.Series(lanes, dtype=pl.Int32))
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


def _stretch() -> pl.Expr:
    """Stretch number of each row (in track order): a new one where a track starts or every span
    of the track before this row has ended."""
    first = pl.col("_track") != pl.col("_track").shift(1)
    ended = pl.col("t0") >= pl.col("t1").cum_max().over("_track").shift(1)
    return (first | ended).fill_null(True).cum_sum()


def _parent_rows(frame: pl.DataFrame) -> pl.Series:
    """Row of each span's parent when that parent is on the span's track; else null."""
    low, high, first, last = frame.select(
        pl.col("rank").min().alias("r_lo"), pl.col("rank").max().alias("r_hi"),
        pl.col("span_id").min().alias("s_lo"), pl.col("span_id").max().alias("s_hi"),
    ).row(0)
    if 0 <= low and high < (1 << 22) and 0 <= first and last < (1 << 40):
        # (rank, span id) as one integer: a join on one column
        key = pl.col("rank").cast(pl.Int64) * (1 << 40)
        rows = frame.select((key + pl.col("span_id")).alias("_key"), "_track").with_row_index("_row")
        links = frame.select((key + pl.col("parent_span_id")).alias("_key"), "_track")
        on = ["_key"]
    else:
        rows = frame.select("rank", pl.col("span_id").alias("_key"), "_track").with_row_index("_row")
        links = frame.select("rank", pl.col("parent_span_id").alias("_key"), "_track")
        on = ["rank", "_key"]
    parents = links.join(rows, on=on, how="left", maintain_order="left", suffix="_p")
    return parents.select(
        pl.when(pl.col("_track") == pl.col("_track_p")).then(pl.col("_row").cast(pl.Int64))
    ).to_series()


def _stray_rows(frame: pl.DataFrame) -> pl.Series:
    """Whether each row (of a frame in track order with ``_track``) may take a lane other than the
    first: True unless climbing from the row before it, through parent links on the track, past
    the spans that ended by its start, reaches its own parent (or, without one, nothing open),
    and it lies inside that parent."""
    n = frame.height
    if n == 0:
        return pl.Series([], dtype=pl.Boolean)
    parent = _parent_rows(frame)
    t0, t1 = frame["t0"], frame["t1"]
    track = frame["_track"]
    row = pl.int_range(n, eager=True, dtype=pl.Int64)
    before = pl.select(
        pl.when(track == track.shift(1)).then(row - 1).otherwise(None).alias("b")
    ).to_series()
    stray = pl.Series([False] * n)
    climbing = pl.DataFrame({"i": row, "x": before, "target": parent})
    while climbing.height:
        # reached: at the parent, or at nothing with no parent; else climb one step if x has ended
        at = climbing.filter(pl.col("x").eq_missing(pl.col("target")))
        if at.height:
            held = at.filter(pl.col("target").is_not_null())
            top_end = t1.gather(held["target"])
            bad = (top_end <= t0.gather(held["i"])) | (t1.gather(held["i"]) > top_end)
            stray = stray.scatter(held["i"].filter(bad), True)
        going = climbing.filter(~pl.col("x").eq_missing(pl.col("target")))
        lost = going.filter(pl.col("x").is_null())  # climbed past everything, but has a parent
        stray = stray.scatter(lost["i"], True)
        going = going.filter(pl.col("x").is_not_null())
        ended = t1.gather(going["x"]) <= t0.gather(going["i"])
        stray = stray.scatter(going["i"].filter(~ended), True)  # the top is open and not the parent
        going = going.filter(ended)
        climbing = going.with_columns(parent.gather(going["x"]).alias("x"))
    return stray
