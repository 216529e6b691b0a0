"""modtrace.analysis.diff on synthetic spans frames with exact durations.

``synth`` lays out a module tree's calls step by step, as the recorder and
the span rebuild would produce them: each span's self time is given, its
duration is its self time plus its children's.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modtrace.analysis.diff import DiffOptions, calls_of_spans, diff_spans
from modtrace.analysis.diff.samples import (
    compared_calls,
    compared_samples,
    fill_steps,
    module_keys,
    module_lookup,
    step_units,
    with_mkey,
)
from modtrace.analysis.diff.stats import (
    min_p_value,
    normal_quantile,
    sort_within,
    two_sample_p,
    two_sample_stats,
)
from modtrace.analysis.diff.structure import collapse_subtrees
from modtrace.analysis.events import PHASE_ENUM, STATUS_ENUM
from modtrace.analysis.spans import SPAN_COLUMNS

# fqn -> children, in call order
TREE: dict[str, list[str]] = {
    "Net": ["Net.embed", "Net.block0", "Net.block1", "Net.head"],
    "Net.embed": [],
    "Net.block0": ["Net.block0.attn", "Net.block0.mlp"],
    "Net.block0.attn": [],
    "Net.block0.mlp": [],
    "Net.block1": ["Net.block1.attn", "Net.block1.mlp"],
    "Net.block1.attn": [],
    "Net.block1.mlp": [],
    "Net.head": [],
}
# self time of every call, in microseconds
SELF_US: dict[str, float] = {
    "Net": 50, "Net.embed": 100, "Net.block0": 40, "Net.block0.attn": 300, "Net.block0.mlp": 400,
    "Net.block1": 40, "Net.block1.attn": 300, "Net.block1.mlp": 400, "Net.head": 200,
}

SelfFn = Callable[[str, str, int], float]  # (fqn, phase, step) -> self microseconds


def synth(
    steps: int = 20,
    self_us: SelfFn | None = None,
    *,
    tree: dict[str, list[str]] | None = None,
    phases: tuple[str, ...] = ("forward", "backward"),
    noise: float = 0.03,
    seed: int = 0,
    rank: int = 0,
    device: Callable[[str], str | None] = lambda fqn: "cpu",
    stream: Callable[[str], int | None] = lambda fqn: None,
    calls: Callable[[str, str], int] = lambda fqn, phase: 1,
) -> pl.DataFrame:
    """A spans frame (``SPAN_COLUMNS``) of ``steps`` steps of the module tree."""
    tree = tree or TREE
    rng = random.Random(seed)
    fn = self_us or (lambda fqn, phase, step: SELF_US[fqn])
    rows: list[dict[str, object]] = []
    devices: dict[str | None, int] = {}
    seq = [0]
    clock = [0]

    def call(fqn: str, phase: str, step: int, depth: int, parent: int | None) -> int:
        span_id = seq[0]
        seq[0] += 2
        start = clock[0]
        own = int(fn(fqn, phase, step) * 1000 * (1 + rng.uniform(-noise, noise)))
        clock[0] += own
        children = tree[fqn] if phase == "forward" else list(reversed(tree[fqn]))
        for child in children:
            for _ in range(calls(child, phase)):
                call(child, phase, step, depth + 1, span_id)
        end = clock[0]
        rows.append({
            "run_id": 1, "rank": rank, "span_id": span_id, "parent_span_id": parent, "depth": depth,
            "module_id": list(TREE).index(fqn), "fqn": fqn, "module_type": "M", "phase": phase,
            "call_id": span_id, "step": step, "thread_id": 0, "graph_task": None if phase == "forward" else step,
            "start_ns": start, "end_ns": end, "duration_ns": end - start, "self_ns": own,
            "device_id": devices.setdefault(device(fqn), len(devices)), "device": device(fqn), "stream": stream(fqn),
            "status": "ok", "exit_seq": span_id + 1,
        })
        return end - start

    root = next(iter(tree))
    for step in range(steps):
        for phase in phases:
            call(root, phase, step, 0, None)
    schema = {
        "run_id": pl.Int32, "rank": pl.Int32, "span_id": pl.Int64, "parent_span_id": pl.Int64, "depth": pl.Int32,
        "module_id": pl.Int32, "fqn": pl.Categorical, "module_type": pl.Categorical, "phase": PHASE_ENUM,
        "call_id": pl.Int64, "step": pl.Int32, "thread_id": pl.Int32, "graph_task": pl.Int64,
        "start_ns": pl.Int64, "end_ns": pl.Int64, "duration_ns": pl.Int64, "self_ns": pl.Int64,
        "device_id": pl.Int32, "device": pl.Categorical, "stream": pl.Int64, "status": STATUS_ENUM,
        "exit_seq": pl.Int64,
    }
    return pl.DataFrame(rows, schema=schema).sort("span_id").select(SPAN_COLUMNS)


def slower(fqn: str, factor: float, phase: str | None = None) -> SelfFn:
    def fn(name: str, ph: str, step: int) -> float:
        base = SELF_US[name]
        return base * factor if name == fqn and (phase is None or ph == phase) else base

    return fn


def verdicts(result) -> dict[tuple[str, str], str]:  # type: ignore[no-untyped-def]
    return {(f, p): v for f, p, v in result.timing.select("fqn", "phase", "verdict").iter_rows()}


def flagged(result, verdict: str = "regression") -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    return sorted(k for k, v in verdicts(result).items() if v == verdict)


# -- A/A and blame ----------------------------------------------------------------


def test_identical_runs_have_no_findings() -> None:
    spans = synth(seed=1)
    result = diff_spans(spans, spans)
    assert flagged(result) == [] and flagged(result, "improvement") == []
    assert result.structure.height == 0
    assert result.divergence is None
    assert result.timing["self_delta_ns"].abs().max() == 0
    assert set(result.timing["self_p_value"].to_list()) == {1.0}
    assert result.summary.step_ratio == 1.0


def test_same_configuration_with_independent_noise_is_not_a_regression() -> None:
    for seed in range(5):
        result = diff_spans(synth(seed=seed), synth(seed=100 + seed))
        assert flagged(result) == [], seed
        assert flagged(result, "improvement") == [], seed


def test_blame_goes_to_the_module_whose_self_time_grew_not_its_ancestors() -> None:
    base = synth(seed=1)
    cand = synth(self_us=slower("Net.block1.mlp", 2.0), seed=2)
    result = diff_spans(base, cand)
    assert flagged(result) == [("Net.block1.mlp", "backward"), ("Net.block1.mlp", "forward")]
    v = verdicts(result)
    # Ancestors got slower inclusively only: context.
    for ancestor in ("Net", "Net.block1"):
        assert v[(ancestor, "forward")] == "inherited"
        assert v[(ancestor, "backward")] == "inherited"
    # Siblings and the other block are untouched.
    for other in ("Net.block1.attn", "Net.block0.mlp", "Net.block0.attn", "Net.embed", "Net.head", "Net.block0"):
        assert v[(other, "forward")] == "unchanged", other
    row = result.timing.row(0, named=True)
    assert row["verdict"] == "regression"
    assert row["self_base_ns"] == pytest.approx(400_000, rel=0.03)
    assert row["self_cand_ns"] == pytest.approx(800_000, rel=0.03)
    assert row["self_ratio"] == pytest.approx(2.0, rel=0.05)
    assert row["self_vs_typical"] == pytest.approx(2.0, rel=0.05)
    assert row["self_p_value"] < 1e-6
    assert row["self_ci_low_ns"] < row["self_delta_ns"] < row["self_ci_high_ns"]
    assert row["self_ci_low_ns"] > 0
    assert row["impact_ns"] == row["self_delta_ns"]


def test_a_machine_wide_slowdown_blames_nobody_but_is_reported() -> None:
    # Everything 1.6x slower (a busier machine): absolute times all grew, shares did not move.
    def busy(name: str, phase: str, step: int) -> float:
        return SELF_US[name] * 1.6

    result = diff_spans(synth(seed=1), synth(self_us=busy, seed=2))
    assert flagged(result) == [] and flagged(result, "improvement") == [] and flagged(result, "inherited") == []
    # the step's own checks pass, but one base run cannot tell a busier machine: unknown, not failed
    assert [c.name for c in result.step.checks if not c.passed] == ["history_runs"]
    assert result.step.verdict == "unknown" and result.step.p_value is not None and result.step.p_value < 1e-6
    row = result.timing.filter(pl.col("fqn") == "Net.head").row(0, named=True)
    assert row["self_ratio"] == pytest.approx(1.6, rel=0.05)
    assert row["self_vs_rest"] == pytest.approx(1.0, abs=0.06)
    assert row["self_share_base"] == pytest.approx(row["self_share_cand"], rel=0.06)
    # ... and so does a machine that got quieter
    assert flagged(diff_spans(synth(self_us=busy, seed=1), synth(seed=2)), "improvement") == []
    # Judged on absolute times only, every module is slower.
    absolute = diff_spans(synth(seed=1), synth(self_us=busy, seed=2), DiffOptions(absolute=True))
    assert len(flagged(absolute)) == len(SELF_US) * 2


def test_a_real_regression_under_a_machine_wide_slowdown_is_blamed_alone() -> None:
    def busy_and_slow(name: str, phase: str, step: int) -> float:
        return SELF_US[name] * 1.6 * (2.0 if name == "Net.block0.attn" else 1.0)

    result = diff_spans(synth(seed=1), synth(self_us=busy_and_slow, seed=2))
    assert flagged(result) == [("Net.block0.attn", "backward"), ("Net.block0.attn", "forward")]
    row = result.timing.row(0, named=True)
    assert row["self_vs_typical"] == pytest.approx(2.0, rel=0.1)
    assert row["self_share_p_adjusted"] < 0.01 and row["self_share_delta"] > 0
    v = verdicts(result)
    # its ancestors are context; the modules that only scaled with the machine are unchanged
    assert v[("Net.block0", "forward")] == v[("Net", "forward")] == "inherited"
    assert v[("Net.block1.attn", "forward")] == v[("Net.head", "backward")] == "unchanged"


def test_a_small_share_change_is_not_blame() -> None:
    # block0.attn +25% while the machine is 1.2x busier *except* for it: its absolute time grows 25%,
    # but relative to the rest of the step (1.2x) only ~4%: under the threshold.
    def fn(name: str, phase: str, step: int) -> float:
        return SELF_US[name] * (1.25 if name == "Net.block0.attn" else 1.2)

    result = diff_spans(synth(seed=1, noise=0.01), synth(self_us=fn, seed=2, noise=0.01))
    row = result.timing.filter((pl.col("fqn") == "Net.block0.attn") & (pl.col("phase") == "forward")).row(0, named=True)
    assert row["self_ratio"] > 1.2 and row["self_p_adjusted"] < 0.01
    assert row["self_vs_rest"] == pytest.approx(1.25 / 1.2, rel=0.02)
    assert row["verdict"] == "unchanged"


def test_one_big_regression_on_a_quieter_machine_blames_it_alone() -> None:
    # The candidate ran on a quieter machine (everything 0.85x) and one module got 20x slower:
    # every other module is faster and takes a smaller share of the (longer) step, yet none
    # changed against the typical module.
    def fn(name: str, phase: str, step: int) -> float:
        return SELF_US[name] * 0.85 * (20.0 if name == "Net.head" else 1.0)

    result = diff_spans(synth(seed=1), synth(self_us=fn, seed=2))
    assert flagged(result) == [("Net.head", "backward"), ("Net.head", "forward")]
    assert flagged(result, "improvement") == []
    row = result.timing.row(0, named=True)
    assert row["self_vs_typical"] > 5 and row["self_noise_p_adjusted"] < 1e-6
    assert result.timing.filter(pl.col("fqn") == "Net.embed")["self_vs_typical"].to_list() == pytest.approx(
        [1.0, 1.0], abs=0.06)


def test_a_module_is_blamed_when_slower_than_the_typical_module_by_the_share_threshold() -> None:
    """Each recording slows or speeds each module a little on its own (a shared machine): a
    module is blamed when it got slower than the typical module by more than
    ``share_threshold`` (default 50%), so 1.3x is not blame and 2x is."""
    def recording(spread: float, seed: int, slow: float) -> SelfFn:
        rng = random.Random(seed)
        factor = {(f, p): math.exp(rng.gauss(0, spread)) for f in SELF_US for p in ("forward", "backward")}

        def fn(name: str, phase: str, step: int) -> float:
            return SELF_US[name] * factor[(name, phase)] * (slow if name == "Net.block0.attn" else 1.0)

        return fn

    base = synth(self_us=recording(0.05, 1, 1.0), seed=1)
    small = diff_spans(base, synth(self_us=recording(0.05, 2, 1.3), seed=2))
    assert flagged(small) == [] and flagged(small, "improvement") == []
    row = small.timing.filter((pl.col("fqn") == "Net.block0.attn") & (pl.col("phase") == "forward")).row(0, named=True)
    assert row["self_p_adjusted"] < 0.01  # real within the runs, yet not 50% beyond the typical module
    assert ("Net.block0.attn", "forward") in flagged(diff_spans(base, synth(self_us=recording(0.05, 2, 1.3), seed=2),
                                                                DiffOptions(share_threshold=0.2)))
    assert ("Net.block0.attn", "forward") in flagged(diff_spans(base, synth(self_us=recording(0.05, 2, 2.0), seed=2)))


def test_preempted_steps_do_not_blame_the_module_they_land_in() -> None:
    """A busy machine preempts the process for milliseconds in whichever module runs; in a
    majority of the steps landing in one module moves its median, not its low quantile."""
    def preempted(name: str, phase: str, step: int) -> float:
        return SELF_US[name] + (3000.0 if name == "Net.block1.attn" and phase == "forward" and step % 5 < 3 else 0.0)

    base = synth(seed=11)
    result = diff_spans(base, synth(self_us=preempted, seed=12, steps=21))
    row = result.timing.filter((pl.col("fqn") == "Net.block1.attn") & (pl.col("phase") == "forward")).row(0, named=True)
    assert row["self_ratio"] > 4  # the median step moved ...
    assert flagged(result) == []  # ... by the machine's time, not the module's
    # with the median as the level (quantile 0.5) it would be blamed
    assert ("Net.block1.attn", "forward") in flagged(
        diff_spans(base, synth(self_us=preempted, seed=12, steps=21), DiffOptions(low_quantile=0.5)))


def test_a_zero_mad_does_not_put_every_deviation_beyond_noise() -> None:
    """Most modules at exactly the typical ratio (a median absolute deviation of 0) leave the
    noise to be judged from the others' spread: a module that moves like its noisy neighbours
    is not beyond noise, one far out of their spread is."""
    from modtrace.analysis.diff.verdicts import _noise_p

    def noise_p(vs_rest: list[float]) -> list[float]:
        frame = pl.DataFrame({"self_vs_rest": vs_rest})
        return _noise_p(frame, "self").to_list()

    within = noise_p([1.0] * 6 + [1.15, 0.87, 1.14, 0.88])
    assert within[:6] == [1.0] * 6
    assert min(within[6:]) >= 0.01  # as far off as the others that moved: noise
    outlier = noise_p([1.0] * 6 + [1.02, 0.98, 1.01, 3.0])
    assert outlier[-1] < 0.01 and min(outlier[6:9]) >= 0.01


def test_regressions_are_sorted_by_impact_and_improvements_reported() -> None:
    def fn(name: str, phase: str, step: int) -> float:
        factor = {"Net.block0.attn": 1.6, "Net.head": 2.0, "Net.embed": 0.5}.get(name, 1.0)
        return SELF_US[name] * factor

    result = diff_spans(synth(seed=3), synth(self_us=fn, seed=4, phases=("forward",)), DiffOptions(phases=("forward",)))
    regressions = result.timing.filter(pl.col("verdict") == "regression")
    # head: +200 us per step, block0.attn: +180 us per step
    assert regressions["fqn"].to_list() == ["Net.head", "Net.block0.attn"]
    assert flagged(result, "improvement") == [("Net.embed", "forward")]
    assert result.summary.regressions == 2 and result.summary.improvements == 1


def test_threshold_and_min_delta_gate_a_real_but_small_change() -> None:
    base = synth(seed=5, noise=0.01)
    # 8% slower (+32 us): real (p tiny) but under the 10% threshold, and under the 50% against
    # the typical module.
    five = diff_spans(base, synth(self_us=slower("Net.block0.mlp", 1.08), seed=6, noise=0.01))
    row = five.timing.filter((pl.col("fqn") == "Net.block0.mlp") & (pl.col("phase") == "forward")).row(0, named=True)
    assert row["self_p_value"] < 0.01 and row["verdict"] == "unchanged"
    assert ("Net.block0.mlp", "forward") in flagged(
        diff_spans(base, synth(self_us=slower("Net.block0.mlp", 1.08), seed=6, noise=0.01),
                   DiffOptions(threshold=0.05, share_threshold=0.05))
    )
    # Twice as slow but only +15 us per step: under the 20 us minimum.
    tiny = {**SELF_US}

    def small(name: str, phase: str, step: int) -> float:
        return 15.0 if name == "Net.embed" else tiny[name]

    def doubled(name: str, phase: str, step: int) -> float:
        return 30.0 if name == "Net.embed" else tiny[name]

    result = diff_spans(synth(self_us=small, seed=7), synth(self_us=doubled, seed=8))
    assert verdicts(result)[("Net.embed", "forward")] == "unchanged"
    assert ("Net.embed", "forward") in flagged(
        diff_spans(synth(self_us=small, seed=7), synth(self_us=doubled, seed=8), DiffOptions(min_delta_ns=10_000))
    )


def test_a_median_shift_from_a_few_outliers_is_not_significant() -> None:
    base = synth(seed=9)

    def spiky(name: str, phase: str, step: int) -> float:
        # 3 slow steps out of 20 do not move the median, and the test disagrees with a shift.
        return SELF_US[name] * (4.0 if name == "Net.head" and step in (3, 9, 15) else 1.0)

    result = diff_spans(base, synth(self_us=spiky, seed=10))
    assert verdicts(result)[("Net.head", "forward")] == "unchanged"


def test_too_few_steps_cannot_be_significant_and_says_so() -> None:
    result = diff_spans(synth(steps=4, seed=1), synth(steps=4, self_us=slower("Net.head", 3.0), seed=2))
    assert flagged(result) == []
    assert result.summary.min_p_value >= 0.01
    assert min_p_value(3, 3) == pytest.approx(0.0809, abs=1e-3)
    assert min_p_value(29, 29) < 1e-9
    # the check that stopped it says so, and the fewest steps that can pass is the true minimum
    row = result.timing.filter(pl.col("fqn") == "Net.head").row(0, named=True)
    assert [c["name"] for c in row["checks"] if not c["passed"]] == ["steps"]
    assert result.summary.min_steps == 6  # 6 compared steps per run: 7 recorded at --skip-steps 1
    assert min_p_value(6, 6) < 0.01 <= min_p_value(5, 5)
    six = diff_spans(synth(steps=7, seed=1), synth(steps=7, self_us=slower("Net.head", 3.0), seed=2))
    assert set(flagged(six)) == {("Net.head", "forward"), ("Net.head", "backward")}


def test_only_a_module_with_a_compared_descendant_is_inherited() -> None:
    """A leaf's inclusive time is its self time: it is blamed or unchanged, never context."""
    leaves = {f for f, children in TREE.items() if not children}
    for seed, who, factor in ((3, "Net.block1.mlp", 1.12), (5, "Net.head", 1.3), (7, "Net.block0.attn", 0.8)):
        result = diff_spans(synth(seed=seed), synth(seed=seed + 1, self_us=slower(who, factor)))
        inherited = set(result.timing.filter(pl.col("verdict") == "inherited")["fqn"].to_list())
        assert not inherited & leaves, inherited
    # a slower leaf makes its ancestors inherited context, itself the regression
    result = diff_spans(synth(seed=1), synth(seed=2, self_us=slower("Net.block1.mlp", 2.0)))
    assert set(flagged(result)) == {("Net.block1.mlp", "forward"), ("Net.block1.mlp", "backward")}
    assert {"Net.block1", "Net"} >= set(result.timing.filter(pl.col("verdict") == "inherited")["fqn"].to_list())


