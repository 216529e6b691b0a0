"""``analysis.step_fold.StepFold``: the step table and step starts folded round by round equal
``step_table`` and ``step_starts`` of all the spans at once (the oracle: the one-piece rows
``modtrace analyze`` stores, ``results.steps.step_rows``).

Real recordings (SQLite), their spans cut into rounds as the analysis that follows a recording
closes them (``tests.helpers.rounds``).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from modtrace.analysis.step_fold import FOLD_COLUMNS, StepFold
from modtrace.analysis.step_time import step_table
from modtrace.analysis.steps import step_starts
from tests.helpers.models import Checkpointed
from tests.helpers.rounds import Rounds, keyed_rounds
from tests.helpers.training import record_serving, record_training


def assert_folds_to_the_whole(cut: Rounds) -> tuple[pl.DataFrame, pl.DataFrame]:
    fold = StepFold()
    for part in cut.rounds:
        fold.add(part.select(FOLD_COLUMNS))
    folded = fold.table(cut.stepping.rule)
    assert folded is not None
    table, starts = folded
    assert_frame_equal(table, step_table(cut.stepping.frame, with_start=True))
    assert_frame_equal(starts, step_starts(cut.stepping.frame))
    return table, starts


@pytest.mark.parametrize("rounds", [1, 3, 17])
def test_training_with_recompute(tmp_path: Path, rounds: int) -> None:
    db = str(tmp_path / "t.db")
    record_training(db, "train", 12, model=Checkpointed, inputs=(4, 8))
    cut = keyed_rounds(db, "train", rounds)
    assert len(cut.rounds) == rounds
    table, _ = assert_folds_to_the_whole(cut)
    assert cut.stepping.rule == "optimizer"
    assert table.height == 12
    assert (table["recompute_ns"] > 0).sum() >= 12


def test_root_call_steps_on_serving_threads(tmp_path: Path) -> None:
    """No optimizer: each root call is a step, told apart per thread; a thread enters a step at
    each of its requests."""
    db = str(tmp_path / "t.db")
    record_serving(db, "serve")
    cut = keyed_rounds(db, "serve", 9)
    table, starts = assert_folds_to_the_whole(cut)
    assert cut.stepping.rule == "root"
    assert table.height == 90
    assert starts.height == 90 and starts["thread_id"].n_unique() == 3


def test_a_schedule_leaves_gaps_between_recorded_steps(tmp_path: Path) -> None:
    """Steps not recorded (a schedule's wait) end the step before them at its own last span."""
    db = str(tmp_path / "t.db")
    record_training(db, "sched", 20, model=Checkpointed, inputs=(4, 8),
                    schedule="wait=2,active=3,repeat=3")
    cut = keyed_rounds(db, "sched", 7)
    table, _ = assert_folds_to_the_whole(cut)
    gaps = table.filter(pl.col("step").diff() > 1)
    assert gaps.height >= 2


def _spans(rows: list[tuple[int, int, int]]) -> pl.DataFrame:
    """Hand-made root spans (span_id, thread_id, key), 5 ns each, as a round gives them."""
    return pl.DataFrame(
        [(0, t, s, k, 0, 1, 10 * s, 10 * s + 5, 5, 5, k) for s, t, k in rows],
        schema={"rank": pl.Int32, "thread_id": pl.Int32, "span_id": pl.Int64, "step": pl.Int32, "depth": pl.Int32,
                "phase": pl.Int8, "start_ns": pl.Int64, "end_ns": pl.Int64, "duration_ns": pl.Int64,
                "self_ns": pl.Int64, "_key": pl.Int64},
        orient="row")


def test_a_thread_whose_steps_interleave_is_left_to_the_whole() -> None:
    """Thread 1 goes back to step 0 after step 1: its step starts are three, not one per step,
    so the fold does not stand for them."""
    fold = StepFold()
    fold.add(_spans([(1, 1, 0), (2, 1, 1)]))
    fold.add(_spans([(3, 1, 0)]))
    assert fold.table("optimizer") is None
    whole = step_starts(pl.concat([_spans([(1, 1, 0), (2, 1, 1)]), _spans([(3, 1, 0)])]))
    assert whole.height == 3


def test_steps_a_later_round_brings_more_of_add_up() -> None:
    fold = StepFold()
    rounds = [[(1, 1, 0), (2, 2, 0)], [(3, 1, 1), (4, 2, 0)], [(5, 1, 1), (6, 2, 2)]]
    for rows in rounds:
        fold.add(_spans(rows))
    folded = fold.table("optimizer")
    assert folded is not None
    whole = pl.concat([_spans(rows) for rows in rounds]).sort("span_id")
    assert_frame_equal(folded[0], step_table(whole, with_start=True))
    assert_frame_equal(folded[1], step_starts(whole))
    assert folded[0]["spans"].to_list() == [3, 2, 1]
