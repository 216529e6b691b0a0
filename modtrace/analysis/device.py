"""Device time and memory of spans: spans + per-event device times -> device columns.

``device_times(spans, device_events)`` adds ``DEVICE_SPAN_COLUMNS`` to a
spans frame (``spans.SPAN_COLUMNS``; it reads ``run_id``, ``rank``,
``span_id``, ``parent_span_id``, ``depth``, ``device_id``, ``stream`` and
``exit_seq``).  The device events frame (``DEVICE_EVENT_SCHEMA``) has one
row per enter or exit whose device event resolved::

    run_id Int32, rank Int32, seq Int64,
    device_ts_ns Int64 (null: the device could not time it),
    mem_bytes Int64 (null: memory not read)

What the columns mean (all Int64, null when an input is missing):

* ``device_start_ns`` / ``device_end_ns``: the device times of the span's
  enter and exit events -- when the stream current at the enter (exit)
  reached the point where the host entered (left) the module, on the rank's
  clock (see ``modtrace.tracking.device_timer``).
* ``device_duration_ns``: end minus start.  It includes the times the stream
  sat idle inside the module (a module whose host is slower than its
  kernels takes about its host time on the device too).  A module that
  changes the current stream between its enter and exit is measured from
  the enter's stream to the exit's.
* ``device_self_ns``: the duration minus the device durations of the
  children on the *same device and stream* (the stream at each span's
  enter).  A child on another stream or device ran beside the parent's
  stream, not in it, so it is not subtracted: a parent's self time is what
  its own stream spent in it outside its same-stream children.  Null when
  such a child has no device duration (its time is unknown, so is the
  parent's self time).
* ``mem_delta_bytes``: allocated bytes on the span's device at the exit
  minus at the enter (what the call left allocated).
* ``mem_max_bytes``: the most allocated on the span's device at any of its
  own events or its descendants' events on that device (every stream).

A CPU run (no device events) gets the columns, all null.
"""

from __future__ import annotations

import polars as pl

from modtrace.core.contracts import CLOCKS, DEVICE_EVENT_FRAME, DEVICE_SPAN_COLUMNS

DEVICE_EVENT_SCHEMA: dict[str, pl.DataType] = DEVICE_EVENT_FRAME.polars()

__all__ = ["CLOCKS", "DEVICE_EVENT_SCHEMA", "DEVICE_SPAN_COLUMNS", "device_times", "has_device_time", "on_clock"]

_KEY = ("run_id", "rank")


def device_times(spans: pl.DataFrame, device_events: pl.DataFrame) -> pl.DataFrame:
    """``spans`` with ``DEVICE_SPAN_COLUMNS`` added, rows in the same order."""
    if device_events.height == 0 or spans.height == 0:
        return spans.with_columns(pl.lit(None, pl.Int64).alias(c) for c in DEVICE_SPAN_COLUMNS)
    dev = device_events.select(pl.col(c).cast(t) for c, t in DEVICE_EVENT_SCHEMA.items())
    s = spans.select(
        *(pl.col(c).cast(DEVICE_EVENT_SCHEMA[c]) for c in _KEY),
        pl.col("span_id").cast(pl.Int64), pl.col("parent_span_id").cast(pl.Int64), pl.col("depth").cast(pl.Int32),
        pl.col("device_id").cast(pl.Int32), pl.col("stream").cast(pl.Int64), pl.col("exit_seq").cast(pl.Int64),
    ).with_row_index("_row")
    # Span and event ids are per (run, rank): one rank at a time.
    if _one_rank(s) and _one_rank(dev) and s.row(0)[1:3] == dev.row(0)[:2]:
        out = _rank_device_times(s, dev)
    else:
        by_rank = dev.partition_by(*_KEY, as_dict=True)
        parts = [_rank_device_times(part, by_rank.get(key)) for key, part in
                 s.partition_by(*_KEY, as_dict=True).items()]
        out = pl.concat(parts).sort("_row")
    return pl.concat([spans.drop(DEVICE_SPAN_COLUMNS, strict=False), out.drop("_row")], how="horizontal")


def _one_rank(frame: pl.DataFrame) -> bool:
    return bool(frame.select(*((pl.col(c).min() == pl.col(c).max()) & (pl.col(c).null_count() == 0) for c in _KEY))
                .row(0) == (True, True))


def _rank_device_times(s: pl.DataFrame, dev: pl.DataFrame | None) -> pl.DataFrame:
    """One rank's spans (``_row`` kept) -> ``_row`` and ``DEVICE_SPAN_COLUMNS``.

    Ids are looked up by binary search in sorted columns (``_lookup``), not
    joined: a fraction of the time on a million spans.
    """
    if dev is None:
        return s.select("_row", *(pl.lit(None, pl.Int64).alias(c) for c in DEVICE_SPAN_COLUMNS))
    if not dev["seq"].is_sorted():
        dev = dev.sort("seq")
    if not s["span_id"].is_sorted():
        s = s.sort("span_id")
    seq, ts, mem = dev["seq"], dev["device_ts_ns"], dev["mem_bytes"]
    start, mem_enter = _lookup(s["span_id"], seq, ts, mem)
    end, mem_exit = _lookup(s["exit_seq"], seq, ts, mem)
    s = s.with_columns(
        start.alias("device_start_ns"), end.alias("device_end_ns"), (end - start).alias("device_duration_ns"),
        mem_enter.alias("_mem_enter"), mem_exit.alias("_mem_exit"),
    )
    child = _child_device_ns(s)
    child_ns, unknown = _lookup(s["span_id"], child["span_id"], child["_child_ns"], child["_unknown_child"])
    mem_max = _subtree_mem_max(s)
    (span_mem_max,) = _lookup(s["span_id"], mem_max["span_id"], mem_max["_mem_max"])
    return s.select(
        "_row",
        "device_start_ns",
        "device_end_ns",
        "device_duration_ns",
        pl.when(unknown.fill_null(False)).then(None).otherwise(pl.col("device_duration_ns") - child_ns.fill_null(0))
        .alias("device_self_ns"),
        (pl.col("_mem_exit") - pl.col("_mem_enter")).alias("mem_delta_bytes"),
        span_mem_max.alias("mem_max_bytes"),
    ).sort("_row")


