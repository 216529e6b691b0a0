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
  clock (see ``modtrace.device_clock``).
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

DEVICE_EVENT_SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.Int32(),
    "rank": pl.Int32(),
    "seq": pl.Int64(),
    "device_ts_ns": pl.Int64(),
    "mem_bytes": pl.Int64(),
}

DEVICE_SPAN_COLUMNS: tuple[str, ...] = (
    "device_start_ns", "device_end_ns", "device_duration_ns", "device_self_ns", "mem_delta_bytes", "mem_max_bytes",
)

_KEY = ("run_id", "rank")


def device_times(spans: pl.DataFrame, device_events: pl.DataFrame) -> pl.DataFrame:
    """``spans`` with ``DEVICE_SPAN_COLUMNS`` added, rows in the same order."""
    if device_events.height == 0 or spans.height == 0:
        return spans.with_columns(pl.lit(None, pl.Int64).alias(c) for c in DEVICE_SPAN_COLUMNS)
    dev = device_events.select(pl.col(c).cast(t) for c, t in DEVICE_EVENT_SCHEMA.items())
    key = [pl.col(c).cast(DEVICE_EVENT_SCHEMA[c]) for c in _KEY]
    s = spans.select(
        *key, pl.col("span_id").cast(pl.Int64), pl.col("parent_span_id").cast(pl.Int64), pl.col("depth").cast(pl.Int32),
        pl.col("device_id").cast(pl.Int32), pl.col("stream").cast(pl.Int64), pl.col("exit_seq").cast(pl.Int64),
    ).with_row_index("_row")
    s = (
        s.join(dev.rename({"seq": "span_id", "device_ts_ns": "device_start_ns", "mem_bytes": "_mem_enter"}),
               on=[*_KEY, "span_id"], how="left", maintain_order="left")
        .join(dev.rename({"seq": "exit_seq", "device_ts_ns": "device_end_ns", "mem_bytes": "_mem_exit"}),
              on=[*_KEY, "exit_seq"], how="left", maintain_order="left")
        .with_columns((pl.col("device_end_ns") - pl.col("device_start_ns")).alias("device_duration_ns"))
    )
    out = s.join(_child_device_ns(s), on=[*_KEY, "span_id"], how="left", maintain_order="left").join(
        _subtree_mem_max(s), on=[*_KEY, "span_id", "device_id"], how="left", maintain_order="left"
    )
    out = out.sort("_row").select(
        "device_start_ns",
        "device_end_ns",
        "device_duration_ns",
        pl.when(pl.col("_unknown_child").fill_null(False))
        .then(None)
        .otherwise(pl.col("device_duration_ns") - pl.col("_child_ns").fill_null(0))
        .alias("device_self_ns"),
        (pl.col("_mem_exit") - pl.col("_mem_enter")).alias("mem_delta_bytes"),
        pl.col("_mem_max").alias("mem_max_bytes"),
    )
    return pl.concat([spans.drop(DEVICE_SPAN_COLUMNS, strict=False), out], how="horizontal")


def _child_device_ns(s: pl.DataFrame) -> pl.DataFrame:
    """Per parent: its same-device, same-stream children's summed device
    durations (``_child_ns``) and whether any of them is unknown."""
    parents = s.select(*_KEY, "span_id", pl.col("device_id").alias("_pdev"), pl.col("stream").alias("_pstream"))
    return (
        s.filter(pl.col("parent_span_id").is_not_null())
        .select(*_KEY, pl.col("parent_span_id").alias("span_id"), "device_id", "stream", "device_duration_ns")
        .join(parents, on=[*_KEY, "span_id"], how="inner")
        .filter((pl.col("device_id") == pl.col("_pdev")) & (pl.col("stream") == pl.col("_pstream")))
        .group_by(*_KEY, "span_id")
        .agg(
            pl.col("device_duration_ns").sum().alias("_child_ns"),
            pl.col("device_duration_ns").is_null().any().alias("_unknown_child"),
        )
    )


def _subtree_mem_max(s: pl.DataFrame) -> pl.DataFrame:
    """(span, device) -> the most allocated on that device at the events of
    the span and its descendants, deepest level first."""
    own = pl.concat(
        [
            s.select(*_KEY, "span_id", "depth", "device_id", pl.col(c).alias("_mem_max"))
            for c in ("_mem_enter", "_mem_exit")
        ]
    ).filter(pl.col("_mem_max").is_not_null() & pl.col("device_id").is_not_null())
    schema = {**dict(own.select(*_KEY, "span_id", "device_id", "_mem_max").schema)}
    if own.height == 0:
        return pl.DataFrame(schema=schema)
    parent_of = s.select(*_KEY, "span_id", "parent_span_id", "depth").filter(pl.col("parent_span_id").is_not_null())
    own_by_depth = own.partition_by("depth", as_dict=True, include_key=False)
    parent_by_depth = parent_of.partition_by("depth", as_dict=True, include_key=False)
    top = int(s["depth"].max() or 0)  # type: ignore[arg-type]
    done: list[pl.DataFrame] = []
    carry = pl.DataFrame(schema=schema)  # contributions to spans of the level being done
    for depth in range(top, -1, -1):
        level = own_by_depth.get((depth,))
        parts = [carry] if level is None else [level, carry]
        cur = pl.concat(parts, how="vertical_relaxed").group_by(*_KEY, "span_id", "device_id").agg(pl.col("_mem_max").max())
        done.append(cur)
        links = parent_by_depth.get((depth,))
        if links is None or depth == 0:
            carry = pl.DataFrame(schema=schema)
            continue
        carry = cur.join(links, on=[*_KEY, "span_id"], how="inner").select(
            *_KEY, pl.col("parent_span_id").alias("span_id"), "device_id", "_mem_max"
        )
    return pl.concat(done, how="vertical_relaxed")