# -- samples ------------------------------------------------------------------------


def named(spans: pl.DataFrame, skip_steps: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Compared calls of a spans frame with their module keys, and the key names (fqn, mkey)."""
    run = calls_of_spans(spans)
    lookup = module_lookup(run)
    names = module_keys(lookup)
    return with_mkey(compared_calls(run.calls, skip_steps), lookup, names), names


def by_name(samples: pl.DataFrame, names: pl.DataFrame) -> pl.DataFrame:
    return samples.with_columns(
        pl.lit(names["fqn"]).gather(pl.col("key") // 4).alias("fqn"),
        pl.lit(pl.Series(["forward", "backward", "recompute"])).gather(pl.col("key") % 4).alias("phase"),
    )


def test_samples_skip_the_first_steps_of_each_rank_and_sum_calls() -> None:
    spans = pl.concat([
        synth(steps=4, rank=0, calls=lambda fqn, phase: 2 if fqn == "Net.head" else 1),
        synth(steps=4, rank=1).with_columns(pl.col("step") + 10),
    ])
    compared, names = named(spans, 1)
    samples = by_name(compared_samples(compared), names)
    assert samples.select("rank", "step").unique().sort("rank", "step").rows() == [
        (0, 1), (0, 2), (0, 3), (1, 11), (1, 12), (1, 13),
    ]
    head = samples.filter((pl.col("fqn") == "Net.head") & (pl.col("phase") == "forward") & (pl.col("rank") == 0))
    assert head["calls"].to_list() == [2, 2, 2]
    assert head["self_ns"].to_list() == pytest.approx([400_000] * 3, rel=0.04)
    backward = by_name(compared_samples(named(spans, 0)[0], phases=("backward",)), names)
    assert backward["phase"].unique().to_list() == ["backward"]
    units = step_units(named(spans, 3)[0])
    assert units.select("rank", "step").rows() == [(0, 3), (1, 13)]
    # time in root spans: forward and backward of Net, every phase
    net = spans.filter((pl.col("depth") == 0) & (pl.col("rank") == 0) & (pl.col("step") == 3))["duration_ns"].sum()
    assert units["step_ns"][0] == net


def test_fill_steps_counts_a_missing_call_as_zero_and_computes_shares() -> None:
    spans = synth(steps=6, calls=lambda fqn, phase: 1)
    spans = spans.filter(~((pl.col("fqn") == "Net.head") & (pl.col("step") % 2 == 1)))
    compared, names = named(spans, 0)
    units = step_units(compared)
    filled = by_name(fill_steps(compared_samples(compared), units), names)
    head = filled.filter((pl.col("fqn") == "Net.head") & (pl.col("phase") == "forward")).sort("step")
    assert head["calls"].to_list() == [1, 0, 1, 0, 1, 0]
    assert head["self_ns"].to_list()[1::2] == [0, 0, 0]
    assert head["self_share"].to_list()[1::2] == [0, 0, 0]
    # the denominator: the step's time in module calls = time in root spans
    step0 = units.filter(pl.col("step") == 0)["step_ns"][0]
    assert spans.filter(pl.col("step") == 0)["self_ns"].sum() == step0
    assert head["self_share"][0] == round(head["self_ns"][0] * 1e9 / step0)
    assert head["incl_share"][0] == round(head["incl_ns"][0] * 1e9 / step0)
    # every (module, phase) has one sample per step; the roots' inclusive shares add up to the whole
    # step (in the steps left whole: the odd ones lost their head calls but not their time)
    assert set(filled.group_by("key").len()["len"].to_list()) == {6}
    roots = filled.filter((pl.col("fqn") == "Net") & (pl.col("step") % 2 == 0)).group_by("step").agg(pl.col("incl_share").sum())
    assert roots["incl_share"].to_list() == pytest.approx([1e9] * 3, abs=2)


def test_sort_within_sorts_by_key_then_value_packed_or_not() -> None:
    key = pl.Series([2, 0, 1, 0, 2, 1, 0])
    value = pl.Series([5, 9, 0, 3, 1, 7, 3])
    expected = sorted(zip(key.to_list(), value.to_list(), strict=True))
    assert list(sort_within(key, value).iter_rows()) == expected
    # values too wide to pack with the key: the two-sort path gives the same order
    wide = value * (1 << 59)
    assert list(sort_within(key, wide).iter_rows()) == [(k, v * (1 << 59)) for k, v in expected]


# -- statistics ----------------------------------------------------------------------


def reference_mann_whitney(x: list[float], y: list[float]) -> tuple[float, float]:
    """Textbook U of y and its two-sided p (normal approximation, tie and continuity correction)."""
    u = sum(1.0 if b > a else 0.5 if b == a else 0.0 for a in x for b in y)
    n0, n1 = len(x), len(y)
    n = n0 + n1
    counts: dict[float, int] = {}
    for v in x + y:
        counts[v] = counts.get(v, 0) + 1
    tie = sum(t**3 - t for t in counts.values())
    var = n0 * n1 / 12 * ((n + 1) - tie / (n * (n - 1)))
    if var <= 0:
        return u, 1.0
    z = max(abs(u - n0 * n1 / 2) - 0.5, 0) / math.sqrt(var)
    return u, math.erfc(z / math.sqrt(2))


def blocks(values: list[list[int]]) -> pl.DataFrame:
    """Equal blocks of samples, one per key ``k``, as ``two_sample_stats`` reads them."""
    return pl.DataFrame({"k": [k for k, vs in enumerate(values) for _ in vs], "v": [v for vs in values for v in vs]})


def test_mann_whitney_known_values() -> None:
    b, c = blocks([[1, 2, 3], [5, 5, 5]]), blocks([[4, 5, 6], [5, 5, 5]])
    out = {k: (u, p) for k, u, p in two_sample_stats(b, c, "v", 2, 3, 3, 0.99, 2.5758).select("k", "u", "p_value").iter_rows()}
    assert out[0][0] == 9.0
    assert out[0][1] == pytest.approx(0.0809, abs=1e-4)
    assert out[1] == (4.5, 1.0)  # all tied
    assert two_sample_p(b["v"].head(3), c["v"].head(3)) == out[0][1]
    # negative values (a self time can be) rank the same as shifted ones
    shift = pl.col("v") - 100
    shifted = two_sample_stats(b.with_columns(shift), c.with_columns(shift), "v", 2, 3, 3, 0.99, 2.5758)
    assert {k: (u, p) for k, u, p in shifted.select("k", "u", "p_value").iter_rows()} == out


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(1, 9), st.integers(1, 9), st.integers(0, 2**40), st.randoms(use_true_random=False))
def test_the_packed_metric_matches_the_general_statistics(
    keys: int, n_b: int, n_c: int, spread: int, rnd: random.Random
) -> None:
    """compare_timing's one-sort statistics (equal blocks) = the general rank sums and medians."""
    from modtrace.analysis.diff.stats import _two_sample_stats_grouped

    def side(n: int) -> pl.DataFrame:
        return pl.DataFrame({
            "k": [k for k in range(keys) for _ in range(n)],
            "v": [rnd.choice([0, 7, spread, rnd.randint(-5, spread)]) for _ in range(keys * n)],
        }).sample(fraction=1.0, shuffle=True, seed=rnd.randint(0, 99))

    b, c = side(n_b), side(n_c)
    z = 2.5758
    fast = two_sample_stats(b, c, "v", keys, n_b, n_c, 0.99, z).sort("k")
    v = pl.concat([b["v"], c["v"]])
    side01 = pl.Series([0] * b.height + [1] * c.height)
    slow = _two_sample_stats_grouped(pl.concat([b["k"], c["k"]]), side01, v, keys, n_b, n_c, 0.99, z).sort("k")
    assert fast.columns == slow.columns
    for column in fast.columns:
        assert fast[column].to_list() == pytest.approx(slow[column].to_list(), rel=1e-12, abs=1e-9), column
    for k in range(keys):
        xb, xc = b.filter(pl.col("k") == k)["v"], c.filter(pl.col("k") == k)["v"]
        assert fast["p_value"][k] == pytest.approx(two_sample_p(xb, xc), abs=1e-12)
        assert fast["b_median"][k] == xb.median() and fast["c_median"][k] == xc.median()


def test_median_and_its_standard_error_from_order_statistics() -> None:
    z = normal_quantile(0.995)
    samples = blocks([[5, 1, 9, 3, 7, 2, 8, 4, 6], [10] * 9])
    out = two_sample_stats(samples, samples, "v", 2, 9, 9, 0.99, z).sort("k")
    # n = 9: c = round(5 - z * 3 / 2) = 1, so the interval spans the extremes.
    assert out.select("b_median", "b_se").rows() == [(5.0, pytest.approx((9 - 1) / (2 * z))), (10.0, 0.0)]
    big = blocks([list(range(100, 0, -1))])
    ((m, se),) = two_sample_stats(big, big, "v", 1, 100, 100, 0.99, z).select("b_median", "b_se").rows()
    c = round(101 / 2 - z * 10 / 2)  # 38: x[63] - x[38] of 1..100
    assert (m, se) == (50.5, pytest.approx((100 - c + 1 - c) / (2 * z)))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.lists(st.integers(-3, 6), min_size=1, max_size=12), min_size=1, max_size=3),
    st.lists(st.lists(st.integers(-3, 6), min_size=1, max_size=12), min_size=3, max_size=3),
)
def test_mann_whitney_matches_the_textbook_formula(xs: list[list[int]], ys: list[list[int]]) -> None:
    for x, y in zip(xs, ys, strict=False):
        _, ref_p = reference_mann_whitney([float(v) for v in x], [float(v) for v in y])
        assert two_sample_p(pl.Series(x), pl.Series(y)) == pytest.approx(ref_p, abs=1e-12)
        if len(x) == len(y):  # equal blocks: U and p of the one-sort path too
            ref_u, _ = reference_mann_whitney([float(v) for v in x], [float(v) for v in y])
            ((u, p),) = two_sample_stats(blocks([x]), blocks([y]), "v", 1, len(x), len(y), 0.99, 2.5758).select("u", "p_value").rows()
            assert (u, p) == (pytest.approx(ref_u), pytest.approx(ref_p, abs=1e-12))


