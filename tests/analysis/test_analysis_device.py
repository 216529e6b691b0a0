"""Device time and memory per span (modtrace.analysis.device), exact numbers."""

from __future__ import annotations

import polars as pl

from modtrace.analysis.device import DEVICE_EVENT_SCHEMA, DEVICE_SPAN_COLUMNS, device_times

# span_id, parent_span_id, depth, device_id, stream, exit_seq   (rank 0 unless said)
SPANS = [
    (1, None, 0, 0, 10, 8),  # A
    (2, 1, 1, 0, 10, 5),  # B   in A, same stream
    (3, 2, 2, 0, 10, 4),  # C   in B, same stream
    (6, 1, 1, 0, 20, 7),  # D   in A, another stream of the same device
    (9, None, 0, None, None, 10),  # E   on the CPU: no device events
    (11, None, 0, 0, 10, None),  # F   never exited
    (12, None, 0, 1, 10, 15),  # G   on device 1, stream handle 10 too
    (13, 12, 1, 0, 10, 14),  # H   in G, on device 0
    (16, None, 0, 0, 10, 19),  # I
    (17, 16, 1, 0, 10, 18),  # J   in I; its exit never resolved
]
# seq -> (device_ts_ns, mem_bytes)
EVENTS = {
    1: (1000, 100), 2: (1100, 100), 3: (1200, 150), 4: (1500, 400), 5: (1600, 300),
    6: (1250, 300), 7: (2250, 900), 8: (2000, 350),
    11: (2500, 350),
    12: (3000, 5), 13: (3100, 1000), 14: (3200, 1000), 15: (3300, 5),
    16: (4000, 10), 17: (4100, 20), 19: (4500, 30),
}
# span -> start, end, duration, self, mem delta, mem max
EXPECTED = {
    1: (1000, 2000, 1000, 500, 250, 900),  # B subtracted, D (other stream) not; D's 900 bytes count
    2: (1100, 1600, 500, 200, 200, 400),  # C's 400 bytes at its exit count
    3: (1200, 1500, 300, 300, 250, 400),
    6: (1250, 2250, 1000, 1000, 600, 900),
    9: (None, None, None, None, None, None),
    11: (2500, None, None, None, None, 350),
    12: (3000, 3300, 300, 300, 0, 5),  # H is on another device: not subtracted, its memory not G's
    13: (3100, 3200, 100, 100, 0, 1000),
    16: (4000, 4500, 500, None, 20, 30),  # J's device time is unknown, so is I's self time
    17: (4100, None, None, None, None, 20),
}


def spans_frame(rows: list[tuple[object, ...]], rank: int = 0) -> pl.DataFrame:
    cols = ["span_id", "parent_span_id", "depth", "device_id", "stream", "exit_seq"]
    frame = pl.DataFrame(rows, schema=cols, orient="row")
    return frame.with_columns(pl.lit(1, pl.Int32).alias("run_id"), pl.lit(rank, pl.Int32).alias("rank"),
                              pl.lit("x").alias("fqn"))


def events_frame(events: dict[int, tuple[int, int]], rank: int = 0) -> pl.DataFrame:
    return pl.DataFrame(
        [(1, rank, seq, ts, mem) for seq, (ts, mem) in events.items()], schema=DEVICE_EVENT_SCHEMA, orient="row"
    )


def by_span(out: pl.DataFrame, rank: int = 0) -> dict[int, tuple[object, ...]]:
    part = out.filter(pl.col("rank") == rank)
    return {row[0]: tuple(row[1:]) for row in part.select("span_id", *DEVICE_SPAN_COLUMNS).iter_rows()}


def test_device_start_end_duration_self_and_memory_per_span() -> None:
    spans = spans_frame(SPANS)
    out = device_times(spans, events_frame(EVENTS))
    assert by_span(out) == EXPECTED
    assert out.columns == [*spans.columns, *DEVICE_SPAN_COLUMNS]
    assert out["span_id"].to_list() == spans["span_id"].to_list()  # same rows, same order
    assert all(out.schema[c] == pl.Int64 for c in DEVICE_SPAN_COLUMNS)


def test_ranks_with_the_same_span_ids_do_not_mix() -> None:
    spans = pl.concat([spans_frame(SPANS), spans_frame([(1, None, 0, 0, 10, 8), (2, 1, 1, 0, 10, 5)], rank=1)])
    events = pl.concat([events_frame(EVENTS), events_frame({1: (0, 0), 2: (10, 64), 5: (40, 64), 8: (50, 7)}, rank=1)])
    out = device_times(spans, events)
    assert by_span(out) == EXPECTED
    assert by_span(out, rank=1) == {1: (0, 50, 50, 20, 7, 64), 2: (10, 40, 30, 30, 0, 64)}


def test_a_cpu_run_gets_null_device_columns() -> None:
    spans = spans_frame(SPANS)
    out = device_times(spans, pl.DataFrame(schema=DEVICE_EVENT_SCHEMA))
    assert out.height == spans.height
    assert out.select(DEVICE_SPAN_COLUMNS).null_count().row(0) == (spans.height,) * len(DEVICE_SPAN_COLUMNS)


def test_memory_of_a_deep_chain_reaches_the_root() -> None:
    depth = 30
    spans = spans_frame([(d + 1, d or None, d, 0, 10, 200 - d) for d in range(depth)])
    events = {d + 1: (d, 0) for d in range(depth)} | {200 - d: (1000 - d, 0) for d in range(depth)}
    events[depth] = (depth - 1, 1 << 30)  # the innermost call's enter
    out = device_times(spans, events_frame(events))
    assert out["mem_max_bytes"].to_list() == [1 << 30] * depth
    assert out["device_self_ns"].to_list() == [2] * (depth - 1) + [1000 - depth + 1 - (depth - 1)]


def test_rows_in_any_order_come_back_in_that_order() -> None:
    shuffled = [SPANS[i] for i in (7, 2, 9, 0, 4, 1, 8, 3, 6, 5)]
    events = events_frame(EVENTS).reverse()
    out = device_times(spans_frame(shuffled), events)
    assert out["span_id"].to_list() == [r[0] for r in shuffled]
    assert by_span(out) == EXPECTED