def _lookup(keys: pl.Series, sorted_keys: pl.Series, *values: pl.Series) -> list[pl.Series]:
    """``values`` at the rows where ``sorted_keys`` (ascending, unique) equals
    each of ``keys``; null where a key is null or absent."""
    if len(sorted_keys) == 0:
        return [pl.repeat(None, len(keys), dtype=v.dtype, eager=True) for v in values]
    idx = sorted_keys.search_sorted(keys.fill_null(0)).clip(0, len(sorted_keys) - 1)
    hit = (sorted_keys.gather(idx) == keys).fill_null(False)
    return [pl.select(pl.when(hit).then(v.gather(idx))).to_series() for v in values]


def _child_device_ns(s: pl.DataFrame) -> pl.DataFrame:
    """Per parent (sorted by span_id): its same-device, same-stream
    children's summed device durations (``_child_ns``) and whether any of
    them is unknown (``_unknown_child``).  ``s`` is sorted by span_id."""
    children = s.filter(pl.col("parent_span_id").is_not_null())
    pdev, pstream = _lookup(children["parent_span_id"], s["span_id"], s["device_id"], s["stream"])
    return (
        children.select("parent_span_id", "device_duration_ns")
        .filter(((children["device_id"] == pdev) & (children["stream"] == pstream)).fill_null(False))
        .group_by("parent_span_id")
        .agg(
            pl.col("device_duration_ns").sum().alias("_child_ns"),
            pl.col("device_duration_ns").is_null().any().alias("_unknown_child"),
        )
        .rename({"parent_span_id": "span_id"})
        .sort("span_id")
    )


_DEVICE_BITS = 16  # a (span, device) pair packed into one Int64 key: span_id << 16 | device_id


def _subtree_mem_max(s: pl.DataFrame) -> pl.DataFrame:
    """Per span (sorted by span_id): the most allocated on its device at the
    events of the span and its descendants.  Levels are done deepest first,
    each handing its maxima per (span, device) to the parents; ``s`` is
    sorted by span_id."""
    schema = {"span_id": pl.Int64(), "_mem_max": pl.Int64()}
    if s["device_id"].max() is not None and int(s["device_id"].max()) >= 1 << _DEVICE_BITS:  # type: ignore[arg-type]
        raise ValueError(f"device ids must be below {1 << _DEVICE_BITS}")
    own = s.select(
        (pl.col("span_id") * (1 << _DEVICE_BITS) + pl.col("device_id")).alias("_k"),
        "depth",
        pl.max_horizontal("_mem_enter", "_mem_exit").alias("_mem_max"),
    ).filter(pl.col("_mem_max").is_not_null() & pl.col("_k").is_not_null())
    if own.height == 0:
        return pl.DataFrame(schema=schema)
    own_by_depth = own.partition_by("depth", as_dict=True, include_key=False)
    done: list[pl.DataFrame] = []
    carry = own.clear().drop("depth")  # maxima handed to spans of the level being done
    span_ids, parents = s["span_id"], s["parent_span_id"]
    low = (1 << _DEVICE_BITS) - 1
    for depth in range(int(s["depth"].max() or 0), -1, -1):  # type: ignore[arg-type]
        level = own_by_depth.get((depth,))
        cur = carry if level is None else pl.concat([level, carry])
        if carry.height:
            cur = cur.group_by("_k").agg(pl.col("_mem_max").max())
        done.append(cur)
        (parent,) = _lookup(cur["_k"] // (1 << _DEVICE_BITS), span_ids, parents)
        carry = cur.select((parent * (1 << _DEVICE_BITS) + (pl.col("_k") & low)).alias("_k"), "_mem_max").filter(
            pl.col("_k").is_not_null()
        )
    # Each span's own device.
    every = pl.concat(done)
    span = every["_k"] // (1 << _DEVICE_BITS)
    (span_device,) = _lookup(span, span_ids, s["device_id"])
    own_device = ((every["_k"] & low) == span_device.cast(pl.Int64)).fill_null(False)
    return every.select(span.alias("span_id"), "_mem_max").filter(own_device).sort("span_id")


_ON_DEVICE = (
    ("start_ns", "device_start_ns"), ("end_ns", "device_end_ns"), ("duration_ns", "device_duration_ns"),
    ("self_ns", "device_self_ns"),
)


def has_device_time(spans: pl.DataFrame) -> bool:
    """Whether any span of ``spans`` has a device time."""
    return "device_start_ns" in spans.columns and spans["device_start_ns"].null_count() < spans.height


def on_clock(spans: pl.DataFrame, clock: str) -> pl.DataFrame:
    """``spans`` with ``start_ns``, ``end_ns``, ``duration_ns`` and ``self_ns``
    on ``clock`` (``CLOCKS``): as they are for ``host``; for ``device``, the
    device columns of every span that has a device duration (the others,
    calls on no CUDA device, keep their host times).  Everything built on
    those four columns (tree, diff, report, export) then reads that clock."""
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}, not {clock!r}")
    if clock == "host":
        return spans
    if not has_device_time(spans):
        raise ValueError("the spans have no device times")
    timed = pl.col("device_duration_ns").is_not_null()
    return spans.with_columns(pl.when(timed).then(pl.col(d)).otherwise(pl.col(h)).alias(h) for h, d in _ON_DEVICE)
