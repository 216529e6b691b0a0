"""Streamed analysis (modtrace.analysis.stream) equals the one-piece analysis.

Random streams from tests/analysis_streams.py (threads interleaved, backward
hook dispatches tied and shuffled, recompute, early stops), cut into chunks
of random sizes, some truncated as a crash leaves them; and real recorded
runs read back from SQLite and PostgreSQL in small chunks.
"""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import polars as pl
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from modtrace.analysis import SPAN_COLUMNS, stream
from modtrace.analysis.events import normalize_events
from modtrace.analysis.nesting import collect_issues
from modtrace.analysis.spans import pair_events, time_spans
from modtrace.analysis.validate import validate
from tests.helpers.analysis_streams import _random_run


def one_piece(events: pl.DataFrame, modules: pl.DataFrame, complete: bool) -> tuple[pl.DataFrame, pl.DataFrame]:
    ev = normalize_events(events, modules)
    pairing = pair_events(ev)
    return time_spans(pairing.pairs), collect_issues(ev, pairing, modules, complete=complete)


def streamed(events: pl.DataFrame, modules: pl.DataFrame, chunk: int, complete: bool) -> tuple[pl.DataFrame, pl.DataFrame]:
    chunks = [events.slice(o, chunk) for o in range(0, events.height, chunk)]
    rounds = list(stream.analyze_rounds(chunks, modules, complete=complete))
    assert len(rounds) <= len(chunks)
    return pl.concat([r.spans for r in rounds]), pl.concat([r.issues for r in rounds])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 4), threads=st.integers(1, 3), recompute=st.booleans(),
       chunk_frac=st.floats(0.01, 1.0), truncate=st.one_of(st.none(), st.floats(0.05, 0.95)), complete=st.booleans())
def test_rounds_equal_the_one_piece_analysis(seed: int, steps: int, threads: int, recompute: bool, chunk_frac: float,
                                             truncate: float | None, complete: bool) -> None:
    events, mods = _random_run(seed, steps, threads, recompute)
    events = events.sort("seq")
    if truncate is not None:  # a crash: the stream ends with calls open
        events = events.head(max(1, int(truncate * events.height)))
    modules = mods.frame()
    spans, issues = one_piece(events, modules, complete)
    got_spans, got_issues = streamed(events, modules, max(1, int(chunk_frac * events.height)), complete)
    # Every column, self time included, for every span; every issue with its message.
    assert got_spans.sort("rank", "span_id").equals(spans.sort("rank", "span_id"))
    assert got_issues.sort("rank", "seq", "kind").equals(issues.sort("rank", "seq", "kind"))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), how=st.sampled_from(["drop", "duplicate", "swap"]), where=st.floats(0, 1),
       chunk=st.integers(1, 40))
# A swap left a dispatch's rows on both sides of another thread's row: the cut split the
# dispatch, and its late row joined a carried call's tie group (no_enter, crossed, unclosed).
@example(seed=0, how="swap", where=0.625, chunk=1)
def test_a_corrupted_stream_is_still_flagged_in_rounds(seed: int, how: str, where: float, chunk: int) -> None:
    events, mods = _random_run(seed, 2, 2, True)
    rows = events.sort("seq").rows(named=True)
    i = min(int(where * len(rows)), len(rows) - 1)
    if how == "drop":
        rows = rows[:i] + rows[i + 1:]
    elif how == "duplicate":
        rows = rows[: i + 1] + [dict(rows[i])] + rows[i + 1:]
    elif i + 1 < len(rows):
        rows[i], rows[i + 1] = rows[i + 1], rows[i]
    for n, row in enumerate(rows):
        row["seq"] = n
    bad = pl.DataFrame(rows, schema=events.schema)
    modules = mods.frame()
    usable, invalid = validate(bad, modules)
    spans, issues = one_piece(usable, modules, True)
    issues = pl.concat([invalid, issues]).sort("rank", "seq", "kind")
    got_spans, got_issues = streamed(bad, modules, chunk, True)
    assert got_spans["span_id"].is_unique().all()
    assert (issues["severity"] == "error").any() == (got_issues["severity"] == "error").any()
    expected = set(issues.select("seq", "kind").iter_rows())
    found = set(got_issues.select("seq", "kind").iter_rows())
    # Rounds do not remember calls closed in earlier rounds, nor which open calls a crossed
    # exit set aside (see the module's docstring): a repeated exit across a cut reads as
    # no_enter, a repeated enter goes unseen, a set-aside call can be crossed again.
    # Everything else is named at the same row.
    repeated = {(q, k) for q, k in expected if k in ("duplicate_exit", "duplicate_enter")}
    assert expected - repeated <= found
    assert {k for _, k in found - expected} <= {"crossed", "no_enter"}
    assert {q for q, k in found - expected if k == "no_enter"} <= {q for q, _ in repeated}
    if not {"crossed", "duplicate_exit", "duplicate_enter"} & {k for _, k in expected}:
        assert got_issues.sort("rank", "seq", "kind").equals(issues)
        assert got_spans.sort("rank", "span_id").equals(spans.sort("rank", "span_id"))