# -- structure ------------------------------------------------------------------------


def kinds(result) -> list[tuple[str, str | None, str | None, str, str]]:  # type: ignore[no-untyped-def]
    return result.structure.select("kind", "fqn", "phase", "base", "cand").rows()


def test_removed_subtree_is_one_finding_and_order_shows_where() -> None:
    small = {k: [c for c in v if c != "Net.block1"] for k, v in TREE.items() if not k.startswith("Net.block1")}
    result = diff_spans(synth(seed=1), synth(tree=small, seed=1))
    assert kinds(result) == [
        ("module_removed", "Net.block1", None, "called", "not called"),
        ("order_changed", None, None, "step 1", "step 1"),
    ]
    assert "Net.block1 (and 2 submodules) is not called" in result.structure["message"][0]
    d = result.divergence
    assert d is not None and (d.step_base, d.position) == (1, 6)
    assert d.excerpt.rows() == [
        ("=", 3, 3, "forward     Net.block0", "forward     Net.block0"),
        ("=", 4, 4, "forward       Net.block0.attn", "forward       Net.block0.attn"),
        ("=", 5, 5, "forward       Net.block0.mlp", "forward       Net.block0.mlp"),
        ("-", 6, None, "forward     Net.block1", None),
        ("-", 7, None, "forward       Net.block1.attn", None),
        ("-", 8, None, "forward       Net.block1.mlp", None),
        ("=", 9, 6, "forward     Net.head", "forward     Net.head"),
        ("=", 10, 7, "backward  Net", "backward  Net"),
        ("=", 11, 8, "backward    Net.head", "backward    Net.head"),
    ]
    # Timing still compares what both runs share.
    assert ("Net.block1.mlp", "forward") not in verdicts(result)
    assert ("Net.block0.mlp", "forward") in verdicts(result)


