"""The step: the candidate's step time against the base runs', as checks (docs/diff.md, "The step").

``measure_step`` chooses the measure of the step, ``judge_step`` returns the ``StepVerdict`` whose
checks decide it; one base run fails ``history_runs``, so its verdict is ``unknown``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

import polars as pl

from modtrace.analysis.diff.frames import Check, DiffOptions, StepVerdict
from modtrace.analysis.diff.speed import (
    adjusted,
    at_shares,
    cpu_at_speed,
    cpu_per_step,
    lacking,
    reference_probe,
    unprobed,
)
from modtrace.analysis.diff.stats import two_sample_p
from modtrace.core.codes import ProbeWork

# A base run's ranks become i * RANK_STRIDE + rank in the pooled samples: every (run, rank, step) one sample.
RANK_STRIDE = 1 << 16
# The level of a step measured at speed is its median (a probe hit by an interrupt makes its step
# look fast, so a low quantile of those is the probe's noise); of raw steps, options.low_quantile.
AT_SPEED_QUANTILE = 0.5


def step_levels(units: pl.DataFrame, quantile: float) -> list[float]:
    """Step units of one or more runs (ranks offset by ``RANK_STRIDE``) -> each run's
    ``quantile`` of its step times, in run order."""
    levels = units.group_by(pl.col("rank") // RANK_STRIDE, maintain_order=True).agg(
        pl.col("step_ns").cast(pl.Float64).quantile(quantile, "linear"))
    return [float(v) for v in levels["step_ns"].to_list() if v is not None]


def median(values: Sequence[float]) -> float | None:
    """The median of plain numbers (None of none)."""
    return statistics.median(values) if values else None


@dataclass(frozen=True)
class Measure:
    """One measure of the step: the base runs' step units on it and the candidate's."""

    base: pl.DataFrame
    cand: pl.DataFrame

    def ratio(self) -> float | None:
        """The candidate's median over the median of the base runs' medians."""
        mid = median(step_levels(self.base, AT_SPEED_QUANTILE))
        cand = median(self.cand["step_ns"].drop_nulls().cast(pl.Float64).to_list())
        return cand / mid if mid and cand is not None else None

    def spread(self) -> float | None:
        """(highest - lowest) / median of the base runs' median step times on this measure."""
        levels = step_levels(self.base, AT_SPEED_QUANTILE)
        mid = median(levels)
        return (max(levels) - min(levels)) / mid if mid else None


@dataclass(frozen=True)
class Measures:
    """The measures the step verdict weighed, the one it judges, and the probes' reference."""

    measures: dict[str, Measure]
    judged: str
    reference: float | None = None  # the base runs' median probe
    cand_speed: float | None = None  # the candidate's median probe over it

    def spreads(self) -> dict[str, float]:
        return {name: s for name, m in self.measures.items() if (s := m.spread()) is not None}

    def confirming(self, options: DiffOptions) -> str | None:
        """The measure of check ``confirmed`` (docs/diff.md, "The step"), or None."""
        other = next((name for name in self.measures if name != self.judged), None)
        spreads = self.spreads()
        if other != "cpu_raw" or other not in spreads or self.judged not in spreads:
            return other
        return other if spreads[other] <= options.confirm_spread * spreads[self.judged] else None


def measure_step(base: pl.DataFrame, cand: pl.DataFrame, base_probed: list[pl.DataFrame], cand_probed: pl.DataFrame,
                 *, cpu: bool, same_work: bool) -> Measures:
    """The measures of the step and the one judged (docs/diff.md, "The step"): "raw", or with a
    probe before every step of every run (of the same work, ``same_work``) "cpu" and "cpu_raw"
    (``cpu``: a CPU program on one intra-op thread, every window of CPU time noted), else "wall"."""
    sides = [*base_probed, cand_probed]
    if not same_work or unprobed(sides):
        return Measures({"raw": Measure(base, cand)}, "raw")
    speed = median(cand_probed["probe_ns"].drop_nulls().cast(pl.Float64).to_list()) or 0.0
    if cpu and not lacking(sides, "window_cpu_ns"):
        ref = reference_probe(base_probed)
        pooled = pl.concat(base_probed)
        measures = {"cpu": Measure(cpu_at_speed(pooled, ref), cpu_at_speed(cand_probed, ref)),
                    "cpu_raw": Measure(cpu_per_step(pooled), cpu_per_step(cand_probed))}
        raw, probed = measures["cpu_raw"].spread(), measures["cpu"].spread()
        judged = "cpu_raw" if raw is not None and (probed is None or raw < probed) else "cpu"
        return Measures(measures, judged, ref, speed / ref)
    *history, cand_at = at_shares(sides)
    ref = reference_probe(history)
    wall = Measure(adjusted(pl.concat(history), ref), adjusted(cand_at, ref))
    return Measures({"wall": wall}, "wall", ref, speed / ref)