def test_safe_cut_never_splits_a_tie_group() -> None:
    # thread 0: a dispatch at seq 1-3-5 (tie 0, 1, 1); thread 1 rows interleaved, untied.
    ev = pl.DataFrame({
        "seq": [0, 1, 2, 3, 4, 5, 6], "thread_id": [1, 0, 1, 0, 1, 0, 1], "tie": [0, 0, 0, 1, 0, 1, 0],
    }, schema={"seq": pl.Int64, "thread_id": pl.Int32, "tie": pl.Int8})
    assert stream.safe_cut(ev, set()) == 7  # nothing waits
    assert stream.safe_cut(ev.head(5), set()) == 5  # the dispatch (1, 3) is whole in the chunk
    assert stream.safe_cut(ev.head(5), {0}) == 1  # ... unless thread 0's next row is tied to it: then it waits whole
    assert stream.safe_cut(ev, {1}) == 6  # thread 1's last row continues in the next chunk
    assert stream.safe_cut(ev, {0}) == 1


# --- from the store: SQLite and PostgreSQL ---------------------------------------------------


def _record(db: str, name: str, **kw: Any) -> int:
    """Record a small real model (forward, backward, checkpoint recompute, two threads' forwards)."""
    import threading

    import torch
    from torch import nn
    from torch.utils.checkpoint import checkpoint

    import modtrace

    torch.manual_seed(0)
    blocks = nn.ModuleList(nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8)) for _ in range(3))
    head = nn.Linear(8, 1)
    side = nn.Sequential(nn.Linear(8, 4), nn.ReLU())

    def side_thread() -> None:
        with torch.no_grad():
            for _ in range(20):
                side(torch.ones(2, 8))

    with modtrace.Recorder(db=db, run=name, analyze=False, **kw) as rec:
        t = threading.Thread(target=side_thread)
        t.start()
        for _ in range(6):
            h = torch.randn(4, 8, requires_grad=True)
            for i, blk in enumerate(blocks):
                h = checkpoint(blk, h, use_reentrant=False) if i == 1 else blk(h)
            head(h).sum().backward()
            rec.step()
        t.join()
    return rec.run_id


