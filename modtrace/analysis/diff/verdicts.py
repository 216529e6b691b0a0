"""Timing: the filled samples of the base run(s) and the candidate -> per (module, phase)
statistics (shown), the rule's checks on levels (judged) and a verdict.  Each check is one
expression named as in docs/diff.md ("The rule"), where the rule is stated.
"""

from __future__ import annotations

import math

import polars as pl

from modtrace.analysis.diff.frames import (
    CHECK_TYPE,
    PPB,
    SHARE_METRICS,
    TIMING_COLUMNS,
    VERDICTS,
    DiffOptions,
    key_fqn,
    key_phase_name,
)
from modtrace.analysis.diff.stats import (
    holm,
    laplace_noise_p,
    min_p_value,
    normal_quantile,
    two_sample_stats,
)

# The four metrics of a key: (name, sample column).
_METRIC_COLUMNS = (("self", "self_ns"), ("incl", "incl_ns"), ("self_share", "self_share"), ("incl_share", "incl_share"))


def compare_timing(
    base: pl.DataFrame, cand: pl.DataFrame, names: pl.DataFrame, options: DiffOptions,
    *, n_base: int, n_cand: int, step_ns: float | None = None, history: pl.DataFrame | None = None,
    base_levels: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Filled samples of the base runs (pooled) and the candidate (``fill_steps``; ``n_base`` /
    ``n_cand`` compared steps) -> the timing frame (``TIMING_COLUMNS``) of the keys both have.

    ``step_ns`` (the base runs' median step time) gives ``impact_pct``; ``history``
    (``run.run_ranges``) the history columns; ``base_levels`` each base run's ``low_levels``.
    """
    keys = (
        base.select("key").unique().join(cand.select("key").unique(), on="key")
        .sort("key").with_row_index("k").with_columns(pl.col("k").cast(pl.Int64))
    )
    n_keys = keys.height
    if n_keys == 0 or n_base == 0 or n_cand == 0:
        return _empty_timing()
    b = base.join(keys, on="key")
    c = cand.join(keys, on="key")
    confidence = 1.0 - options.alpha
    z = normal_quantile(0.5 + confidence / 2)
    wide = keys
    metrics = _METRIC_COLUMNS
    stats = [two_sample_stats(b, c, column, n_keys, n_base, n_cand, confidence, z) for _, column in metrics]
    for (metric, _), st in zip(metrics, stats, strict=True):
        share = metric in SHARE_METRICS
        scale = 1.0 / PPB if share else 1.0
        unit = "" if share else "_ns"
        delta = pl.col("c_median") - pl.col("b_median")
        st = st.select(
            "k",
            (pl.col("b_median") * scale).alias(f"{metric}_base{unit}"),
            (pl.col("c_median") * scale).alias(f"{metric}_cand{unit}"),
            (delta * scale).alias(f"{metric}_delta{unit}"),
            pl.when(pl.col("b_median") > 0).then(pl.col("c_median") / pl.col("b_median")).alias(f"{metric}_ratio"),
            ((delta - pl.col("spread")) * scale).alias(f"{metric}_ci_low{unit}"),
            ((delta + pl.col("spread")) * scale).alias(f"{metric}_ci_high{unit}"),
            pl.col("p_value").alias(f"{metric}_p_value"),
        )
        st = st.with_columns(holm(st[f"{metric}_p_value"]).alias(f"{metric}_p_adjusted"))
        wide = wide.join(st, on="k")
    calls = (
        b.group_by("k").agg(pl.col("calls").median().alias("calls_base"))
        .join(c.group_by("k").agg(pl.col("calls").median().alias("calls_cand")), on="k")
    )
    frame = wide.join(calls, on="k", how="left").with_columns(
        key_fqn(pl.col("key"), names).alias("fqn"),
        key_phase_name(pl.col("key")).alias("phase"),
        pl.lit(n_base, dtype=pl.Int64).alias("n_base"),
        pl.lit(n_cand, dtype=pl.Int64).alias("n_cand"),
        _vs_rest("self_share").alias("self_vs_rest"),
        _vs_rest("incl_share").alias("incl_vs_rest"),
        pl.col("self_delta_ns").alias("impact_ns"),
    )
    frame = frame.with_columns(_noise_p(frame, "self"), _noise_p(frame, "incl"))
    if history is None:
        frame = frame.with_columns(*(pl.lit(None, dtype=pl.Float64).alias(c) for c in _HISTORY_COLUMNS),
                                   pl.lit(None, dtype=pl.List(pl.Float64)).alias("self_history_ns"))
    else:
        frame = frame.join(history, on="key", how="left").with_columns(
            *(pl.col(f"{m}_{b}").cast(pl.Float64).alias(f"{m}_history_{b}_ns") for m in ("self", "incl")
              for b in ("low", "high")),
            *((pl.col(f"self_share_{b}") / PPB).alias(f"self_share_history_{b}") for b in ("low", "high")),
            pl.col("self_runs").alias("self_history_ns"),
        )
    levels = compare_levels(low_levels(base, options.low_quantile) if base_levels is None else base_levels,
                            low_levels(cand, options.low_quantile))
    frame = frame.join(levels, on="key", how="left").with_columns(
        # the rule's ratio to the typical module (``compare_levels``) is the one shown
        *(pl.col(f"_{m}_vs_typical").alias(f"{m}_vs_typical") for m in ("self", "incl")),
    )
    min_p = min_p_value(n_base, n_cand)
    frame = frame.with_columns(
        module_checks("self", options, min_p).alias("checks"),
        module_checks("incl", options, min_p).alias("inclusive_checks"),
        _direction("self").alias("_direction"),
    )
    blamed = _all_passed("checks")
    frame = frame.with_columns(
        (blamed & (pl.col("_direction") > 0)).alias("_regression"), (blamed & (pl.col("_direction") < 0)).alias("_improvement"))
    frame = frame.with_columns(_inherited(frame, options).alias("_inherited"))
    frame = frame.with_columns(
        pl.when("_regression").then(pl.lit("regression"))
        .when("_improvement").then(pl.lit("improvement"))
        .when("_inherited").then(pl.lit("inherited"))
        .otherwise(pl.lit("unchanged"))
        .alias("verdict")
    )
    order = pl.col("verdict").replace_strict(list(VERDICTS), list(range(len(VERDICTS))), return_dtype=pl.Int8)
    sort_key = (
        pl.when(pl.col("verdict") == "regression").then(-pl.col("impact_ns"))
        .when(pl.col("verdict") == "improvement").then(pl.col("impact_ns"))
        .when(pl.col("verdict") == "inherited").then(-pl.col("incl_delta_ns").abs())
        .otherwise(-pl.col("impact_ns").abs())
    )
    frame = frame.with_columns(order.alias("_order"), sort_key.alias("_impact"))
    frame = frame.sort("_order", "_impact", "fqn", "phase").with_columns(
        (pl.col("impact_ns") / step_ns * 100 if step_ns else pl.lit(None, dtype=pl.Float64)).alias("impact_pct")
    )
    return frame.select(list(TIMING_COLUMNS)).with_columns(
        pl.col("calls_base", "calls_cand").cast(pl.Float64)
    )


_HISTORY_COLUMNS = tuple(c for c in TIMING_COLUMNS if "_history_" in c and c != "self_history_ns")


def low_levels(samples: pl.DataFrame, quantile: float, run: pl.Expr | None = None) -> pl.DataFrame:
    """Filled samples -> per (``_run``, key) the levels (docs/diff.md, "Levels"): ``self_level``,
    ``incl_level`` and their shares of the run's level step, ``self_level_share``,
    ``incl_level_share``.  ``run`` numbers the runs pooled in ``samples``; None: one run."""
    levels = samples.group_by((pl.lit(0) if run is None else run).alias("_run"), "key").agg(
        pl.col("self_ns").cast(pl.Float64).quantile(quantile, "linear").alias("self_level"),
        pl.col("incl_ns").cast(pl.Float64).quantile(quantile, "linear").alias("incl_level"),
    )
    total = pl.col("self_level").sum().over("_run")
    return levels.with_columns(
        *(pl.when(total > 0).then(pl.col(f"{m}_level") / total).alias(f"{m}_level_share") for m in ("self", "incl"))
    )


def compare_levels(base: pl.DataFrame, cand: pl.DataFrame) -> pl.DataFrame:
    """``low_levels`` of the base run(s) and of the candidate -> per key, for m in self and incl:
    the reference level ``_{m}_ref``, the base runs' lowest, median and highest level share
    (``_{m}_share_lo``, ``_mid``, ``_hi``), the candidate's (``_{m}_cand``, ``_{m}_share_cand``)
    and ``_{m}_vs_typical`` (check ``vs_typical``'s value)."""
    refs = base.group_by("key").agg(
        *(pl.col(f"{m}_level").median().alias(f"_{m}_ref") for m in ("self", "incl")),
        *(agg(f"{m}_level_share").alias(f"_{m}_share_{n}") for m in ("self", "incl")
          for n, agg in (("lo", pl.min), ("mid", pl.median), ("hi", pl.max))),
    )
    out = refs.join(cand.select("key", *(pl.col(f"{m}_level").alias(f"_{m}_cand") for m in ("self", "incl")),
                                *(pl.col(f"{m}_level_share").alias(f"_{m}_share_cand") for m in ("self", "incl"))),
                    on="key")
    ratios = [pl.when(pl.col(f"_{m}_share_mid") > 0).then(pl.col(f"_{m}_share_cand") / pl.col(f"_{m}_share_mid"))
              for m in ("self", "incl")]
    out = out.with_columns(*(r.alias(f"_{m}_share_ratio") for r, m in zip(ratios, ("self", "incl"), strict=True)))
    return out.with_columns(
        *((pl.col(f"_{m}_share_ratio") / pl.col(f"_{m}_share_ratio").median()).alias(f"_{m}_vs_typical") for m in ("self", "incl"))
    )


def _direction(metric: str) -> pl.Expr:
    """+1 where the candidate's level lies above the reference level, else -1."""
    return pl.when(pl.col(f"_{metric}_cand") > pl.col(f"_{metric}_ref")).then(1).otherwise(-1)


def _check(name: str, value: pl.Expr, bar_up: pl.Expr, bar_down: pl.Expr, direction: pl.Expr) -> pl.Expr:
    """One check (``CHECK_TYPE``): passed when ``value`` lies above ``bar_up`` (slower) or below
    ``bar_down`` (faster), as ``direction`` says."""
    bar = pl.when(direction > 0).then(bar_up).otherwise(bar_down).cast(pl.Float64)
    value = value.cast(pl.Float64).fill_nan(None)  # polars orders NaN above every number
    passed = pl.when(direction > 0).then(value > bar).otherwise(value < bar).fill_null(False)
    return pl.struct(pl.lit(name).alias("name"), value.alias("value"), bar.alias("bar"), passed.alias("passed"))


def module_checks(metric: str, options: DiffOptions, min_p: float) -> pl.Expr:
    """The checks of ``metric`` (self, incl) of every key, as a list (docs/diff.md, "A module")."""
    m, d = metric, _direction(metric)
    ref, cand = pl.col(f"_{m}_ref"), pl.col(f"_{m}_cand")
    delta_us = options.min_delta_ns / 1000
    checks: dict[str, pl.Expr] = {
        # any p needs enough steps on both sides: the smallest the test can reach, below alpha
        "steps": pl.struct(pl.lit("steps").alias("name"), pl.lit(min_p, pl.Float64).alias("value"),
                           pl.lit(options.alpha, pl.Float64).alias("bar"), pl.lit(min_p < options.alpha).alias("passed")),
        "level_delta_us": _check("level_delta_us", (cand - ref) / 1000, pl.lit(delta_us), pl.lit(-delta_us), d),
    }
    if options.absolute:
        p = pl.col(f"{m}_p_adjusted")
        checks["p_holm"] = _check("p_holm", p, pl.lit(options.alpha), pl.lit(options.alpha), -pl.lit(1))
        level = options.margin("level")
        checks["level_ratio"] = _check("level_ratio", pl.when(ref > 0).then(cand / ref), pl.lit(1 + level),
                                       pl.lit(1 - level), d)
    else:
        # beyond every base run's share by the margin, or by the base runs' own spread when wider
        spread = (pl.col(f"_{m}_share_hi") - pl.col(f"_{m}_share_lo")) / pl.col(f"_{m}_share_mid")
        margin = pl.max_horizontal(pl.lit(options.margin("share")), spread.fill_nan(0.0).fill_null(0.0))
        share = pl.col(f"_{m}_share_cand")
        nearest = pl.when(d > 0).then(pl.col(f"_{m}_share_hi")).otherwise(pl.col(f"_{m}_share_lo"))
        checks["share_ratio"] = _check("share_ratio", pl.when(nearest > 0).then(share / nearest), 1 + margin,
                                       1 - margin, d)
        typical = options.share_threshold
        checks["vs_typical"] = _check("vs_typical", pl.col(f"_{m}_vs_typical"), pl.lit(1 + typical),
                                      pl.lit(1 / (1 + typical)), d)
        median = options.margin("median")
        checks["median_ratio"] = _check("median_ratio", pl.col(f"{m}_ratio"), pl.lit(1 + median),
                                        pl.lit(1 / (1 + median)), d)
    return pl.concat_list([e for name, e in checks.items() if name not in options.skip_checks])


def _all_passed(column: str) -> pl.Expr:
    return pl.col(column).list.eval(pl.element().struct.field("passed")).list.all()


def _inherited(frame: pl.DataFrame, options: DiffOptions) -> pl.Series:
    """Per row, whether the module is ``inherited`` (docs/diff.md, "A module")."""
    inclusive = frame.select(_all_passed("inclusive_checks"))["inclusive_checks"].to_list()
    moved = frame.select((pl.col("_incl_cand") - pl.col("_incl_ref")).abs() > options.min_delta_ns)
    moved_list = moved.to_series().fill_null(False).to_list()
    keys = list(frame.select("fqn", "phase", "_regression", "_improvement").iter_rows())
    by_phase: dict[str, list[tuple[str, bool]]] = {}
    for fqn, phase, reg, imp in keys:
        by_phase.setdefault(phase, []).append((fqn + ".", bool(reg or imp)))
    out = []
    for (fqn, phase, reg, imp), incl, mv in zip(keys, inclusive, moved_list, strict=True):
        below = [b for name, b in by_phase[phase] if name.startswith(fqn + ".")]
        out.append(bool(below) and not (reg or imp) and (bool(incl) or (mv and any(below))))
    return pl.Series(out, dtype=pl.Boolean)


def _empty_timing() -> pl.DataFrame:
    schema: dict[str, pl.DataType] = {c: pl.Float64() for c in TIMING_COLUMNS}
    schema.update({"fqn": pl.String(), "phase": pl.String(), "verdict": pl.String(),
                   "n_base": pl.Int64(), "n_cand": pl.Int64(), "self_history_ns": pl.List(pl.Float64()),
                   "checks": pl.List(CHECK_TYPE), "inclusive_checks": pl.List(CHECK_TYPE)})
    return pl.DataFrame(schema=schema)


def _vs_rest(metric: str) -> pl.Expr:
    """Candidate over base of share / (1 - share) at the medians; null when the base share is 0
    or a share is the whole step."""
    sb, sc = pl.col(f"{metric}_base"), pl.col(f"{metric}_cand")
    ok = (sb > 0) & (sb < 1) & (sc < 1)
    return pl.when(ok).then((sc / (1 - sc)) / (sb / (1 - sb)))


def _noise_p(frame: pl.DataFrame, metric: str) -> pl.Series:
    """``{metric}_noise_p_adjusted``, reported, not judged (docs/diff.md): how unlikely each
    module's log ``vs_rest`` is as Laplace noise around the typical module's, Holm-adjusted."""
    logs = [None if v is None or v <= 0 else math.log(v) for v in frame[f"{metric}_vs_rest"].to_list()]
    return holm(laplace_noise_p(logs)).alias(f"{metric}_noise_p_adjusted")
