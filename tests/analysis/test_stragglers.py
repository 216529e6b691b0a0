"""The stragglers rule on reduced tables made by hand (what ``store.stragglers.reduce_ranks``
returns): the noise bar, waits told from stragglers by when ranks leave a module, slow ranks,
the what-if step and persistence."""

from __future__ import annotations

from typing import Any

import polars as pl

from modtrace.analysis.stragglers import find_stragglers

MS = 1_000_000


def _modules(rows: list[dict[str, Any]]) -> pl.DataFrame:
    base = {"phase": "forward", "ranks": 2, "q1_ns": None, "q3_ns": None, "min_rank": 0, "max_late_ns": 0.0}
    frame = pl.DataFrame([{**base, **r} for r in rows])
    return frame.with_columns(
        pl.col("median_ns").cast(pl.Float64), pl.col("others_ns").cast(pl.Float64), pl.col("q1_ns").cast(pl.Float64),
        pl.col("q3_ns").cast(pl.Float64), pl.col("min_ns").cast(pl.Float64), pl.col("max_ns").cast(pl.Float64),
        pl.col("max_late_ns").cast(pl.Float64))


def _cell(step: int, fqn: str, lo: float, hi: float, hi_rank: int, late: float = 0.0) -> dict[str, Any]:
    return {"step": step, "fqn": fqn, "median_ns": (lo + hi) / 2, "others_ns": lo, "min_ns": lo,
            "min_rank": 1 - hi_rank, "max_ns": hi, "max_rank": hi_rank, "max_late_ns": late}


def _ranks(steps: int, wall: dict[int, float], busy: dict[int, float], self_ns: dict[int, float] | None = None,
           median_sum: float = 3 * MS, above: dict[int, int] | None = None, top: dict[int, float] | None = None) -> pl.DataFrame:
    rows = [{"step": s, "rank": r, "cells": 3, "above": float((above or {}).get(r, 1)),
             "self_ns": (self_ns or {}).get(r, median_sum), "median_sum_ns": median_sum,
             "top_excess_ns": (top or {}).get(r, 0.0), "wall_ns": wall[r], "busy_ns": busy[r]}
            for s in range(steps) for r in (0, 1)]
    return pl.DataFrame(rows)


def test_a_slow_module_is_named_with_its_excess_what_if_and_where_the_other_waited() -> None:
    modules = _modules([c for s in range(4) for c in (
        _cell(s, "a", 1 * MS, 1.02 * MS, 0), _cell(s, "b", 1 * MS, 11 * MS, 1, late=10 * MS),
        _cell(s, "c", 1 * MS, 1.01 * MS, 1))])
    ranks = _ranks(4, wall={0: 14 * MS, 1: 14 * MS}, busy={0: 3.1 * MS, 1: 13 * MS})
    found = find_stragglers(modules, ranks, world=2).to_dict()
    for s in found["steps"]:
        assert s["straggler"] == {"kind": "module", "rank": 1, "fqn": "b", "phase": "forward",
                                  "excess_ns": 10 * MS, "ratio": None}
        # 14 - 10 = 4, but not below the other rank's own step: its 3.1 in modules + rank 1's 1 outside
        assert s["what_if_step_ns"] == round(4.1 * MS)
        assert s["waited"]["outside_ns"] == round(10.9 * MS - 1 * MS)
    assert [(p["rank"], p["fqn"], p["steps"]) for p in found["persistent"]] == [(1, "b", 4)]


def test_a_wait_inside_a_module_is_not_a_straggler() -> None:
    # rank 0 spends 8 ms in c, but leaves it with rank 1 (late 0): it waited there for rank 1's b
    modules = _modules([c for s in range(4) for c in (
        _cell(s, "b", 1 * MS, 11 * MS, 1, late=10 * MS), _cell(s, "c", 1 * MS, 9 * MS, 0, late=0.0))])
    ranks = _ranks(4, wall={0: 14 * MS, 1: 14 * MS}, busy={0: 12 * MS, 1: 13 * MS})
    found = find_stragglers(modules, ranks, world=2).to_dict()
    assert {(s["straggler"]["rank"], s["straggler"]["fqn"]) for s in found["steps"]} == {(1, "b")}
    assert {s["waited"]["inside"]["fqn"] for s in found["steps"]} == {"c"}


def test_differences_under_the_noise_bar_name_no_one() -> None:
    # 0.2 ms: over the 100 us floor, under 5% of the 10 ms step
    modules = _modules([_cell(s, "a", 1 * MS, 1.2 * MS, s % 2, late=0.2 * MS) for s in range(6)])
    ranks = _ranks(6, wall={0: 10 * MS, 1: 10 * MS}, busy={0: 2 * MS, 1: 2 * MS})
    found = find_stragglers(modules, ranks, world=2).to_dict()
    assert all(s["straggler"] is None for s in found["steps"])
    assert found["persistent"] == []
    assert [s["what_if_step_ns"] for s in found["steps"]] == [10 * MS] * 6


def test_a_rank_slower_in_every_module_is_a_slow_rank_with_its_ratio() -> None:
    modules = _modules([c for s in range(4) for c in (
        _cell(s, m, 1 * MS, 1.5 * MS, 1, late=0.5 * MS) for m in ("a", "b", "c"))])
    ranks = _ranks(4, wall={0: 5 * MS, 1: 5 * MS}, busy={0: 3 * MS, 1: 4.5 * MS},
                   self_ns={0: 3 * MS, 1: 4.5 * MS}, above={0: 0, 1: 3}, top={1: 0.5 * MS})
    found = find_stragglers(modules, ranks, world=2).to_dict()
    [p] = found["persistent"]
    assert (p["kind"], p["rank"], p["fqn"], p["ratio"]) == ("rank", 1, None, 1.5)
    assert found["steps"][0]["straggler"]["excess_ns"] == round(1.5 * MS)


def test_left_out_steps_are_kept_in_the_result() -> None:
    modules = _modules([_cell(0, "a", 1 * MS, 1 * MS, 0)])
    ranks = _ranks(1, wall={0: 2 * MS, 1: 2 * MS}, busy={0: 1 * MS, 1: 1 * MS})
    assert find_stragglers(modules, ranks, world=2, left_out=[5, 4]).to_dict()["left_out_steps"] == [4, 5]