def _stored(db: str, run_id: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    from modtrace.store.analysis_store import read_issues, read_span_rows
    from modtrace.store.engine import open_store

    store = open_store(db)
    try:
        spans = read_span_rows(store, run_id).sort("rank", "span_id").rows()
        issues = read_issues(store, run_id).sort("rank", "seq", "kind").rows()
    finally:
        store.dispose()
    return spans, issues


def test_materialize_in_small_rounds_stores_what_one_round_does(any_db: str) -> None:
    from modtrace.results.materialize import compute, materialize
    from modtrace.store.engine import open_store

    run_id = _record(any_db, "small")
    store = open_store(any_db)
    try:
        whole = materialize(store, run_id)  # one round: the one-piece analysis
        expected = _stored(any_db, run_id)
        assert whole.spans.height == len(expected[0]) > 100
        assert whole.spans.equals(compute(store, run_id).spans.sort("rank", "span_id"))
        again = materialize(store, run_id, round_rows=17, chunk_rows=5)
        assert again.issues.sort("rank", "seq", "kind").equals(whole.issues.sort("rank", "seq", "kind"))
        assert _stored(any_db, run_id) == expected  # replaced, not appended: the same rows
    finally:
        store.dispose()


def test_a_run_of_several_rounds_goes_to_the_store_only(db_path: Path, run_cli) -> None:  # type: ignore[no-untyped-def]
    from modtrace.results.materialize import materialize
    from modtrace.store.engine import open_store

    run_id = _record(str(db_path), "big")
    store = open_store(str(db_path))
    try:
        materialize(store, run_id)
        expected = _stored(str(db_path), run_id)
        # Rounds smaller than the run (a small run takes several): the spans go to the
        # store round by round and are not held.
        result = materialize(store, run_id, round_rows=50, chunk_rows=64)
        assert result.spans.height == 0 and tuple(result.spans.columns) == SPAN_COLUMNS
    finally:
        store.dispose()
    assert _stored(str(db_path), run_id) == expected
    res = run_cli("analyze", "big")
    assert res.code == 0, res
    assert res.out.startswith(f"run big (id {run_id}): {len(expected[0])} spans, ")
    conn = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    try:
        assert conn.execute("SELECT count(*) FROM span_rows").fetchone()[0] == len(expected[0])
    finally:
        conn.close()


def test_chunks_are_read_with_random_sizes_from_postgres(pg_url: str) -> None:
    from modtrace.store.engine import open_store
    from modtrace.store.reader import iter_event_chunks, read_events, read_modules

    run_id = _record(pg_url, "pg")
    store = open_store(pg_url)
    try:
        events = read_events(store, run_id)
        modules = read_modules(store, run_id)
        spans, issues = one_piece(events, modules, True)
        rng = random.Random(7)
        for _ in range(3):
            size = rng.randint(5, 200)
            rounds = list(stream.analyze_rounds(iter_event_chunks(store, run_id, 0, chunk_rows=size), modules))
            assert pl.concat([r.spans for r in rounds]).sort("span_id").equals(spans.sort("span_id"))
            assert pl.concat([r.issues for r in rounds]).sort("seq", "kind").equals(issues.sort("seq", "kind"))
    finally:
        store.dispose()


def test_validation_sees_gaps_and_reversals_across_chunk_boundaries() -> None:
    events, mods = _random_run(3, 2, 2, False)
    events = events.sort("seq")
    modules = mods.frame()
    n = events.height
    # seqs n//2 and n//2+1 deleted (a gap at the boundary of 2-row chunks), and a thread's
    # row put back in time just after a boundary, below its previous row on that thread.
    gapped = events.filter(~pl.col("seq").is_in([n // 2, n // 2 + 1]))
    back = gapped["seq"][7]
    gapped = gapped.with_columns(
        pl.when(pl.col("seq") == back).then(0).otherwise(pl.col("ts_ns") + 1000).alias("ts_ns")
    )
    _, invalid = validate(gapped, modules)
    assert set(invalid["kind"].to_list()) == {"seq_gap", "time_reversed"}
    for chunk in (1, 2, 3, 8):
        _, got = streamed(gapped, modules, chunk, True)
        found = got.filter(pl.col("kind").is_in(["seq_gap", "time_reversed"])).sort("seq", "kind")
        assert found.equals(invalid.sort("seq", "kind")), chunk


# --- the analysis of a rank (analyze_rank): rounds, identical to one piece on every stream --------


def ranked(events: pl.DataFrame, modules: pl.DataFrame, chunk: int, complete: bool) -> tuple[pl.DataFrame, pl.DataFrame]:
    """What analyze_rank's rounds add up to, as a writer applies them (a restart replaces the rounds before)."""
    parts: list[stream.Round] = []
    for part in stream.analyze_rank(lambda: [events.slice(o, chunk) for o in range(0, events.height, chunk)],
                                    modules, complete=complete):
        if part.restart:
            parts.clear()
        parts.append(part)
    return pl.concat([r.spans for r in parts]), pl.concat([r.issues for r in parts])


def _corrupt(seed: int, how: str, where: float, threads: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    events, mods = _random_run(seed, 2, threads, True)
    rows = events.sort("seq").rows(named=True)
    i = min(int(where * len(rows)), len(rows) - 1)
    j = min(len(rows) - 1, i + 1 + seed % 7)
    if how == "drop":
        rows = rows[:i] + rows[i + 1:]
    elif how == "duplicate":  # the copy lands a few rows later, often across a cut
        rows = rows[:j] + [dict(rows[i])] + rows[j:]
    elif how == "swap":
        rows[i], rows[j] = rows[j], rows[i]
    for n, row in enumerate(rows):
        row["seq"] = n
    return pl.DataFrame(rows, schema=events.schema), mods.frame()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), how=st.sampled_from(["none", "drop", "duplicate", "swap"]),
       where=st.floats(0, 1), threads=st.integers(1, 3), chunk=st.integers(1, 60), complete=st.booleans())
@example(seed=0, how="swap", where=0.625, threads=2, chunk=1, complete=True)
@example(seed=3, how="duplicate", where=0.3, threads=1, chunk=5, complete=True)
def test_a_rank_in_rounds_is_the_one_piece_analysis_on_every_stream(
    seed: int, how: str, where: float, threads: int, chunk: int, complete: bool
) -> None:
    events, modules = _corrupt(seed, how, where, threads)
    usable, invalid = validate(events, modules)
    spans, issues = one_piece(usable, modules, complete)
    issues = pl.concat([invalid, issues]).sort("rank", "seq", "kind")
    got_spans, got_issues = ranked(events, modules, chunk, complete)
    assert got_spans.sort("rank", "span_id").equals(spans.sort("rank", "span_id"))
    assert got_issues.sort("rank", "seq", "kind").equals(issues)


def test_a_call_entered_again_after_a_cut_is_still_a_duplicate_enter() -> None:
    # One forward call whose enter/exit pair is repeated later, each pair in its own chunk:
    # the rounds alone would see two clean calls.
    events, mods = _random_run(1, 1, 1, False)
    rows = events.sort("seq").rows(named=True)
    first = next(r for r in rows if r["kind"] == 0 and r["phase"] == 0)
    exit_row = next(r for r in rows if r["kind"] == 1 and r["call_id"] == first["call_id"] and r["phase"] == 0)
    rows = rows + [dict(first), dict(exit_row)]
    for n, row in enumerate(rows):
        row["seq"] = n
        row["ts_ns"] = n * 10
    bad = pl.DataFrame(rows, schema=events.schema)
    modules = mods.frame()
    _, issues = one_piece(bad, modules, True)
    assert "duplicate_enter" in issues["kind"].to_list()
    _, got = ranked(bad, modules, 2, True)
    assert got.sort("rank", "seq", "kind").equals(issues.sort("rank", "seq", "kind"))
