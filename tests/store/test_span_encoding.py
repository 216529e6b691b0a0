"""The compact span row declared once (``modtrace.core.contracts.SPAN_STORED_AS``): random
span rows written to span_rows come back equal through every decode derived from it -- the
SQL read (``read_span_rows``), the ``spans`` view, and the polars read (``start_span_columns``)."""

from __future__ import annotations

import itertools
from typing import Any

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from polars.testing import assert_frame_equal

from modtrace.core.contracts import ISSUE_FRAME, SPAN_ROW, Batch
from modtrace.store.analysis_store import read_span_rows, write_analysis
from modtrace.store.engine import open_store
from modtrace.store.runs import add_rank, create_run
from modtrace.store.span_columns import start_span_columns
from modtrace.store.writer import RankWriter

_ID = st.integers(0, 2**40)
_NS = st.integers(-(2**61), 2**61)
_RUNS = itertools.count()  # a new run per example, in the test's one database


@st.composite
def _span_rows(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Span rows of ranks 0 and 1: roots and children whose parent lies before or after them
    (a recompute's parent is the backward span open when it ran), closed and unclosed."""
    ids = draw(st.lists(st.tuples(st.integers(0, 1), _ID), min_size=1, max_size=40, unique=True))
    rows = []
    for rank, span_id in sorted(ids):
        closed = draw(st.booleans())
        duration = draw(st.integers(0, 2**61)) if closed else None
        start = draw(_NS)
        rows.append({
            "rank": rank, "span_id": span_id, "parent_span_id": draw(st.none() | _ID),
            "depth": draw(st.integers(0, 50)), "module_id": 0, "phase": draw(st.integers(0, 2)),
            "call_id": draw(_ID), "step": draw(st.integers(0, 1000)), "thread_id": 0,
            "graph_task": draw(st.none() | _ID), "start_ns": start,
            "end_ns": None if duration is None else start + duration, "duration_ns": duration,
            "self_ns": duration, "device_id": None, "stream": None,
            "status": draw(st.integers(0, 4)) if closed else None,
            "exit_seq": span_id + draw(st.integers(1, 2**40)) if closed else None,
        })
    return rows


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=_span_rows())
def test_span_rows_round_trip_through_the_sql_view_and_polars_decodes(any_db: str, rows: list[dict[str, Any]]) -> None:
    store = open_store(any_db, create=True)
    try:
        run_id, _ = create_run(store, f"spans-{next(_RUNS)}", {})
        for rank in (0, 1):
            add_rank(store, run_id, rank, wall_anchor_ns=0)
            writer = RankWriter(store, run_id, rank)
            writer.write(Batch(modules=[(0, "Net", "Net", None)], threads=[(0, 1, "MainThread")]))
            writer.close()
        spans = pl.DataFrame([{"run_id": run_id, **r} for r in rows], schema=SPAN_ROW.polars()).sort("rank", "span_id")
        write_analysis(store, run_id, spans, pl.DataFrame(schema=ISSUE_FRAME.polars()))

        assert_frame_equal(read_span_rows(store, run_id), spans)
        by_polars = start_span_columns(store, run_id, SPAN_ROW.names).result()
        assert by_polars is not None
        assert_frame_equal(by_polars, spans)
        with store.engine.connect() as conn:
            view = conn.exec_driver_sql(
                f"SELECT rank, span_id, parent_span_id, end_ns, exit_seq FROM spans WHERE run_id = {int(run_id)} "
                "ORDER BY rank, span_id").all()
            stored = conn.exec_driver_sql(
                f"SELECT rank, span_id, parent_gap, duration_ns, exit_gap FROM span_rows WHERE run_id = {int(run_id)} "
                "ORDER BY rank, span_id").all()
        assert [tuple(r) for r in view] == spans.select("rank", "span_id", "parent_span_id", "end_ns", "exit_seq").rows()
        # On disk, as the table's column comments (docs/schema.md) state: gaps from span_id, no end_ns.
        gaps = [(r["rank"], r["span_id"], None if r["parent_span_id"] is None else r["span_id"] - r["parent_span_id"],
                 r["duration_ns"], None if r["exit_seq"] is None else r["exit_seq"] - r["span_id"])
                for r in sorted(rows, key=lambda r: (r["rank"], r["span_id"]))]
        assert [tuple(r) for r in stored] == gaps
    finally:
        store.dispose()
