"""The checkpointing what-if and the budget search on a step built by hand, every figure worked
out on paper from the model in docs/memory.md ("The what-if model")."""

from __future__ import annotations

import polars as pl
import pytest

from modtrace.analysis.memory_plan import (
    EXACT_CANDIDATES,
    budget_candidates,
    budget_plan,
    cheapest,
    matches,
    module_memory,
    outermost_forward,
    predicted_peak,
    recompute_ns,
    step_model,
    what_if,
)

# seq: 0 Net enter, 1 blocks.0 enter, 2 its exit, 3 blocks.1 enter, 4 its exit, 5 Net exit;
# backward: 6 Net, 7 blocks.1 (exit 8), 9 blocks.0 (exit 10), 11 Net's exit.
SPANS = pl.DataFrame(
    [
        (0, 0, 0, 5, None, 0, "Net", "forward", 1, 1000),
        (0, 0, 1, 2, 0, 1, "Net.blocks.0", "forward", 2, 300),
        (0, 0, 3, 4, 0, 1, "Net.blocks.1", "forward", 3, 200),
        (0, 0, 6, 11, None, 0, "Net", "backward", 1, 2000),
        (0, 0, 7, 8, 6, 1, "Net.blocks.1", "backward", 3, 400),
        (0, 0, 9, 10, 6, 1, "Net.blocks.0", "backward", 2, 600),
    ],
    schema=["rank", "step", "span_id", "exit_seq", "parent_span_id", "depth", "fqn", "phase", "call_id", "duration_ns"],
    orient="row",
)
# sid, nbytes, alloc_seq, free_seq: parameters W; blocks.0 saves a0, frees a transient t0,
# returns o0; blocks.1 saves a1, returns o1; the backward's gradients g1, g0.
STORAGES = pl.DataFrame(
    [(0, 100, None, None), (1, 40, 2, 10), (2, 30, 2, 2), (3, 10, 2, 8), (4, 50, 4, 8), (5, 10, 4, 7),
     (6, 20, 7, 9), (7, 20, 9, 11)],
    schema={"sid": pl.Int64, "nbytes": pl.Int64, "alloc_seq": pl.Int64, "free_seq": pl.Int64}, orient="row",
)
RETURNS = pl.DataFrame([(2, 3), (3, 5), (1, 5)], schema={"call_id": pl.Int64, "sid": pl.Int64}, orient="row")
BLOCK0, BLOCK1 = "Net.blocks.0", "Net.blocks.1"


def model():  # type: ignore[no-untyped-def]
    return step_model(STORAGES, SPANS, RETURNS, rank=0, step=0, first_seq=0, device="cpu")


def test_measured_timeline_and_calls() -> None:
    m = model()
    # levels: 140 170 180 150 | 200 210 | 230 220 | 170 160 | 180 160 | 120 | 100
    assert (m.base_bytes, m.peak_bytes) == (100, 230)
    calls = {c.fqn: c for c in m.calls}
    assert (calls[BLOCK0].kept_bytes, calls[BLOCK0].freed_bytes, calls[BLOCK0].forward_peak_bytes) == (50, 40, 80)
    assert (calls[BLOCK1].kept_bytes, calls[BLOCK1].freed_bytes, calls[BLOCK1].forward_peak_bytes) == (60, 50, 60)
    assert (calls["Net"].kept_bytes, calls["Net"].freed_bytes) == (110, 100)
    assert calls[BLOCK0].backward_seq == 9 and calls[BLOCK1].backward_seq == 7
    assert calls[BLOCK1].ancestors == frozenset({"Net"})


def test_what_if_by_hand() -> None:
    m = model()
    assert m.predict(frozenset()) == 230
    # blocks.0: 40 off from 3 to 9 (the peak at 7 becomes 190); its recompute at 9: 160 - 40 + 80.
    assert m.predict(frozenset({BLOCK0})) == 200
    # blocks.1: its recompute at 7 brings back the peak: 220 - 50 + 60.
    assert m.predict(frozenset({BLOCK1})) == 230
    # both: blocks.0's recompute (200) is the peak; blocks.1's is 220 - 40 - 50 + 60 = 190.
    assert m.predict(frozenset({BLOCK0, BLOCK1})) == 200
    # Net holds the blocks: only it counts, and its recompute comes right at 6, before the peak.
    assert m.predict(frozenset({"Net", BLOCK0})) == m.predict(frozenset({"Net"})) == 230