def test_recompute_that_appeared_is_a_phase_change() -> None:
    base = synth(seed=1)
    recompute = synth(tree={"Net.block0": TREE["Net.block0"], "Net.block0.attn": [], "Net.block0.mlp": []},
                      phases=("recompute",), seed=2).with_columns(pl.col("span_id") + 1_000_000)
    result = diff_spans(base, pl.concat([synth(seed=1), recompute]))
    assert kinds(result)[0] == ("phase_added", "Net.block0", "recompute", "none", "1")
    assert "(and 2 submodules) has recompute calls in the candidate only" in result.structure["message"][0]
    assert [k[0] for k in kinds(result)] == ["phase_added", "order_changed"]
    # ... and back: the base has it, the candidate does not.
    assert kinds(diff_spans(pl.concat([synth(seed=1), recompute]), base))[0][0] == "phase_removed"


def test_call_count_device_and_stream_changes() -> None:
    base = synth(seed=1, device=lambda f: "cuda:0", stream=lambda f: 7)
    cand = synth(
        seed=1,
        calls=lambda fqn, phase: 2 if fqn == "Net.head" else 1,
        device=lambda f: "cuda:1" if f == "Net.embed" else "cuda:0",
        stream=lambda f: 9 if f == "Net.block0.mlp" else 7,
    )
    found = kinds(diff_spans(base, cand))
    assert ("calls_changed", "Net.head", "forward", "1", "2") in found
    assert ("calls_changed", "Net.head", "backward", "1", "2") in found
    assert ("device_changed", "Net.embed", None, "cuda:0", "cuda:1") in found
    assert ("stream_changed", "Net.block0.mlp", None, "7", "9") in found
    assert found[-1][0] == "order_changed"


