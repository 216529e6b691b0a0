"""The store side of analysis: reading events as frames, writing spans and issues."""

from __future__ import annotations

import random

import polars as pl
from analysis_streams import devices, frame, model, to_rows, training_step

from modtrace.analysis import analyze_events
from modtrace.analysis.events import EVENT_SCHEMA
from modtrace.materialize import materialize
from modtrace.materialize import stored as read_analysis
from modtrace.store.engine import open_store
from modtrace.store.reader import read_events, read_modules
from modtrace.store.runs import add_rank, create_run, finish_rank
from modtrace.store.writer import RankWriter


def _write_two_ranks(db: str) -> tuple[int, dict[int, pl.DataFrame]]:
    store = open_store(db, create=True)
    written = {}
    try:
        run_id, _ = create_run(store, "two", {"world_size": 2})
        mods = model(blocks=2, per_block=2)
        for rank in (0, 1):
            add_rank(store, run_id, rank, 0)
            rng = random.Random(rank)
            events = []
            for step in range(3):
                fwd, bwd = training_step(mods, rng, step, graph_task=10 + step, recompute=1)
                events += fwd + bwd
            rows = to_rows(events, rng)
            rows[3] = (*rows[3][:9], 2**40 + 7, *rows[3][10:])  # a large stream handle stays an int
            RankWriter(store, run_id, rank).write(
                rows, modules=mods.rows, threads=[(0, 99, "MainThread")], devices=[(0, "cpu")], progress=(len(rows), 3)
            )
            written[rank] = frame(rows, run_id=run_id, rank=rank)
            finish_rank(store, run_id, rank, "completed")
    finally:
        store.dispose()
    return run_id, written


def test_events_read_back_in_chunks_with_exact_dtypes(any_db: str) -> None:
    run_id, written = _write_two_ranks(any_db)
    store = open_store(any_db)
    try:
        got = read_events(store, run_id, chunk_rows=7)
        one = read_events(store, run_id, ranks=[1])
        mods = read_modules(store, run_id)
    finally:
        store.dispose()
    assert got.schema == pl.Schema(EVENT_SCHEMA)
    expected = pl.concat([written[0], written[1]]).select(list(EVENT_SCHEMA)).cast(EVENT_SCHEMA)  # type: ignore[arg-type]
    assert got.equals(expected)
    assert one.equals(expected.filter(pl.col("rank") == 1))
    assert got.filter(pl.col("seq") == 3)["stream"].to_list() == [2**40 + 7, 2**40 + 7]
    assert mods.height == 2 * 8 and mods["fqn"][0] == "Net"


def test_materialize_is_idempotent_per_run_and_per_rank(any_db: str) -> None:
    run_id, written = _write_two_ranks(any_db)
    store = open_store(any_db)
    try:
        first = materialize(store, run_id)
        again = materialize(store, run_id)
        only_rank1 = materialize(store, run_id, rank=1)
        stored = read_analysis(store, run_id)
        with store.engine.connect() as conn:
            count = conn.exec_driver_sql("SELECT COUNT(*) FROM span_rows").scalar()
    finally:
        store.dispose()
    assert first.spans.equals(again.spans) and first.issues.equals(again.issues)
    assert only_rank1.spans.equals(first.spans.filter(pl.col("rank") == 1))
    assert count == first.spans.height
    assert stored is not None
    spans, issues = stored.spans, stored.issues
    mods = model(blocks=2, per_block=2)
    direct = analyze_events(pl.concat([written[0], written[1]]), pl.concat([mods.frame(0), mods.frame(1)]), pl.concat([devices(0), devices(1)]))
    assert spans.sort("rank", "span_id").equals(direct.spans.sort("rank", "span_id"))
    assert issues.equals(direct.issues)
    assert set(issues["severity"].to_list()) <= {"info"}
