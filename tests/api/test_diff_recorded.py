"""The diff rule on runs recorded by the real Recorder: every module slowed alike (a busier
machine, or slower code everywhere) and one block slowed twice as much again; only that block
is blamed, and two recordings of the same code blame nothing."""

from __future__ import annotations

import polars as pl
import pytest

import modtrace
from modtrace.analysis.diff import DiffOptions
from tests.helpers.diff_runs import record

BLOCK_1 = {"Net.blocks.1", "Net.blocks.1.a", "Net.blocks.1.b"}


def _verdicts(result: modtrace.api.DiffResult, verdict: str) -> set[tuple[str, str]]:
    rows = result.timing.filter(pl.col("verdict") == verdict)
    return set(zip(rows["fqn"], rows["phase"], strict=True))


def test_a_block_twice_as_slow_as_everything_else_is_blamed_alone_exactly(any_db: str) -> None:
    """Injected clock: every duration of the candidate doubled (ticks and work), block 1's work
    doubled again, so its ratio to the typical module is exactly 2."""
    record(any_db, "base")
    record(any_db, "same")
    record(any_db, "cand", {1: 200_000}, scale=2.0)
    with modtrace.open(any_db) as db:
        same = db.diff("base", "same")
        assert _verdicts(same, "regression") == _verdicts(same, "improvement") == set()
        result = db.diff("base", "cand")
        assert _verdicts(result, "regression") == {("Net.blocks.1.work", "forward")}
        assert _verdicts(result, "improvement") == set()
        row = result.timing.row(0, named=True)
        assert row["self_ratio"] == pytest.approx(4.0, rel=0.02)  # 102 us -> 404 us per step
        assert row["self_vs_typical"] == pytest.approx(2.0, rel=0.02)
        # the step doubled and more: one base run cannot tell that from load, so it is only noted
        assert result.summary.step_ratio is not None and result.summary.step_ratio > 2
        assert result.step.verdict == "unknown" and not result.step.check("history_runs").passed  # type: ignore[union-attr]
        # 2x against the typical module is under a share threshold of 150%
        assert _verdicts(db.diff("base", "cand", DiffOptions(share_threshold=1.5)), "regression") == set()