def test_phase_filter_limits_every_finding() -> None:
    cand = synth(self_us=slower("Net.head", 2.0, phase="backward"), seed=2,
                 calls=lambda fqn, phase: 2 if (fqn, phase) == ("Net.embed", "backward") else 1)
    both = diff_spans(synth(seed=1), cand)
    # Two calls per step instead of one is also twice the time per step.
    assert flagged(both) == [("Net.embed", "backward"), ("Net.head", "backward")]
    assert [k[0] for k in kinds(both)] == ["calls_changed", "order_changed"]
    forward = diff_spans(synth(seed=1), cand, DiffOptions(phases=("forward",)))
    assert flagged(forward) == [] and forward.structure.height == 0
    assert set(forward.timing["phase"].to_list()) == {"forward"}


def test_a_module_missing_from_the_lookup_is_named_by_its_id() -> None:
    from modtrace.analysis.diff import RunCalls, diff_history

    base, cand = calls_of_spans(synth(seed=1)), calls_of_spans(synth(seed=2))
    head = list(TREE).index("Net.head")
    lost = RunCalls(cand.calls, cand.modules.filter(pl.col("module_id") != head), cand.devices)
    result = diff_history([base], lost)
    assert kinds(result)[:2] == [
        ("module_removed", "Net.head", None, "called", "not called"),
        ("module_added", f"<module {head}>", None, "not called", "called"),
    ]


