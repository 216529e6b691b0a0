"""Event reads at the edges of the value ranges: the frame equals what was written, chunk by chunk."""

from __future__ import annotations

import polars as pl
import pytest

from modtrace.analysis.events import EVENT_SCHEMA
from modtrace.core.codes import OUT_OF_RANGE_CODE
from modtrace.core.contracts import Batch
from modtrace.store.engine import open_store
from modtrace.store.reader import iter_event_chunks, read_events
from modtrace.store.runs import add_rank, create_run
from modtrace.store.writer import EVENT_COLUMNS, RankWriter

BIG = 2**63 - 1

# (seq, ts_ns, kind, module_id, phase, call_id, step, thread_id, device_id, stream, status, graph_task, tie)
EDGE_ROWS = [
    (-(2**63), -BIG, 0, -(2**31), 0, -BIG, -(2**31), 0, None, None, 0, None, 0),
    (-5, 0, 1, 2**31 - 1, 2, BIG, 2**31 - 1, 2**31 - 1, 0, BIG, 127, BIG, 1),
    (0, 1, -128, 0, -128, 0, 0, -(2**31), -(2**31), -BIG, -128, -BIG, -128),
    (7, 2, 127, 3, 127, 4, 5, 6, 2**31 - 1, 0, 4, 0, 127),
    (2**40, 3, 0, 1, 1, 2, 3, 4, None, 9, 3, 2**40, 0),  # a gap in seq
    (BIG, BIG, 1, 1, 1, 2, 3, 4, 5, None, 0, None, 0),
]


def _write(db: str, rows: list[tuple[object, ...]]) -> int:
    store = open_store(db, create=True)
    try:
        run_id, _ = create_run(store, "edges", {})
        add_rank(store, run_id, 0, 0)
        RankWriter(store, run_id, 0).write(Batch(rows))
    finally:
        store.dispose()
    return run_id


def _expected(rows: list[tuple[object, ...]], run_id: int) -> pl.DataFrame:
    frame = pl.DataFrame(rows, schema={c: EVENT_SCHEMA[c] for c in EVENT_COLUMNS}, orient="row")
    return frame.with_columns(pl.lit(run_id, dtype=pl.Int32).alias("run_id"), pl.lit(0, dtype=pl.Int32).alias("rank")).select(
        list(EVENT_SCHEMA)
    )


@pytest.mark.parametrize("chunk_rows", [1, 2, 4, 6, 1000])
def test_extreme_values_nulls_and_seq_gaps_read_back_exactly(any_db: str, chunk_rows: int) -> None:
    run_id = _write(any_db, EDGE_ROWS)
    store = open_store(any_db)
    try:
        got = read_events(store, run_id, chunk_rows=chunk_rows)
        sizes = [c.height for c in iter_event_chunks(store, run_id, 0, chunk_rows=chunk_rows)]
    finally:
        store.dispose()
    assert got.schema == pl.Schema(EVENT_SCHEMA)
    assert got.equals(_expected(sorted(EDGE_ROWS, key=lambda r: r[0]), run_id))  # type: ignore[arg-type, return-value]
    assert sum(sizes) == len(EDGE_ROWS) and max(sizes) <= chunk_rows


def test_a_code_outside_int8_is_marked_out_of_range_not_wrapped(any_db: str) -> None:
    # status 300 and kind -200 do not fit their one-byte columns: they come back as
    # OUT_OF_RANGE_CODE (for the analysis to report), never wrapped into a valid code
    rows = [(0, 0, 0, 1, 0, 1, 0, 0, None, None, 300, None, 0), (1, 5, -200, 1, 0, 1, 0, 0, None, None, 0, None, 0)]
    run_id = _write(any_db, rows)
    store = open_store(any_db)
    try:
        ev = read_events(store, run_id)
    finally:
        store.dispose()
    assert ev["status"].to_list() == [OUT_OF_RANGE_CODE, 0]
    assert ev["kind"].to_list() == [0, OUT_OF_RANGE_CODE]


@pytest.mark.parametrize("rows", [EDGE_ROWS, [(0, 0, 0, 1, 0, 1, 0, 0, None, None, 300, None, 0),
                                              (1, 5, -200, 1, 0, 1, 0, 0, None, None, 0, None, 0)]])
def test_rows_handed_over_make_the_frame_read_back(any_db: str, rows: list[tuple[object, ...]]) -> None:
    """The analysis that follows a recording takes the rows the writer committed
    (``events_frame``) instead of reading them back: the same frame, codes that do not fit included."""
    from modtrace.store.event_range import events_frame, iter_events_between

    run_id = _write(any_db, rows)
    store = open_store(any_db)
    try:
        (back,) = iter_events_between(store, run_id, 0, None, 2**63 - 1, 1000)
    finally:
        store.dispose()
    handed = events_frame(sorted(rows, key=lambda r: r[0]), run_id, 0)  # type: ignore[arg-type, return-value]
    assert handed.equals(back)
    assert handed.schema == back.schema


def test_a_handed_value_that_does_not_fit_its_column_raises() -> None:
    """Never a wrapped or truncated value: the follow stops, and the rank is analysed from its
    stored events at the end."""
    from modtrace.store.event_range import events_frame

    with pytest.raises(pl.exceptions.InvalidOperationError):
        events_frame([(0, 0, 0, 2**31, 0, 1, 0, 0, None, None, 0, None, 0)], 1, 0)
