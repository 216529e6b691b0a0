"""``materialize`` in parts written while the next is read and analysed: the same rows.

The default parts (``materialize.PART_ROWS`` events on PostgreSQL, a round of
up to ``round_rows`` on SQLite) are larger than these recordings, so each
test asks for parts of a few events: many parts, each
written by the write thread while the next one is made, the rank still held
whole (``round_rows`` is not reached) so its spans come back and its tree is
computed from them.  Every stored row (spans, issues, tree nodes) must be the
one-piece analysis' and the plain write's (``write_analysis`` of
``compute``), on real recordings in SQLite and PostgreSQL.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import torch

import modtrace
from modtrace.results.materialize import analysed_rounds, compute, materialize
from modtrace.results.tree import store_tree
from modtrace.store.analysis_store import write_analysis, writes_beside_reads
from modtrace.store.engine import open_store
from modtrace.store.reader import read_events, read_run_status
from tests.helpers.analysis_streams import _write_misnested, _write_two_ranks
from tests.helpers.database import db_rows
from tests.helpers.models import Net


def _write_real(db: str) -> int:
    """A real model trained a few steps (checkpointed block: recompute spans), analysis left undone."""
    torch.manual_seed(0)
    net = Net(blocks=3)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    with modtrace.Recorder(db=db, run="real", analyze=False, handle_sigterm=False):
        for _ in range(4):
            net(torch.ones(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    ((run_id,),) = db_rows(db, "SELECT id FROM runs WHERE name = 'real'")
    return int(run_id)


def _rows(store: Any, run_id: int) -> dict[str, list[tuple[Any, ...]]]:
    order = {"span_rows": "rank, span_id", "nesting_issues": "rank, seq, kind", "tree_nodes": "clock, node"}
    with store.engine.connect() as conn:
        return {t: [tuple(r) for r in conn.exec_driver_sql(
            f"SELECT * FROM {t} WHERE run_id = {run_id} ORDER BY {o}").all()] for t, o in order.items()}


RECORDINGS = {"real": _write_real, "two_ranks": lambda db: _write_two_ranks(db)[0], "misnested": _write_misnested}


@pytest.mark.parametrize("recording", list(RECORDINGS))
def test_parts_written_behind_the_analysis_store_what_one_piece_and_the_plain_write_store(
    any_db: str, recording: str,
) -> None:
    run_id = RECORDINGS[recording](any_db)
    store = open_store(any_db)
    try:
        assert writes_beside_reads(store)  # WAL (modtrace creates it so) or PostgreSQL
        events = read_events(store, run_id).height
        whole = materialize(store, run_id)  # one part: these recordings are smaller than PART_ROWS
        one_piece = _rows(store, run_id)
        parted = materialize(store, run_id, part_rows=7)
        in_parts = _rows(store, run_id)
        plain = compute(store, run_id)
        write_analysis(store, run_id, plain.spans, plain.issues)
        store_tree(store, run_id, plain.spans)
        written_plain = _rows(store, run_id)
    finally:
        store.dispose()
    assert events > 7 * 10  # many parts
    assert in_parts == one_piece == written_plain
    assert len(one_piece["span_rows"]) == whole.spans.height > 0
    assert parted.spans.equals(whole.spans) and parted.issues.equals(whole.issues)
    if recording != "two_ranks":  # two_ranks' tree: its run stores none (steps left to the rule)
        assert one_piece["tree_nodes"]
    if recording == "misnested":  # a cut-sensitive issue: a rank analysed again, replacing its written parts
        assert "crossed" in set(whole.issues["kind"].to_list())


def test_a_rollback_journal_database_writes_its_parts_after_each_other(db_path: Path) -> None:
    """Outside WAL mode a writer that spills its cache would lock the readers of the next part
    out: a rank up to round_rows is then analysed in one round, as before parts, written
    after it is made; the same rows."""
    db = str(db_path)
    run_id = _write_real(db)
    store = open_store(db)
    try:
        materialize(store, run_id)
        wal = _rows(store, run_id)
    finally:
        store.dispose()
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0] == "delete"
    finally:
        conn.close()
    store = open_store(db)
    try:
        assert read_run_status(store, run_id) == "completed"
        assert not writes_beside_reads(store)
        result = materialize(store, run_id, part_rows=5)
        rolled = _rows(store, run_id)
    finally:
        store.dispose()
    assert rolled == wal and result.spans.height == len(wal["span_rows"])


def test_a_rank_larger_than_round_rows_goes_to_the_store_only_in_parts_too(any_db: str) -> None:
    run_id = _write_real(any_db)
    store = open_store(any_db)
    try:
        whole = materialize(store, run_id)
        expected = _rows(store, run_id)
        events = read_events(store, run_id).height
        result = materialize(store, run_id, round_rows=events - 1, part_rows=9)
        got = _rows(store, run_id)
    finally:
        store.dispose()
    assert result.spans.height == 0 and result.issues.equals(whole.issues)
    assert got == expected


def test_analysed_rounds_are_the_spans_analyze_stores_and_write_nothing(db_path: Path) -> None:
    """The floor benchmarks/bench_analysis.py times beside ``modtrace analyze``: analyze's
    reading and analysing, its spans and issues, with nothing stored."""
    db = str(db_path)
    run_id = _write_real(db)
    store = open_store(db)
    try:
        rounds = list(analysed_rounds(store, run_id))
        nothing = _rows(store, run_id)
        whole = materialize(store, run_id)
    finally:
        store.dispose()
    assert nothing == {"span_rows": [], "nesting_issues": [], "tree_nodes": []}
    spans = [row for s, _ in rounds for row in s.select("rank", "span_id", "start_ns", "end_ns").rows()]
    assert sorted(spans) == sorted(whole.spans.select("rank", "span_id", "start_ns", "end_ns").rows())
    assert sum(i.height for _, i in rounds) == whole.issues.height