def test_collapse_subtrees() -> None:
    assert collapse_subtrees({"a.b", "a.b.c", "a.b.c.d", "a.bc", "x"}) == [("a.b", 2), ("a.bc", 0), ("x", 0)]


# -- data-dependent calls, and a history of base runs -----------------------------------


def routed(seed: int, choices: tuple[int, ...]) -> Callable[[str, str], int]:
    """Calls of Net.head drawn per call from ``choices`` (a router's data-dependent choice)."""
    rng = random.Random(seed)
    return lambda fqn, phase: rng.choice(choices) if fqn == "Net.head" else 1


def test_data_dependent_calls_are_compared_as_ranges() -> None:
    base = synth(seed=1, calls=routed(1, (1, 2, 3)))
    same = synth(seed=2, calls=routed(2, (1, 2, 3)))
    result = diff_spans(base, same)
    assert result.structure.height == 0 and result.divergence is None
    assert result.summary.order_varies is True
    rows = {(r["fqn"], r["phase"]): r for r in result.calls.iter_rows(named=True)}
    head = rows[("Net.head", "forward")]
    assert (head["base_min"], head["base_max"], head["changed"]) == (1.0, 3.0, False)
    more = synth(seed=3, calls=routed(3, (5, 6)))
    found = kinds(diff_spans(base, more))
    changed = [k for k in found if k[:3] == ("calls_changed", "Net.head", "forward")]
    assert len(changed) == 1 and changed[0][3] == "1-3 (median 2)" and changed[0][4].startswith("5-6 (median ")
    assert all(k[0] != "order_changed" for k in found)


