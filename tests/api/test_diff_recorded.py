"""The diff rule on runs recorded by the real Recorder: every module slowed alike (a busier
machine, or slower code everywhere) and one block slowed twice as much again; only that block
is blamed, and two recordings of the same code blame nothing."""

from __future__ import annotations

import polars as pl
import pytest

import modtrace
from modtrace.analysis.diff import DiffOptions
from tests.helpers.diff_runs import build_rep_model, record, record_reps

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
        assert result.summary["step_ratio"] > 2 and result.summary["step_verdict"] is None
        # 2x against the typical module is under a share threshold of 150%
        assert _verdicts(db.diff("base", "cand", DiffOptions(share_threshold=1.5)), "regression") == set()


def test_real_work_real_clock_only_the_slower_block_is_blamed(db_path: object) -> None:
    """Real time on a shared machine: each Rep module applies its weight twice in the
    candidate instead of once, block 1's four times."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    # outside modtrace: the candidate's work per module is what the test says it is
    def flops(reps: int, slow: int | None, factor: int) -> dict[str, int]:
        net = build_rep_model(reps, slow, factor)
        with FlopCounterMode(display=False) as counter:
            net(torch.randn(32, 256))
        return {k: int(sum(v.values())) for k, v in counter.get_flop_counts().items()}

    base_f, cand_f = flops(1, None, 1), flops(2, 1, 2)
    ratio = {k: cand_f[k] / base_f[k] for k in base_f if k.startswith("Net.") and k.count(".") in (1, 3)}
    assert ratio["Net.blocks.1.a"] == ratio["Net.blocks.1.b"] == 4.0
    assert {r for k, r in ratio.items() if ".blocks.1." not in k and k != "Net.blocks"} == {2.0}, ratio

    db = str(db_path)
    record_reps(db, "base", 1)
    record_reps(db, "same", 1)
    record_reps(db, "cand", 2, slow_block=1, factor=2)
    with modtrace.open(db) as h:
        same = h.diff("base", "same")
        assert _verdicts(same, "regression") == _verdicts(same, "improvement") == set()
        result = h.diff("base", "cand")
        assert _verdicts(result, "improvement") == set()
        # against a history of the two base runs too
        for judged in (result, h.diff(["same", "base"], "cand")):
            blamed = {fqn for fqn, _ in _verdicts(judged, "regression")}
            # both Reps of block 1, and nothing outside block 1 (its container's own few
            # microseconds may move with its children on a loaded machine)
            assert {"Net.blocks.1.a", "Net.blocks.1.b"} <= blamed <= BLOCK_1, judged.timing.head(6)
