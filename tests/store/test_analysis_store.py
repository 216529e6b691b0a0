"""The store side of analysis: reading events as frames, writing spans and issues."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch

import modtrace
from modtrace.analysis import analyze_events
from modtrace.analysis.events import EVENT_SCHEMA
from modtrace.core.errors import StoreError
from modtrace.results.materialize import compute, materialize
from modtrace.results.materialize import stored as read_analysis
from modtrace.store.analysis_store import write_analysis, write_analysis_rounds
from modtrace.store.engine import open_store
from modtrace.store.reader import read_events, read_modules
from tests.helpers.analysis_streams import (
    _write_misnested,
    _write_two_ranks,
    devices,
    model,
)
from tests.helpers.database import db_rows
from tests.helpers.models import Net


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


def _stored_rows(store: Any, run_id: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    with store.engine.connect() as conn:
        spans = conn.exec_driver_sql(f"SELECT * FROM span_rows WHERE run_id = {run_id} ORDER BY rank, span_id").all()
        issues = conn.exec_driver_sql(f"SELECT * FROM nesting_issues WHERE run_id = {run_id} ORDER BY rank, seq, kind").all()
    return [tuple(r) for r in spans], [tuple(r) for r in issues]




def _write_real(db: str) -> int:
    model_ = Net(blocks=3)
    with modtrace.Recorder(db=db, run="real", analyze=False, handle_sigterm=False) as rec:
        for _ in range(3):
            model_(torch.ones(2, 4)).sum().backward()
            rec.step()
    ((run_id,),) = db_rows(db, "SELECT id FROM runs WHERE name = 'real'")
    return int(run_id)


@pytest.mark.parametrize("recording", ["two_ranks", "misnested", "real"])
@pytest.mark.parametrize("round_rows", [2_000_000, 40])
def test_spans_written_from_events_equal_spans_bound_whole(
    any_db: str, recording: str, round_rows: int
) -> None:
    """materialize's write (the enter event's columns read from ``events`` by the INSERT)
    stores exactly the rows the plain write of the same analysis stores, in one round or
    many (round_rows=40: carried calls, and a rank analysed again after a cut-sensitive issue)."""
    run_id = {"two_ranks": lambda: _write_two_ranks(any_db)[0], "misnested": lambda: _write_misnested(any_db),
              "real": lambda: _write_real(any_db)}[recording]()
    store = open_store(any_db)
    try:
        result = materialize(store, run_id, round_rows=round_rows, chunk_rows=16)
        joined = _stored_rows(store, run_id)
        whole = compute(store, run_id)
        write_analysis(store, run_id, whole.spans, whole.issues)
        bound = _stored_rows(store, run_id)
    finally:
        store.dispose()
    assert joined == bound
    spans = pl.DataFrame(joined[0], schema=["run_id", "rank", "span_id", *(f"c{i}" for i in range(15))], orient="row")
    assert spans.height == whole.spans.height > 0
    if recording == "misnested":
        kinds = set(result.issues["kind"].to_list())
        assert {"crossed", "unclosed"} <= kinds and kinds & {"no_enter", "duplicate_enter", "duplicate_exit"}, kinds
        assert spans["c10"].n_unique() > 2 and spans["c11"].n_unique() > 2  # devices and streams vary


def test_spans_without_their_enter_events_write_nothing(db_path: Path) -> None:
    """SQLite, where the spans' enter columns are read from ``events`` (PostgreSQL COPYs them whole)."""
    run_id, _ = _write_two_ranks(str(db_path))
    store = open_store(str(db_path))
    try:
        materialize(store, run_id)
        before = _stored_rows(store, run_id)
        spans = compute(store, run_id).spans
        stray = spans.head(3).with_columns(pl.col("span_id") + 10_000)
        with pytest.raises(StoreError, match="3 of .* spans have no enter event"):
            write_analysis_rounds(store, run_id, [(pl.concat([spans, stray]), compute(store, run_id).issues, None)],
                                  from_events=True)
        after = _stored_rows(store, run_id)
    finally:
        store.dispose()
    assert after == before


def test_a_failed_analysis_keeps_the_stored_one_and_a_gone_run_gets_nothing(any_db: str) -> None:
    """The old rows are deleted while the first part is computed: a failure there rolls the
    DELETE back; a run that no longer exists (its spans would be orphans) is refused."""
    run_id, _ = _write_two_ranks(any_db)
    store = open_store(any_db)
    try:
        materialize(store, run_id)
        before = _stored_rows(store, run_id)
        whole = compute(store, run_id)

        def failing() -> Any:
            raise RuntimeError("analysis failed")
            yield  # a generator, like materialize's rounds

        with pytest.raises(RuntimeError, match="analysis failed"):
            write_analysis_rounds(store, run_id, failing(), from_events=True)
        assert _stored_rows(store, run_id) == before
        with pytest.raises(StoreError, match=f"run {run_id + 1} no longer exists"):
            write_analysis(store, run_id + 1, whole.spans.with_columns(pl.lit(run_id + 1, dtype=pl.Int32).alias("run_id")),
                           whole.issues)
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql(f"SELECT COUNT(*) FROM span_rows WHERE run_id = {run_id + 1}").scalar() == 0
    finally:
        store.dispose()