def scaled(load: float, fqn: str | None = None, factor: float = 1.0) -> SelfFn:
    """Every module ``load`` times slower (a busier machine), ``fqn`` ``factor`` times more."""
    return lambda name, phase, step: SELF_US[name] * load * (factor if name == fqn else 1.0)


HISTORY_LOADS = (1.0, 1.1, 0.95, 1.05)


def history(noise: float = 0.03) -> list:  # type: ignore[type-arg]
    return [calls_of_spans(synth(self_us=scaled(load), seed=10 + i, noise=noise))
            for i, load in enumerate(HISTORY_LOADS)]


def test_a_history_tells_a_step_wide_slowdown_from_load() -> None:
    from modtrace.analysis.diff import diff_history

    bases = history()
    aa = diff_history(bases, calls_of_spans(synth(self_us=scaled(1.08), seed=20)))
    assert aa.step.verdict == "unchanged" and not aa.failed("regression")
    # the step's checks on raw step times (no probe: no confirming measure); no bar in µs of its own
    assert [c.name for c in aa.step.checks] == ["history_runs", "step_p", "beyond_history"]
    assert aa.summary.history_runs == 4 and aa.timing["verdict"].unique().to_list() == ["unchanged"]
    slow = calls_of_spans(synth(self_us=scaled(1.5), seed=21))
    found = diff_history(bases, slow)
    assert found.step.verdict == "regression" and found.failed("regression")
    # the range is the history's: 1.5 / 1.1 beyond every base run by more than 10%
    per_run = found.summary.history_run_step_ns
    assert max(per_run) / min(per_run) > 1.1
    assert all(c.passed for c in found.step.checks)
    # one base run cannot tell it from a busier machine, and does not fail
    assert not diff_history(bases[:1], slow).failed("regression")


