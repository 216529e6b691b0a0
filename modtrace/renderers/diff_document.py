"""The document of ``modtrace diff``: what its four renderers (``renderers.diff``) read.

``document`` turns a ``DiffResult`` into the JSON document below (plain
values, times in microseconds).  Its keys are stable: new keys may be added,
existing ones are not renamed or removed without bumping ``format``.

    format        "modtrace.diff/1"
    base, cand    {run, run_id, db, rank (null: all ranks), clock (host |
                  device: the one clock both sides are read on), steps (compared
                  (rank, step) samples), step_us (median step time: time
                  in root spans per step, over the compared steps), history
                  (base only: null for one base run, else the base runs
                  used, newest first: [{run, run_id, step_us (that run's
                  median step time)}]; base.run is the newest), selector
                  (base only: the tag:KEY=VALUE terms that chose the
                  history, or null)}
    options       {threshold_pct, share_threshold_pct, level_pct (the
                  percentile of the time per step a level is), min_delta_us, alpha,
                  skip_steps, phases (null: all), fail_on, absolute (true:
                  shares of the step were not required to move)}
    summary       {compared, regressions, improvements, inherited,
                  structure_changes, step_ratio (cand/base median step
                  time), step_p_value (Mann-Whitney over the step times),
                  step_changed (step time changed significantly by more
                  than the threshold), min_p_value (smallest p the test can
                  reach with these step counts), history_runs (how many
                  base runs), step_verdict (against a history of two or
                  more runs: regression | improvement | unchanged, the
                  candidate's level step time (the options.level_pct
                  percentile of its step times) beyond the base runs' range of level step times by
                  the range's own width and the threshold; a regression
                  fails fail_on regression; null for one base run),
                  history_step_low_us, history_step_high_us (the range of
                  the base runs' median step times, shown),
                  history_step_level_low_us, history_step_level_high_us
                  (the range of their level step times, judged; with
                  step_adjusted, the medians of their step times at the
                  history's machine speed),
                  step_adjusted (true: every run took the speed probe
                  before each step, and the step verdict judged step
                  times at the history's machine speed: step time *
                  speed_reference_us / the probe before it),
                  step_measure (which step time the step verdict
                  judged, when every run took the probe: "cpu", the
                  recording thread's CPU time from the step's probe to
                  the next, less the probe, at the history's speed, on
                  a CPU program whose every run noted it on one
                  intra-op thread; "cpu_raw", that CPU time as
                  measured, not divided by the probe, judged instead
                  when it spread less across the history's runs
                  (step_adjusted is then false); "wall", the step's own
                  time, its probe divided by the program's share of the
                  CPU; else null),
                  step_spreads (per measure weighed, "cpu" and
                  "cpu_raw", or "wall": the spread of the history's
                  runs' median step times on it, (highest - lowest) /
                  median; {} when none),
                  step_bounds ([low, high]: against a history, the
                  step verdict's bounds as ratios to the history's
                  median level on the judged measure: a candidate
                  above high is a step regression, below low an
                  improvement (with the min_delta and significance
                  conditions, and the other CPU measure's agreement);
                  between them a step-wide change cannot be told from
                  the spread of the history's runs; null for one base
                  run),
                  step_confirming (the CPU measure that had to agree
                  with a step-wide change, "cpu" or "cpu_raw": the
                  other one; "cpu_raw" only when it spread at most 3
                  times as wide across the history as "cpu", judged;
                  null when it spread wider, too noisy to confirm or
                  deny, or on wall times),
                  step_unconfirmed (true: the judged measure lay beyond
                  the history's range but the confirming measure moved
                  less than the threshold from the history's median, so
                  the step verdict is unchanged),
                  adjusted_step_ratio (cand/base median step time at the
                  history's speed, over the probe; null when no step was
                  put at speed), cpu_step_ratio (cand/base median CPU
                  time per step as measured, with step_measure "cpu" or
                  "cpu_raw"; else null), cand_speed_ratio (the
                  candidate's median probe / speed_reference_us: above 1,
                  its machine was slower), speed_reference_us (the
                  history's median probe), speed_note (why step times
                  were not adjusted though some run took probes, or
                  why no probe was divided by its CPU share; else
                  null),
                  order_varies (a run's call order varies
                  from step to step: order not compared), failed (bool, per
                  fail_on: ``DiffResult.failed``), exit_code}
    timing        [{fqn, phase, verdict (regression | improvement |
                  inherited | unchanged), impact_us (change of median self
                  time per step), impact_pct (of the base step time),
                  steps_base, steps_cand, calls_base, calls_cand (median
                  calls per step), self: STATS, inclusive: STATS,
                  self_share: SHARE, inclusive_share: SHARE}], sorted
                  regressions first by impact, then improvements,
                  inherited, unchanged
                  STATS = {base_us, cand_us (median per step), delta_us,
                  ratio (null when base is 0), ci_low_us, ci_high_us
                  (interval of delta_us at 1 - alpha), p_value (Mann-Whitney
                  U, two-sided), p_adjusted (Holm over every compared
                  module and phase; the verdict uses it only when
                  options.absolute),
                  history_low_us, history_high_us (against a history: the
                  lowest and highest base run median; else null)}
                  SHARE = the module's time as a share of its step's time
                  (time in root spans), per step: {base_pct, cand_pct
                  (median, percent of the step), delta_pct (percentage
                  points), ratio (cand/base share; null when base is 0),
                  vs_rest_ratio (cand/base of share / (1 - share): how much
                  the module slowed relative to the rest of the step; 1
                  when everything slowed alike; shown), vs_typical_ratio
                  (the rule's ratio: the module's level share, cand over
                  the base runs' median, over the median of that ratio
                  across the modules compared; a level is the
                  options.level_pct percentile of the time per step, a
                  level share the level
                  over the sum of every module's self level),
                  noise_p_adjusted (informational, not judged: how likely
                  so large a vs_rest_ratio is as run-to-run noise, from the
                  spread of all the modules' ratios, Laplace, Holm),
                  ci_low_pct, ci_high_pct, p_value, p_adjusted (shown, not
                  judged); self_share only: history_low_pct,
                  history_high_pct (against a history: the lowest and
                  highest base run median share; else null)}.  A
                  regression (improvement) needs the self level more than
                  min_delta_us above (below) the base runs' median level
                  and, unless options.absolute, the self level share above
                  every base run's by more than threshold_pct (below every
                  one's) and vs_typical_ratio above 1 + share_threshold_pct
                  (below its inverse); with options.absolute instead the
                  level moved by more than threshold_pct and
                  self.p_adjusted < alpha.  Inherited:
                  the same of the inclusive time (or the absolute criteria
                  above a descendant that is a regression or improvement).
    counters      null (a side counted no step), or [{kind (step kind), fqn,
                  phase, counter (flops | bytes | ops), base, cand,
                  lower_bound (a side's FLOPs count unknown ops)}]: the
                  self counts of the first counted step of each kind that
                  differ, exactly (summary.counter_changes counts them)
    structure     [{kind, fqn, phase, base, cand, message}]; kind is one of
                  module_removed, module_added, phase_removed, phase_added,
                  calls_changed, device_changed, stream_changed,
                  order_changed
    calls_per_step [{fqn, phase, base: {min, median, max}, cand: {min,
                  median, max}, changed}]: the modules whose calls per step
                  vary from step to step in a run (data-dependent); changed
                  (a calls_changed finding) only when the two ranges do not
                  overlap
    order         null, or {rank_base, rank_cand, step_base, step_cand,
                  position (1-based call of the step where the sequences
                  first differ), excerpt: [{op ("=" same, "-" base only,
                  "+" candidate only, "~" differs), base_pos, cand_pos,
                  base, cand}]}

    base.history  [{run, run_id, step_us}], newest first, when CAND was
                  judged against several baseline runs (null for one);
                  each timing row's ``self.history_us`` then holds its
                  median self time per step in each of them, in that
                  order.  The markdown names the baseline from it
                  (``renderers.diff.baseline_lines``) and the report draws
                  a point per run (``renderers.html_report.trend_data``).

The table, markdown and csv renderers read only this document.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from modtrace.analysis.diff import DiffOptions, DiffResult

FORMAT = "modtrace.diff/1"
_STATS = ("base", "cand", "delta", "ratio", "ci_low", "ci_high", "p_value")


def _us(ns: float | None) -> float | None:
    return None if ns is None else round(float(ns) / 1000.0, 3)


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else float(f"{float(value):.{digits}g}")


def _stats(row: dict[str, Any], metric: str) -> dict[str, Any]:
    return {
        "base_us": _us(row[f"{metric}_base_ns"]),
        "cand_us": _us(row[f"{metric}_cand_ns"]),
        "delta_us": _us(row[f"{metric}_delta_ns"]),
        "ratio": _round(row[f"{metric}_ratio"], 6),
        "ci_low_us": _us(row[f"{metric}_ci_low_ns"]),
        "ci_high_us": _us(row[f"{metric}_ci_high_ns"]),
        "p_value": _round(row[f"{metric}_p_value"]),
        "p_adjusted": _round(row[f"{metric}_p_adjusted"]),
        "history_low_us": _us(row[f"{metric}_history_low_ns"]),
        "history_high_us": _us(row[f"{metric}_history_high_ns"]),
        **({"history_us": None if row["self_history_ns"] is None else [_us(v) for v in row["self_history_ns"]]}
           if metric == "self" else {}),
    }


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else round(float(fraction) * 100, 4)


def _share(row: dict[str, Any], metric: str) -> dict[str, Any]:
    m = f"{metric}_share"
    return {
        "base_pct": _pct(row[f"{m}_base"]),
        "cand_pct": _pct(row[f"{m}_cand"]),
        "delta_pct": _pct(row[f"{m}_delta"]),
        "ratio": _round(row[f"{m}_ratio"], 6),
        "vs_rest_ratio": _round(row[f"{metric}_vs_rest"], 6),
        "vs_typical_ratio": _round(row[f"{metric}_vs_typical"], 6),
        "noise_p_adjusted": _round(row[f"{metric}_noise_p_adjusted"]),
        "ci_low_pct": _pct(row[f"{m}_ci_low"]),
        "ci_high_pct": _pct(row[f"{m}_ci_high"]),
        "p_value": _round(row[f"{m}_p_value"]),
        "p_adjusted": _round(row[f"{m}_p_adjusted"]),
        **({"history_low_pct": _pct(row["self_share_history_low"]),
            "history_high_pct": _pct(row["self_share_history_high"])} if metric == "self" else {}),
    }


def _calls(row: dict[str, Any], side: str) -> dict[str, float]:
    return {q: row[f"{side}_{q}"] for q in ("min", "median", "max")}


def document(
    result: DiffResult,
    base: dict[str, Any],
    cand: dict[str, Any],
    options: DiffOptions,
    fail_on: str,
) -> dict[str, Any]:
    """The JSON document of a diff (see the module docstring for its keys)."""
    s = result.summary
    summary = {
        "compared": s["compared"],
        "regressions": s["regressions"],
        "improvements": s["improvements"],
        "inherited": s["inherited"],
        "structure_changes": s["structure_changes"],
        "counter_changes": s.get("counter_changes", 0),
        "step_ratio": _round(s["step_ratio"], 6),  # type: ignore[arg-type]
        "step_p_value": _round(s["step_p_value"]),  # type: ignore[arg-type]
        "step_changed": s["step_changed"],
        "min_p_value": _round(s["min_p_value"]),  # type: ignore[arg-type]
        "history_runs": s.get("history_runs", 1),
        "step_verdict": s.get("step_verdict"),
        "history_step_low_us": _us(s.get("history_step_low_ns")),  # type: ignore[arg-type]
        "history_step_high_us": _us(s.get("history_step_high_ns")),  # type: ignore[arg-type]
        "history_step_level_low_us": _us(s.get("history_step_level_low_ns")),  # type: ignore[arg-type]
        "history_step_level_high_us": _us(s.get("history_step_level_high_ns")),  # type: ignore[arg-type]
        "order_varies": bool(s.get("order_varies", False)),
        "step_adjusted": bool(s.get("step_adjusted", False)),
        "step_measure": s.get("step_measure"),
        "step_spreads": {m: _round(v, 6) for m, v in dict(s.get("step_spreads") or {}).items()},  # type: ignore[call-overload]
        "adjusted_step_ratio": _round(s.get("adjusted_step_ratio"), 6),  # type: ignore[arg-type]
        "cpu_step_ratio": _round(s.get("cpu_step_ratio"), 6),  # type: ignore[arg-type]
        "step_confirming": s.get("step_confirming"),
        "step_unconfirmed": bool(s.get("step_unconfirmed", False)),
        "step_bounds": None if s.get("step_bounds") is None else [_round(v, 6) for v in s["step_bounds"]],  # type: ignore[attr-defined]
        "cand_speed_ratio": _round(s.get("cand_speed_ratio"), 6),  # type: ignore[arg-type]
        "speed_reference_us": _us(s.get("speed_reference_ns")),  # type: ignore[arg-type]
        "speed_note": s.get("speed_note"),
    }
    summary["failed"] = result.failed(fail_on)
    summary["exit_code"] = result.exit_code(fail_on)
    timing = [
        {
            "fqn": r["fqn"],
            "phase": r["phase"],
            "verdict": r["verdict"],
            "impact_us": _us(r["impact_ns"]),
            "impact_pct": _round(r["impact_pct"]),
            "steps_base": r["n_base"],
            "steps_cand": r["n_cand"],
            "calls_base": r["calls_base"],
            "calls_cand": r["calls_cand"],
            "self": _stats(r, "self"),
            "inclusive": _stats(r, "incl"),
            "self_share": _share(r, "self"),
            "inclusive_share": _share(r, "incl"),
        }
        for r in result.timing.iter_rows(named=True)
    ]
    order = None
    if result.divergence is not None:
        d = result.divergence
        order = {
            "rank_base": d.rank_base,
            "rank_cand": d.rank_cand,
            "step_base": d.step_base,
            "step_cand": d.step_cand,
            "position": d.position,
            "excerpt": d.excerpt.to_dicts(),
        }
    return {
        "format": FORMAT,
        "base": {"history": None, "selector": None, **base, "steps": s["base_steps"], "step_us": _us(s["base_step_ns"])},  # type: ignore[arg-type]
        "cand": {**cand, "steps": s["cand_steps"], "step_us": _us(s["cand_step_ns"])},  # type: ignore[arg-type]
        "options": {
            "threshold_pct": round(options.threshold * 100, 6),
            "share_threshold_pct": round(options.share_threshold * 100, 6),
            "level_pct": round(options.low_quantile * 100, 6),
            "min_delta_us": round(options.min_delta_ns / 1000, 6),
            "alpha": options.alpha,
            "skip_steps": options.skip_steps,
            "phases": list(options.phases) if options.phases is not None else None,
            "fail_on": fail_on,
            "absolute": options.absolute,
        },
        "summary": summary,
        "timing": timing,
        "structure": result.structure.to_dicts(),
        "counters": None if result.counters is None else result.counters.to_dicts(),
        "calls_per_step": [
            {"fqn": r["fqn"], "phase": r["phase"], "base": _calls(r, "base"), "cand": _calls(r, "cand"),
             "changed": r["changed"]}
            for r in result.calls.iter_rows(named=True)
        ],
        "order": order,
    }
