"""``analysis.tree_fold.TreeFold``: the tree folded round by round equals ``module_tree`` of all
the spans at once (the oracle: the one-piece tree ``modtrace analyze`` stores).

Real recordings (SQLite), their spans cut into rounds as the analysis that follows a recording
closes them (``tests.helpers.rounds``).
"""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import torch
from polars.testing import assert_frame_equal
from torch import nn

import modtrace
from modtrace.analysis.aggregate import module_tree
from modtrace.analysis.tree_fold import TreeFold
from tests.helpers.models import Checkpointed
from tests.helpers.rounds import keyed_rounds
from tests.helpers.training import record_serving, record_training


def folded_and_whole(db: str, run: str, rounds: int) -> tuple[pl.DataFrame | None, pl.DataFrame, TreeFold]:
    """(the fold's tree over ``rounds`` rounds, ``module_tree`` of all spans, the fold)."""
    cut = keyed_rounds(db, run, rounds)
    fold = TreeFold()
    for part in cut.rounds:
        fold.add(part)
    return fold.tree(), module_tree(cut.stepping.frame), fold


@pytest.mark.parametrize("rounds", [1, 3, 17])
def test_training_with_recompute_folds_to_the_whole_tree(tmp_path: Path, rounds: int) -> None:
    db = str(tmp_path / "t.db")
    record_training(db, "train", 12, model=Checkpointed, inputs=(4, 8))
    folded, whole, fold = folded_and_whole(db, "train", rounds)
    assert fold.broken is None
    assert folded is not None
    assert set(whole["phase"].cast(pl.String)) == {"forward", "backward", "recompute"}
    assert whole["steps"].max() == 12
    assert_frame_equal(folded, whole)


def test_root_call_steps_on_serving_threads_fold_to_the_whole_tree(tmp_path: Path) -> None:
    """No optimizer: each root call is a step, told apart per thread (``step_keys`` under root)."""
    db = str(tmp_path / "t.db")
    record_serving(db, "serve")
    folded, whole, _ = folded_and_whole(db, "serve", 9)
    assert whole["steps"].max() == 90  # a step per request
    assert folded is not None
    assert_frame_equal(folded, whole)


def test_a_call_open_across_every_round_waits_and_then_folds(tmp_path: Path) -> None:
    """The optimizer steps inside an outer module's forward: every span's root closes only at
    the end, so every round's spans wait for it."""
    db = str(tmp_path / "t.db")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 8), nn.ReLU())
    opt = torch.optim.SGD(net.parameters(), lr=0.01)

    class Loop(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for _ in range(6):
                net(x).sum().backward()
                opt.step()
                opt.zero_grad()
            return x

    with modtrace.Recorder(db=db, run="loop") as rec:
        Loop()(torch.randn(4, 8))
    rec.wait_analyzed()
    folded, whole, _ = folded_and_whole(db, "loop", 5)
    assert folded is not None
    assert_frame_equal(folded, whole)


def _spans(rows: list[tuple[int, int | None, int, str, int]]) -> pl.DataFrame:
    """Hand-made span rows (span_id, parent_span_id, depth, fqn, step), 5 ns each, as a round gives them."""
    return pl.DataFrame(
        [(0, s, p, d, f, "Linear", "forward", None, 10 * s, 5, 5 if d else 0, k, k) for s, p, d, f, k in rows],
        schema={"rank": pl.Int32, "span_id": pl.Int64, "parent_span_id": pl.Int64, "depth": pl.Int32,
                "fqn": pl.String, "module_type": pl.String, "phase": pl.String, "status": pl.String,
                "start_ns": pl.Int64, "duration_ns": pl.Int64, "self_ns": pl.Int64, "step": pl.Int32, "_key": pl.Int64},
        orient="row")


def test_a_step_a_later_round_brings_more_of_is_added_up() -> None:
    """Step 0's sums were settled when round 2 began at step 1; round 3 brings more of step 0."""
    rounds = [[(1, None, 0, "M", 0), (2, 1, 1, "M.a", 0), (3, None, 0, "M", 0)],
              [(4, None, 0, "M", 1), (5, None, 0, "M", 1)],
              [(6, None, 0, "M", 0), (7, 6, 1, "M.a", 0), (8, None, 0, "M", 2)]]
    fold = TreeFold()
    for rows in rounds:
        fold.add(_spans(rows))
    folded = fold.tree()
    assert folded is not None
    whole = module_tree(pl.concat([_spans(rows) for rows in rounds]).drop("_key"))
    assert_frame_equal(folded, whole)
    m = folded.filter(pl.col("fqn") == "M").row(0, named=True)
    # steps 0, 1, 2: 15, 10 and 5 ns (step 0 counted twice would make 4 steps)
    assert (m["calls"], m["steps"], m["inclusive_median_ns"]) == (6, 3, 10.0)


def test_a_span_whose_parent_closed_in_an_earlier_round_gives_up() -> None:
    """Calls that did not nest (a child closing after its parent) are left to the whole tree."""
    fold = TreeFold()
    fold.add(_spans([(1, None, 0, "M", 0)]))  # the parent closes first
    fold.add(_spans([(2, 1, 1, "M.a", 0)]))  # its child after it, in the next round
    assert fold.tree() is None
    assert fold.broken == "1 spans found no parent"