def test_a_history_blames_one_slower_module_and_not_its_ancestors() -> None:
    from modtrace.analysis.diff import diff_history

    cand = calls_of_spans(synth(self_us=scaled(1.02, "Net.block1.mlp", 2.0), seed=22))
    result = diff_history(history(), cand)
    assert flagged(result) == [("Net.block1.mlp", "backward"), ("Net.block1.mlp", "forward")]
    assert verdicts(result)[("Net.block1", "forward")] == "inherited"


def test_a_history_of_one_run_is_a_two_run_diff() -> None:
    from modtrace.analysis.diff import diff_history

    base, cand = synth(seed=1), synth(seed=2, self_us=slower("Net.head", 2.0))
    one = diff_history([calls_of_spans(base)], calls_of_spans(cand))
    two = diff_spans(base, cand)
    assert one.timing.equals(two.timing) and one.summary == two.summary


def test_module_verdicts_are_typed_and_carry_their_checks() -> None:
    from modtrace.analysis.diff import Check, ModuleVerdict

    result = diff_spans(synth(seed=1), synth(seed=2, self_us=slower("Net.head", 2.0)))
    head = {v.phase: v for v in result.module("Net.head")}
    assert set(head) == {"forward", "backward"}
    for verdict in head.values():
        assert isinstance(verdict, ModuleVerdict) and verdict.verdict == "regression"
        assert all(isinstance(c, Check) and c.passed for c in verdict.checks)
        assert [c.name for c in verdict.checks] == ["steps", "level_delta_us", "share_ratio", "vs_typical",
                                                    "median_ratio"]
    embed = result.module("Net.embed", "forward")
    assert len(embed) == 1 and embed[0].verdict == "unchanged" and not all(c.passed for c in embed[0].checks)
    assert [v.fqn for v in result.modules()] == result.timing["fqn"].to_list()
    # --absolute judges p_holm and level_ratio instead of the shares'
    absolute = diff_spans(synth(seed=1), synth(seed=2, self_us=slower("Net.head", 2.0)), DiffOptions(absolute=True))
    assert [c.name for c in absolute.module("Net.head", "forward")[0].checks] == [
        "steps", "level_delta_us", "p_holm", "level_ratio"]
    # a check left out is neither judged nor shown
    fewer = diff_spans(synth(seed=1), synth(seed=2, self_us=slower("Net.head", 2.0)),
                       DiffOptions(skip_checks=frozenset({"median_ratio"})))
    assert "median_ratio" not in [c.name for c in fewer.module("Net.head", "forward")[0].checks]
