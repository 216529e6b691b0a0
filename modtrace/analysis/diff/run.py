"""The whole diff: base runs' and a candidate's calls -> a ``DiffResult``.

One path for one base run and for a history of them (``diff_history``): each run is prepared
(compared steps, filled samples, placement, call sequence, probes), the base runs' samples pooled
with their ranks apart (``step.RANK_STRIDE``), then ``verdicts`` judges the modules, ``step`` the
step, ``structure`` and ``order`` the rest (structure against the pooled base steps, call order
against the newest base run).  The rule: docs/diff.md, "The rule".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from modtrace.analysis.diff.frames import (
    STRUCTURE_SCHEMA,
    DiffOptions,
    DiffResult,
    DiffSummary,
    Divergence,
    RunCalls,
)
from modtrace.analysis.diff.order import (
    call_sequences,
    first_divergence,
    order_finding,
    order_varies,
)
from modtrace.analysis.diff.samples import (
    calls_of_spans,
    compared_calls,
    compared_samples,
    fill_steps,
    module_keys,
    module_lookup,
    step_units,
    with_mkey,
)
from modtrace.analysis.diff.speed import probe_works, probed_units
from modtrace.analysis.diff.stats import min_p_value, min_steps
from modtrace.analysis.diff.step import RANK_STRIDE, judge_step, measure_step, median, speed_note
from modtrace.analysis.diff.structure import calls_per_step, compare_structure, placement
from modtrace.analysis.diff.verdicts import compare_timing, low_levels

_METRICS = {"self": "self_ns", "incl": "incl_ns", "self_share": "self_share", "incl_share": "incl_share"}


@dataclass(frozen=True)
class _Side:
    units: pl.DataFrame  # rank, step, step_ns
    raw: pl.DataFrame  # samples as called (compared_samples)
    samples: pl.DataFrame  # filled samples with shares
    placed: pl.DataFrame  # mkey, device, stream (of a pool: the newest base run's)
    sequence: pl.DataFrame  # call_sequences (idem)
    probed: pl.DataFrame  # units with probe_ns (speed.probed_units)


def _prepare(run: RunCalls, lookup: pl.DataFrame, names: pl.DataFrame, options: DiffOptions, offset: int = 0) -> _Side:
    """One run's compared steps, samples, placement, call sequence and probes, its ranks moved by
    ``offset`` (a base run's place in the pool)."""
    compared = with_mkey(compared_calls(run.calls, options.skip_steps), lookup, names)
    units = step_units(compared)
    raw = compared_samples(compared, options.phases)
    probed = probed_units(compared, units, run.speeds)
    if offset:
        moved = (pl.col("rank") + offset).cast(pl.Int32)
        units, raw, probed = (f.with_columns(moved) for f in (units, raw, probed))
    return _Side(units=units, raw=raw, samples=fill_steps(raw, units), placed=placement(compared, run.devices, options.phases),
                 sequence=call_sequences(compared, options.phases), probed=probed)


def run_ranges(pooled: pl.DataFrame) -> pl.DataFrame:
    """Pooled filled samples -> per key the lowest and highest of the base runs' medians per step of
    each metric ({metric}_low, {metric}_high), and ``self_runs``, each run's median self time per
    step in run order (the report's trend chart)."""
    run = (pl.col("rank") // RANK_STRIDE).alias("_run")
    medians = pooled.group_by("key", run).agg(pl.col(c).median().alias(m) for m, c in _METRICS.items())
    return medians.group_by("key").agg(
        *(pl.col(m).min().alias(f"{m}_low") for m in _METRICS),
        *(pl.col(m).max().alias(f"{m}_high") for m in _METRICS),
        pl.col("self").cast(pl.Float64).sort_by("_run").alias("self_runs"),
    )


def on_one_thread(runs: Sequence[RunCalls]) -> bool:
    """Whether every run's work is on its recording thread's CPU clock: it ran on the CPU alone (a
    device's work is not on it) and took every probe with one intra-op thread (with more, the
    other threads' work is not on it)."""
    def one(r: RunCalls) -> bool:
        cpu_only = r.devices.height == 0 or bool(r.devices["name"].str.starts_with("cpu").all())
        return (cpu_only and r.speeds is not None and r.speeds.height > 0
                and bool((r.speeds["threads"].fill_null(0) == 1).all()))  # null: recorded before 0018

    return all(one(r) for r in runs)


def diff_history(bases: Sequence[RunCalls], cand: RunCalls, options: DiffOptions | None = None) -> DiffResult:
    """The candidate against one or more base runs (newest first): module verdicts and the step
    verdict as checks, structure against the base runs' pooled steps, call order against the
    newest."""
    options = options or DiffOptions()
    if not bases:
        raise ValueError("a diff needs at least one base run")
    lookups = [module_lookup(b) for b in bases]
    lookup_c = module_lookup(cand)
    names = module_keys(*lookups, lookup_c)
    sides = [_prepare(run, lookup, names, options, i * RANK_STRIDE)
             for i, (run, lookup) in enumerate(zip(bases, lookups, strict=True))]
    c = _prepare(cand, lookup_c, names, options)
    units = pl.concat([s.units for s in sides])
    # filled over the pool: a module some base run never called counts 0 in that run's steps
    pooled = sides[0].samples if len(sides) == 1 else fill_steps(pl.concat([s.raw for s in sides]), units)
    b = _Side(units=units, raw=pl.concat([s.raw for s in sides]), samples=pooled, placed=sides[0].placed, sequence=sides[0].sequence,
              probed=pl.concat([s.probed for s in sides]))
    per_run = [float(m) for m in units.group_by(pl.col("rank") // RANK_STRIDE, maintain_order=True).agg(
        pl.col("step_ns").median())["step_ns"].to_list() if m is not None]
    n_b, n_c = units.height, c.units.height
    step_b = median(per_run)
    step_c = median(c.units["step_ns"].cast(pl.Float64).to_list())
    several = len(bases) > 1
    timing = compare_timing(pooled, c.samples, names, options, n_base=n_b, n_cand=n_c, step_ns=step_b,
                            history=run_ranges(pooled) if several else None,
                            base_levels=low_levels(pooled, options.low_quantile, pl.col("rank") // RANK_STRIDE))
    structure, divergence, calls, varies = compare_rest(b, c, names, options)
    works = probe_works([r.speeds for r in (*bases, cand)])
    probed = [s.probed for s in sides]
    measures = measure_step(units, c.units, probed, c.probed, cpu=on_one_thread([*bases, cand]),
                            same_work=len(set(works)) <= 1)
    step = judge_step(len(bases), measures, options, speed_note(probed, c.probed, measures.judged, works))
    counts = dict(timing["verdict"].value_counts().iter_rows())
    summary = DiffSummary(
        base_steps=n_b, cand_steps=n_c, base_step_ns=step_b, cand_step_ns=step_c, compared=timing.height,
        regressions=int(counts.get("regression", 0)), improvements=int(counts.get("improvement", 0)),
        inherited=int(counts.get("inherited", 0)), structure_changes=structure.height,
        min_p_value=min_p_value(n_b, n_c), min_steps=min_steps(options.alpha), order_varies=varies, history_runs=len(bases),
        history_run_step_ns=tuple(per_run),
    )
    return DiffResult(timing=timing, structure=structure, divergence=divergence, summary=summary, step=step,
                      calls=calls)


def compare_rest(b: _Side, c: _Side, names: pl.DataFrame, options: DiffOptions
                 ) -> tuple[pl.DataFrame, Divergence | None, pl.DataFrame, bool]:
    """Structure findings, the first order divergence, the data-dependent calls per step, and
    whether either run's call order varies from step to step (then order is not compared: a
    divergence between the runs is what their own steps already do)."""
    structure = compare_structure(b.samples, c.samples, names, b.placed, c.placed)
    varies = order_varies(b.sequence) or order_varies(c.sequence)
    divergence = None if varies else first_divergence(b.sequence, c.sequence, names, options)
    if divergence is not None:
        structure = pl.concat([structure, pl.DataFrame([order_finding(divergence)], schema=STRUCTURE_SCHEMA)])
    return structure, divergence, calls_per_step(b.samples, c.samples, names), varies


def diff_spans(base_spans: pl.DataFrame, cand_spans: pl.DataFrame, options: DiffOptions | None = None) -> DiffResult:
    """``diff_history`` of two spans frames: the candidate against one base run."""
    return diff_history([calls_of_spans(base_spans)], calls_of_spans(cand_spans), options)