def step_bounds(levels: Sequence[float], options: DiffOptions, at_speed: bool) -> tuple[float, float] | None:
    """(below, above): the bars of check ``beyond_history`` (docs/diff.md, "The step"); None
    without positive levels."""
    if not levels or min(levels) <= 0:
        return None
    low, high = min(levels), max(levels)
    margin = options.margin("step")
    if at_speed:
        widest = max(margin, (high - low) / (median(levels) or 1.0))
        return low * (1 - widest), high * (1 + widest)
    return low * (low / high) * (1 - margin), high * (high / low) * (1 + margin)


def judge_step(runs: int, measures: Measures, options: DiffOptions, note: str | None = None) -> StepVerdict:
    """The step verdict: the candidate's level on the judged measure against the base runs'
    (``runs`` of them), as checks (docs/diff.md, "The step")."""
    judged = measures.measures[measures.judged]
    at_speed = measures.judged != "raw"
    quantile = AT_SPEED_QUANTILE if at_speed else options.low_quantile
    levels = step_levels(judged.base, quantile)
    cand_levels = step_levels(judged.cand, quantile)
    mid = median(levels)
    bounds = step_bounds(levels, options, at_speed)
    p = two_sample_p(judged.base["step_ns"], judged.cand["step_ns"])
    unknown = StepVerdict(
        verdict="unknown", measure=measures.judged, checks=(), ratio=None, p_value=p, bounds=None,
        level_low_ns=min(levels) if levels else None, level_high_ns=max(levels) if levels else None,
        spreads=measures.spreads(),
        adjusted_ratio=next((m.ratio() for n, m in measures.measures.items() if n in ("cpu", "wall")), None),
        cpu_ratio=measures.measures["cpu_raw"].ratio() if "cpu_raw" in measures.measures else None,
        cand_speed_ratio=measures.cand_speed, speed_reference_ns=measures.reference, note=note)
    if not cand_levels or mid is None or bounds is None:
        return unknown
    c = cand_levels[0]
    up = c > mid
    below, above = bounds
    checks = [
        Check("history_runs", float(runs), float(options.min_history), runs >= options.min_history),
        Check("step_p", p, options.alpha, p is not None and p < options.alpha),
        Check("beyond_history", c / mid, (above if up else below) / mid, c > above if up else c < below),
    ]
    confirming = measures.confirming(options)
    other = None if confirming is None else measures.measures[confirming].ratio()
    if other is not None:
        bar = 1 + options.margin("confirm") if up else 1 - options.margin("confirm")
        checks.append(Check("confirmed", other, bar, other > bar if up else other < bar))
    checks = [ch for ch in checks if ch.name not in options.skip_checks]
    if any(ch.name == "history_runs" and not ch.passed for ch in checks):
        verdict = "unknown"  # one base run: a step-wide change cannot be told from machine load
    elif all(ch.passed for ch in checks):
        verdict = "regression" if up else "improvement"
    else:
        verdict = "unchanged"
    return replace(unknown, verdict=verdict, checks=tuple(checks), ratio=c / mid, confirming=confirming,
                   bounds=(below / mid, above / mid))


def speed_note(history: list[pl.DataFrame], cand: pl.DataFrame, measure: str, works: Sequence[int]) -> str | None:
    """Why the step times were not put at speed though some run took speed probes, or why the
    probes were not divided by the CPU's share; None when no run took any, or every one was, or
    the CPU times were judged (``measure``: ``Measures.judged``; ``works``: ``speed.probe_works``)."""
    sides = [*history, cand]
    if len(set(works)) > 1:
        older = sum(1 for w in works if w == ProbeWork.FORWARD)
        return (f"step time not adjusted for machine speed: the runs' speed probes timed different work ({older} of "
                f"{len(works)} runs' probes ran forward only, as before schema revision 0019); record every run of a "
                "history with the same modtrace")
    if measure in ("cpu", "cpu_raw"):
        return None
    if measure == "wall":
        missing = lacking(sides, "share")
        return None if not missing else (
            f"probes not divided by the program's share of the CPU: {missing} of {len(sides)} runs noted none "
            "(recorded on an injected clock), so no run's was")
    if all(s["probe_ns"].null_count() == s.height for s in sides):
        return None
    missing = unprobed(sides)
    return (f"step time not adjusted for machine speed: {missing} of {len(sides)} runs have compared steps without "
            "a speed probe of their own (record every run with --speed-probe, stepping by optimizer steps or "
            "rec.step())")
