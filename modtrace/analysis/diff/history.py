"""A history of base runs: the candidate judged against what varies from one base run to the next.

One base run cannot tell a busier machine from slower code: every module
and the step slow down alike in both cases.  A history can: it holds the
same code recorded several times, so what differs between its runs is
noise, and a candidate beyond all of it is a change.  The rule (the
README's "regression gate") takes the window's range as its boundary (robust
with the few runs a CI keeps; no normal law assumed):

- each base run gives, per module and phase, its level and level share
  (``verdicts.low_levels``: a low quantile of its time per step), and its
  level step time (``step_levels``);
- a module is blamed (regression, improvement) as against one base run
  (``verdicts._level_changed``), its share beyond *every* base run's share
  by more than ``threshold`` and its level beyond the base runs' median
  level by more than ``min_delta_ns``;
- the step is a step regression (``summary["step_verdict"]``, ``step_verdict``)
  when its level lies beyond the history's range by the range's own width
  and by ``threshold``, significantly; it fails ``--fail-on regression``
  even when no module's share moved (everything slowed alike beyond the
  history's spread).  When every run took the speed probe, the step is
  judged on a steadier measure of its time (``_speed_adjusted``): on a CPU
  program on one intra-op thread the thread's CPU time per step, at the
  history's machine speed (over the probe) or as measured, whichever spread
  less across the history's runs, the other agreeing (the CPU time as
  measured only when it spread at most ``CONFIRM_SPREAD`` times as wide
  as over the probe); else the wall time at the history's
  machine speed.  The level is then their median, beyond the range by its
  width or ``threshold``, the larger.

Structure is compared against the pooled steps of the history (a module is
removed when some base run called it and the candidate did not; calls per
step against their spread over every base run), call order against the
newest base run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from modtrace.analysis.diff.frames import DiffOptions, DiffResult, RunCalls
from modtrace.analysis.diff.order import call_sequences
from modtrace.analysis.diff.run import _prepare, _Side, compare_rest, diff_runs
from modtrace.analysis.diff.samples import (
    compared_calls,
    compared_samples,
    fill_steps,
    module_keys,
    module_lookup,
    step_units,
    with_mkey,
)
from modtrace.analysis.diff.speed import (
    adjusted,
    at_shares,
    cpu_at_speed,
    cpu_per_step,
    lacking,
    probe_works,
    probed_units,
    reference_probe,
    unprobed,
)
from modtrace.analysis.diff.stats import min_p_value, two_sample_p
from modtrace.analysis.diff.structure import placement
from modtrace.analysis.diff.verdicts import compare_timing, low_levels
from modtrace.core.codes import ProbeWork

# The level of step times adjusted for machine speed: their median (a probe hit by an interrupt
# makes its step look fast, so their low quantiles are the probe's noise, not the step's).
ADJUSTED_QUANTILE = 0.5
# The CPU time as measured must confirm a step verdict judged over the probe only when it spread
# across the history's runs at most this many times as wide: a wider one cannot tell a change of
# the size the judged one can, and its veto would be its own noise (at 200 steps per run it spread
# 16 to 31%, over the probe 5 to 6%, and vetoed 27 of 90 uniform 1.3x changes; docs/performance.md,
# "Eighth measurement").  A verdict judged on the CPU time as measured is always to be confirmed
# over the probe: a slower machine shows on the CPU time as measured alone.
CONFIRM_SPREAD = 3.0
# Base run i's ranks become i * RANK_STRIDE + rank in the pooled samples: every (run, rank, step) one sample.
RANK_STRIDE = 1 << 16
_METRICS = ("self", "incl", "self_share", "incl_share")
_COLUMNS = {"self": "self_ns", "incl": "incl_ns", "self_share": "self_share", "incl_share": "incl_share"}


def run_ranges(pooled: pl.DataFrame) -> pl.DataFrame:
    """Pooled filled samples -> per key the lowest and highest of the base runs' medians per step of
    each metric: key, {metric}_low, {metric}_high; and ``self_runs``, each run's median self time
    per step in run order (the report's trend chart)."""
    run = (pl.col("rank") // RANK_STRIDE).alias("_run")
    medians = pooled.group_by("key", run).agg(pl.col(_COLUMNS[m]).median().alias(m) for m in _METRICS)
    return medians.group_by("key").agg(
        *(pl.col(m).min().alias(f"{m}_low") for m in _METRICS),
        *(pl.col(m).max().alias(f"{m}_high") for m in _METRICS),
        pl.col("self").cast(pl.Float64).sort_by("_run").alias("self_runs"),
    )


def step_levels(units: pl.DataFrame, quantile: float) -> list[float]:
    """Step units of one or more runs (ranks offset by ``RANK_STRIDE``) -> each run's
    ``quantile`` of its step times, in run order."""
    levels = units.group_by(pl.col("rank") // RANK_STRIDE, maintain_order=True).agg(
        pl.col("step_ns").cast(pl.Float64).quantile(quantile, "linear"))
    return [float(v) for v in levels["step_ns"].to_list() if v is not None]


def step_verdict(history: Sequence[float], pooled: pl.Series, cand: pl.Series, options: DiffOptions,
                 at_speed: bool = False) -> tuple[str, float | None]:
    """(verdict of the candidate's step time against the base runs', its p).

    ``history`` holds each base run's level (``step_levels``).  The candidate's level changed
    when it lies beyond the history's range by the range's own width and by ``threshold``:
    above high * (high / low) * (1 + threshold), or below low * (low / high) * (1 -
    threshold), more than ``min_delta_ns`` from the history's median level, and the
    Mann-Whitney test of its steps against the pooled steps gives p < ``alpha``.  A history
    recorded on a quiet machine (a narrow range) so catches a small step-wide change, and one
    whose runs differ as much as load makes them does not cry wolf.

    ``at_speed``: the step times are a steadier measure (``_speed_adjusted``: at the history's
    machine speed, or the thread's CPU time), the levels their medians (``ADJUSTED_QUANTILE``).
    Those hold far stiller from run to run than raw times, and the margin beyond the range is the larger of ``threshold`` and the range's width
    relative to its median, not both: above high * (1 + max(threshold, (high - low) / median))
    (the rule's choice, measured on recordings, is in docs/performance.md).
    """
    p = two_sample_p(pooled, cand)
    bounds = step_bounds(history, options, at_speed)
    if bounds is None or cand.len() == 0 or p is None or p >= options.alpha:
        return "unchanged", p
    quantile = ADJUSTED_QUANTILE if at_speed else options.low_quantile
    c = step_levels(pl.DataFrame({"rank": pl.zeros(cand.len(), pl.Int64, eager=True), "step_ns": cand}), quantile)[0]
    mid = float(pl.Series(history).median())  # type: ignore[arg-type]
    below, above = bounds
    if c > above and c - mid > options.min_delta_ns:
        return "regression", p
    if c < below and mid - c > options.min_delta_ns:
        return "improvement", p
    return "unchanged", p


def step_bounds(history: Sequence[float], options: DiffOptions, at_speed: bool) -> tuple[float, float] | None:
    """(below, above): the candidate's level step time is a step-wide improvement below ``below``
    and a regression above ``above`` (``step_verdict``'s rule, before its ``min_delta_ns`` and
    significance conditions); None without a history of positive levels."""
    if not history or min(history) <= 0:
        return None
    low, high = min(history), max(history)
    if at_speed:
        margin = max(options.threshold, (high - low) / float(pl.Series(history).median()))  # type: ignore[arg-type]
        return low * (1 - margin), high * (1 + margin)
    return low * (low / high) * (1 - options.threshold), high * (high / low) * (1 + options.threshold)


@dataclass(frozen=True)
class _Measure:
    """One measure of the step: the history's step units and the candidate's on it."""

    base: pl.DataFrame
    cand: pl.DataFrame

    def ratio(self) -> float | None:
        """The candidate's median over the median of the history's runs' medians."""
        levels = step_levels(self.base, ADJUSTED_QUANTILE)
        mid = float(pl.Series(levels).median()) if levels else 0.0  # type: ignore[arg-type]
        return float(self.cand["step_ns"].median()) / mid if mid > 0 and self.cand.height else None  # type: ignore[arg-type]


@dataclass(frozen=True)
class _Adjusted:
    """The measures of the step weighed for the step verdict, and the one it judges."""

    # "cpu": the thread's CPU time per step window at the history's speed; "cpu_raw": that CPU time
    # as measured; "wall": the steps' own times at the history's speed
    measures: dict[str, _Measure]
    measure: str  # the one judged
    reference: float  # the history's median probe (ns)
    cand_speed: float  # the candidate's median probe over it

    @property
    def judged(self) -> _Measure:
        return self.measures[self.measure]

    @property
    def confirming(self) -> str | None:
        """The measure that must agree with a step verdict (``_corroborated``): the other CPU measure,
        but the CPU time as measured ("cpu_raw") under a verdict over the probe only when its
        history spread at most ``CONFIRM_SPREAD`` times as wide; None on wall times, or when that
        one is too noisy to confirm or deny."""
        other = next((name for name in self.measures if name != self.measure), None)
        spreads = self.spreads()
        if other != "cpu_raw" or spreads.get(other) is None or spreads.get(self.measure) is None:
            return other
        return other if spreads[other] <= CONFIRM_SPREAD * spreads[self.measure] else None

    def spreads(self) -> dict[str, float]:
        return {name: s for name, m in self.measures.items() if (s := run_spread(m.base)) is not None}


def run_spread(units: pl.DataFrame) -> float | None:
    """Step units of a history (ranks offset by ``RANK_STRIDE``) -> the spread of its runs' median
    step times, (highest - lowest) / median: the width the step rule allows beyond the highest."""
    levels = step_levels(units, ADJUSTED_QUANTILE)
    mid = float(pl.Series(levels).median()) if levels else 0.0  # type: ignore[arg-type]
    return (max(levels) - min(levels)) / mid if mid > 0 else None


def on_one_thread(runs: Sequence[RunCalls]) -> bool:
    """Whether every run's work is on its recording thread's CPU clock: it ran on the CPU alone (a
    device's work is not on it) and took every probe with one intra-op thread (with more, the
    other threads' work is not on it, and the recording thread's wait for them, spinning or not,
    moves with the machine's load: measured, docs/performance.md)."""
    def one(r: RunCalls) -> bool:
        cpu_only = r.devices.height == 0 or bool(r.devices["name"].str.starts_with("cpu").all())
        return (cpu_only and r.speeds is not None and r.speeds.height > 0
                and bool((r.speeds["threads"].fill_null(0) == 1).all()))  # null: recorded before 0018

    return all(one(r) for r in runs)


def _speed_adjusted(history: list[pl.DataFrame], cand: pl.DataFrame, cpu: bool) -> _Adjusted | None:
    """The measures of the step the verdict weighs, when every compared step of every run has its
    own probe; else None.

    With ``cpu`` (a CPU program on one intra-op thread, ``on_one_thread``) and every step's window
    of CPU time noted, two: the steps' CPU times at the history's median probe speed
    (``speed.cpu_at_speed``: "cpu") and as measured (``speed.cpu_per_step``: "cpu_raw").  The
    verdict judges the one that spread less across the history's runs (``run_spread``; a tie
    keeps the probe), and the other must agree (``_corroborated``; the CPU time as measured only
    when it spread at most ``CONFIRM_SPREAD`` times as wide, ``_Adjusted.confirming``).  The
    probe follows a machine whose speed changes (another tenant, the clock) but adds noise of its own: on four
    recordings of 34 unchanged runs per load the runs' CPU time per step spread 3 to 12% (sd of
    log) and over the probe 6 to 11%, and which one held stiller changed with the day and the
    load (docs/performance.md, "Seventh measurement"); the history's own runs show which.  Else one: their wall times at the history's speed
    (``speed.adjusted``: "wall")."""
    sides = [*history, cand]
    if unprobed(sides):
        return None
    if cpu and not lacking(sides, "window_cpu_ns"):
        ref = reference_probe(history)
        base = pl.concat(history)
        measures = {"cpu": _Measure(cpu_at_speed(base, ref), cpu_at_speed(cand, ref)),
                    "cpu_raw": _Measure(cpu_per_step(base), cpu_per_step(cand))}
        spread = {name: run_spread(m.base) for name, m in measures.items()}
        raw, probed = spread["cpu_raw"], spread["cpu"]
        measure = "cpu_raw" if raw is not None and (probed is None or raw < probed) else "cpu"
        return _Adjusted(measures=measures, measure=measure, reference=ref,
                         cand_speed=float(cand["probe_ns"].median()) / ref)  # type: ignore[arg-type]
    *history, cand = at_shares(sides)
    ref = reference_probe(history)
    wall = _Measure(adjusted(pl.concat(history), ref).drop("probe_ns"), adjusted(cand, ref).drop("probe_ns"))
    return _Adjusted(measures={"wall": wall}, measure="wall", reference=ref,
                     cand_speed=float(cand["probe_ns"].median()) / ref)  # type: ignore[arg-type]


def _corroborated(verdict: str, other: _Measure | None, options: DiffOptions) -> bool:
    """Whether the other CPU measure (``_Adjusted.confirming``) agrees with a step ``verdict``: the
    candidate's median on it above (regression) or below (improvement) the history's median by more
    than ``threshold``.
    A change of the code shows on both; a change of the machine's speed on the CPU time as
    measured alone, a probe's noise on the CPU time over the probe alone.  Judged on four
    recordings (docs/performance.md, "Seventh measurement"): without it, 3 A/A false alarms in
    360 pairs; with it none, and 12 fewer of 360 uniform 1.3x slowdowns caught."""
    ratio = None if other is None else other.ratio()
    if verdict not in ("regression", "improvement") or ratio is None:
        return True
    return ratio > 1 + options.threshold if verdict == "regression" else ratio < 1 - options.threshold


def _speed_note(history: list[pl.DataFrame], cand: pl.DataFrame, measure: str | None,
                works: Sequence[int] = ()) -> str | None:
    """Why the step times were not adjusted though some run took speed probes, or why the probes
    were not divided by the CPU's share; None when no run took any, or every one was, or the CPU
    times were judged (``measure``: ``_Adjusted.measure``, None when not adjusted; ``works``:
    ``speed.probe_works`` of the runs)."""
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


def diff_history(bases: Sequence[RunCalls], cand: RunCalls, options: DiffOptions | None = None) -> DiffResult:
    """The candidate against a history of base runs (newest first): timing verdicts and a step
    verdict against the spread of the history, structure against its pooled steps, call order
    against its newest run.  One base run is ``diff_runs``."""
    options = options or DiffOptions()
    if not bases:
        raise ValueError("a history needs at least one base run")
    if len(bases) == 1:
        return diff_runs(bases[0], cand, options)
    lookups = [module_lookup(b) for b in bases]
    lookup_c = module_lookup(cand)
    names = module_keys(*lookups, lookup_c)
    units_all: list[pl.DataFrame] = []
    raw_all: list[pl.DataFrame] = []
    probed_all: list[pl.DataFrame] = []
    newest: pl.DataFrame | None = None
    for i, (run, lookup) in enumerate(zip(bases, lookups, strict=True)):
        compared = with_mkey(compared_calls(run.calls, options.skip_steps), lookup, names)
        if i == 0:
            newest = compared
        offset = pl.col("rank") + i * RANK_STRIDE
        run_units = step_units(compared)
        probed_all.append(probed_units(compared, run_units, run.speeds).with_columns(offset.cast(pl.Int32)))
        units_all.append(run_units.with_columns(offset.cast(pl.Int32)))
        raw_all.append(compared_samples(compared, options.phases).with_columns(offset.cast(pl.Int32)))
    assert newest is not None
    units = pl.concat(units_all)
    pooled = fill_steps(pl.concat(raw_all), units)
    b = _Side(units=units, samples=pooled, placed=placement(newest, bases[0].devices, options.phases),
              sequence=call_sequences(newest, options.phases))
    c = _prepare(cand, lookup_c, names, options, probed=True)
    per_run = [float(m) for m in units.group_by(pl.col("rank") // RANK_STRIDE, maintain_order=True).agg(
        pl.col("step_ns").median())["step_ns"].to_list() if m is not None]
    n_b, n_c = units.height, c.units.height
    step_b = float(pl.Series(per_run).median()) if per_run else None  # type: ignore[arg-type]
    step_c = float(c.units["step_ns"].median()) if n_c else None  # type: ignore[arg-type]
    timing = compare_timing(pooled, c.samples, names, options, n_base=n_b, n_cand=n_c, step_ns=step_b,
                            history=run_ranges(pooled),
                            base_levels=low_levels(pooled, options.low_quantile, pl.col("rank") // RANK_STRIDE))
    structure, divergence, calls, varies = compare_rest(b, c, names, options)
    assert c.probed is not None
    works = probe_works([r.speeds for r in (*bases, cand)])
    # probes of different work do not compare: no run is put at speed (the note says why)
    speed = None if len(set(works)) > 1 else _speed_adjusted(probed_all, c.probed, cpu=on_one_thread([*bases, cand]))
    step_b_units, step_c_units = (units, c.units) if speed is None else (speed.judged.base, speed.judged.cand)
    levels = step_levels(step_b_units, options.low_quantile if speed is None else ADJUSTED_QUANTILE)
    verdict, step_p = step_verdict(levels, step_b_units["step_ns"], step_c_units["step_ns"], options,
                                   at_speed=speed is not None)
    bounds = step_bounds(levels, options, at_speed=speed is not None)
    confirming = None if speed is None else speed.confirming
    unconfirmed = speed is not None and confirming is not None and not _corroborated(
        verdict, speed.measures[confirming], options)
    if unconfirmed:
        verdict = "unchanged"
    probed = speed is not None and speed.measure != "cpu_raw"  # judged over the probe
    measures = {} if speed is None else speed.measures
    counts = timing["verdict"].value_counts()
    by_verdict = dict(zip(counts["verdict"].to_list(), counts["count"].to_list(), strict=True))
    step_ratio = (step_c / step_b) if step_b and step_c is not None else None
    summary: dict[str, object] = {
        "base_steps": n_b,
        "cand_steps": n_c,
        "base_step_ns": step_b,
        "cand_step_ns": step_c,
        "step_ratio": step_ratio,
        "step_p_value": step_p,
        "step_changed": verdict != "unchanged",
        "compared": timing.height,
        "regressions": int(by_verdict.get("regression", 0)),
        "improvements": int(by_verdict.get("improvement", 0)),
        "inherited": int(by_verdict.get("inherited", 0)),
        "structure_changes": structure.height,
        "min_p_value": min_p_value(n_b, n_c),
        "order_varies": varies,
        "history_runs": len(bases),
        "step_verdict": verdict,
        "history_step_low_ns": min(per_run) if per_run else None,
        "history_step_high_ns": max(per_run) if per_run else None,
        "history_run_step_ns": per_run,
        "history_step_level_low_ns": min(levels) if levels else None,
        "history_step_level_high_ns": max(levels) if levels else None,
        # the speed probe (modtrace.analysis.diff.speed): whether the step verdict judged step times
        # divided by it (at the history's machine speed)
        "step_adjusted": probed,
        # which step time the verdict judged: "cpu" (the thread's CPU time per step at the history's
        # speed), "cpu_raw" (that CPU time as measured), "wall" (at the history's speed), None
        "step_measure": None if speed is None else speed.measure,
        # per measure weighed, its spread across the history's runs ((highest - lowest) / median)
        "step_spreads": {} if speed is None else speed.spreads(),
        # the measure that had to confirm a step-wide change ("cpu" or "cpu_raw"); None on wall
        # times, or when the CPU time as measured spread over CONFIRM_SPREAD times as wide as the
        # judged measure over the probe
        "step_confirming": confirming,
        # the judged measure found a step-wide change the confirming measure did not confirm
        "step_unconfirmed": unconfirmed,
        # the judged measure's bounds as ratios to the history's median level: a candidate
        # between them cannot be told from the spread of the history's runs
        # (step_bounds gives None unless every level is positive, so the median is too)
        "step_bounds": None if bounds is None else tuple(b / float(pl.Series(levels).median()) for b in bounds),  # type: ignore[arg-type]
        "speed_reference_ns": None if speed is None else speed.reference,
        "cand_speed_ratio": None if speed is None else speed.cand_speed,
        # the candidate's median over the history's runs' median of its step time over the probe
        # ("cpu" or "wall"), and of its CPU time per step as measured ("cpu_raw")
        "adjusted_step_ratio": next((m.ratio() for n, m in measures.items() if n != "cpu_raw"), None),
        "cpu_step_ratio": measures["cpu_raw"].ratio() if "cpu_raw" in measures else None,
        "speed_note": _speed_note(probed_all, c.probed, None if speed is None else speed.measure, works),
    }
    return DiffResult(timing=timing, structure=structure, divergence=divergence, summary=summary, calls=calls)