def test_patterns_and_outermost() -> None:
    assert matches("Net.blocks.0", ["blocks.*"]) and matches("Net.blocks.0", ["Net.blocks.0"])
    assert matches("Net.blocks.0.fc1", ["*.fc1"]) and not matches("Net", ["blocks.*"])
    found = what_if([model()], ["blocks.*"], step_ns=10_000, added_ns=500)
    assert found.modules == (BLOCK0, BLOCK1)
    assert (found.peak_bytes, found.measured_peak_bytes, found.step_ns, found.added_ns) == (200, 230, 10_500, 500)
    hits = outermost_forward(SPANS, {"Net", BLOCK0})
    assert hits["fqn"].to_list() == ["Net"]
    steps = pl.DataFrame({"rank": [0], "step": [0]})
    assert recompute_ns(SPANS, {BLOCK0, BLOCK1}, steps) == 500


def test_module_memory_sorted_by_kept() -> None:
    mods = module_memory([model()], {"Net": 1000, BLOCK0: 300, BLOCK1: 200})
    assert [(m.fqn, m.kept_bytes, m.freed_bytes, m.forward_ns) for m in mods] == [
        ("Net", 110, 100, 1000), (BLOCK1, 60, 50, 200), (BLOCK0, 50, 40, 300)]


@pytest.mark.parametrize(("budget", "found", "modules", "peak"), [
    (230, True, (), 230),  # already within: nothing to checkpoint
    (200, True, (BLOCK0,), 200),  # {blocks.0} at 300 ns beats {both} at 500 ns
    (199, False, (), 200),  # no subset goes below 200: the lowest met is said
])
def test_budget_exact(budget: int, found: bool, modules: tuple[str, ...], peak: int) -> None:
    cost = {"Net": 1000, BLOCK0: 300, BLOCK1: 200}
    plan = budget_plan([model()], budget, cost, step_ns=10_000, added_ns_of=lambda f: sum(cost[n] for n in f))
    assert (plan.found, plan.modules, plan.search) == (found, modules, "exact")
    assert (plan.peak_bytes if found else plan.lowest_peak_bytes) == peak
    assert plan.added_ns == sum(cost[n] for n in modules) and plan.step_ns == 10_000 + plan.added_ns


def test_budget_exact_prefers_the_cheaper_set() -> None:
    # blocks.0 made dear: {blocks.0} still the only set within 200 but Net alone cannot.
    search, chosen, n, _ = cheapest([model()], 200, {"Net": 1, BLOCK0: 10_000, BLOCK1: 1})
    assert (search, chosen, n) == ("exact", frozenset({BLOCK0}), 3)


def _chain(n: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """``n`` blocks, each saving 10 bytes and returning 1; the backward frees each block's 10
    as it passes it, in reverse."""
    spans, storages = [], []
    seq, sid = 1, 0
    exits = []
    for i in range(n):
        spans.append((0, 0, seq, seq + 1, 0, 1, f"M.b{i}", "forward", i + 2, 100 + i))
        storages += [(sid, 10, seq + 1, None), (sid + 1, 1, seq + 1, None)]
        exits.append(sid)
        seq, sid = seq + 2, sid + 2
    spans.insert(0, (0, 0, 0, seq, None, 0, "M", "forward", 1, 10_000))
    back = seq + 1
    spans.append((0, 0, back, back + 2 * n + 1, None, 0, "M", "backward", 1, 1))
    free_at = {}
    for j, i in enumerate(reversed(range(n))):
        s = back + 1 + 2 * j
        spans.append((0, 0, s, s + 1, back, 1, f"M.b{i}", "backward", i + 2, 1))
        free_at[exits[i]] = s + 1
    rows = [(a, b, c, free_at.get(a)) for a, b, c, _ in storages]
    cols = ["rank", "step", "span_id", "exit_seq", "parent_span_id", "depth", "fqn", "phase", "call_id", "duration_ns"]
    return (pl.DataFrame(spans, schema=cols, orient="row"),
            pl.DataFrame(rows, schema={"sid": pl.Int64, "nbytes": pl.Int64, "alloc_seq": pl.Int64,
                                       "free_seq": pl.Int64}, orient="row"))


def test_budget_greedy_beyond_the_exact_limit() -> None:
    n = EXACT_CANDIDATES + 4
    spans, storages = _chain(n)
    returns = pl.DataFrame({"call_id": [i + 2 for i in range(n)], "sid": [2 * i + 1 for i in range(n)]})
    m = step_model(storages, spans, returns, rank=0, step=0, first_seq=0, device="cpu")
    assert m.peak_bytes == 11 * n
    assert len(budget_candidates([m])) == n + 1  # the blocks and M itself
    cost = {f"M.b{i}": 100 + i for i in range(n)} | {"M": 10_000}
    budget = 11 * n - 35
    search, chosen, _, _ = cheapest([m], budget, cost)
    assert search == "greedy" and chosen is not None
    assert predicted_peak([m], chosen) <= budget
    # Every chosen block earns its place: without any one of them the budget no longer holds.
    assert all(predicted_peak([m], chosen - {f}) > budget for f in chosen)
    assert "M" not in chosen  # M would fit too, at 100x the recompute time
