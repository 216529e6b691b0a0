"""Timing: the filled samples of two runs -> per (module, phase) statistics and a verdict.

``compare_timing`` gives one row per (fqn, phase) present in both runs.
Four metrics: self and inclusive time per step, and their shares of the
step.  For each: the median per step in each run, their difference
(``delta``) and ratio, a confidence interval of the difference (each
median's standard error from order statistics, McKean-Schrader, combined),
and a two-sided Mann-Whitney U test over the per-step samples, its p-value
Holm-adjusted over all the keys compared (``stats``).

The verdict is judged on *levels* (``low_levels``), not on those medians:
a module's level in a run is the ``low_quantile`` (10th percentile) of its
time per step, its level share that level over the sum of every module's
self level.  A busy machine only ever adds time: it preempts the process
for milliseconds in whichever module runs, in most steps of a run when it
is busy enough, so the upper part of a module's times is the machine's and
a low quantile is the module's own.  ``compare_levels`` gives ``vs_typical``:
the candidate's share over the base runs' median share, over the median of
that ratio across the modules compared.  A time *changed* (``_level_changed``)
when its level moved by more than ``min_delta_ns`` from the base runs'
median level, its share lies beyond every base run's share by more than
``threshold`` (relative), and ``vs_typical`` lies beyond 1 by more than
``share_threshold``; against one base run, its median moved the same way
by more than ``threshold`` too (``_median_agrees``); and the runs have
enough steps for a change seen in every step to reach p < ``alpha``.  The Mann-Whitney p, the median shares,
``vs_rest`` and ``noise_p_adjusted`` (``_noise_p``) are reported, not judged.

Why shares: when the machine gets busier or quieter between two
recordings, every module and the step slow down or speed up alike, so
absolute times change everywhere while shares do not move; a module that
really got slower takes a larger share of the step (and every other module
a smaller one: hence against the typical module, not against 1).  So
``verdict``:

- ``regression``: self time got slower by those criteria;
- ``improvement``: the same, faster and smaller;
- ``inherited``: self time did not change, inclusive time did by the same
  criteria, or by the absolute ones above a descendant that is a
  regression or improvement: the change belongs to a descendant (context,
  not blame);
- ``unchanged``.

With ``absolute=True`` only absolute criteria count (runs recorded on an
equally quiet machine, or a change that slows every module alike and should
be blamed on each): the level moved by more than ``threshold`` and
``min_delta_ns`` and the Mann-Whitney p after Holm is below ``alpha``.
``impact_ns`` is the change of median self time per step: what the module
itself adds to (or saves from) every step.  Rows are sorted regressions first (largest impact first), then improvements,
inherited, unchanged.
"""

from __future__ import annotations

import math

import polars as pl

from modtrace.analysis.diff.frames import (
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
    laplace_null,
    laplace_p,
    min_p_value,
    normal_quantile,
    two_sample_stats,
)

# The four metrics of a key: (name, sample column).
_METRIC_COLUMNS = (("self", "self_ns"), ("incl", "incl_ns"), ("self_share", "self_share"), ("incl_share", "incl_share"))
SLOWER, FASTER = 1, -1


def compare_timing(
    base: pl.DataFrame, cand: pl.DataFrame, names: pl.DataFrame, options: DiffOptions,
    *, n_base: int, n_cand: int, step_ns: float | None = None, history: pl.DataFrame | None = None,
    base_levels: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Filled samples of two runs (``fill_steps``; ``n_base`` / ``n_cand`` compared steps) -> timing
    frame (``TIMING_COLUMNS``).

    Only keys present in both runs are compared; the others are structure
    findings.  ``step_ns`` (the base run's median step time) gives ``impact_pct``.  With
    ``history`` (``history.run_ranges``: per key the lowest and highest of the base runs'
    medians, reported; ``base`` then pools those runs' steps) ``base_levels`` holds each base
    run's ``low_levels``, which the verdict judges the candidate against.
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
    quantile = options.low_quantile
    levels = compare_levels(low_levels(base, quantile) if base_levels is None else base_levels,
                            low_levels(cand, quantile))
    # with too few steps no change can be told from noise (the warning of ``min_p_value``)
    enough = min_p_value(n_base, n_cand) < options.alpha
    one_base = history is None and not options.absolute
    frame = frame.join(levels, on="key", how="left").with_columns(
        (_level_changed("self", options, SLOWER) & enough & _median_agrees(options, SLOWER, one_base)).alias("_sreg"),
        (_level_changed("self", options, FASTER) & enough & _median_agrees(options, FASTER, one_base)).alias("_simp"),
        ((_level_changed("incl", options, SLOWER) | _level_changed("incl", options, FASTER)) & enough).alias("_inh"),
        ((_level_changed("incl", options, SLOWER, shares=False)
          | _level_changed("incl", options, FASTER, shares=False)) & enough).alias("_inh_abs"),
        # the rule's ratio to the typical module (``compare_levels``) is the one shown
        *(pl.col(f"_{m}_vt").alias(f"{m}_vs_typical") for m in ("self", "incl")),
    )
    frame = frame.with_columns(
        (pl.col("_inh") | (pl.col("_inh_abs") & _above_blamed(frame))).alias("_inh")
    ).with_columns(
        pl.when("_sreg").then(pl.lit("regression"))
        .when("_simp").then(pl.lit("improvement"))
        .when("_inh").then(pl.lit("inherited"))
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
    frame = frame.with_columns(order.alias("_vo"), sort_key.alias("_sk"))
    frame = frame.sort("_vo", "_sk", "fqn", "phase").with_columns(
        (pl.col("impact_ns") / step_ns * 100 if step_ns else pl.lit(None, dtype=pl.Float64)).alias("impact_pct")
    )
    return frame.select(list(TIMING_COLUMNS)).with_columns(
        pl.col("calls_base", "calls_cand").cast(pl.Float64)
    )


_HISTORY_COLUMNS = tuple(c for c in TIMING_COLUMNS if "_history_" in c and c != "self_history_ns")


def low_levels(samples: pl.DataFrame, quantile: float, run: pl.Expr | None = None) -> pl.DataFrame:
    """Filled samples -> per (``_run``, key) the ``quantile`` of the self and inclusive time per
    step (``self_level``, ``incl_level``) and their shares of the run's level step (the sum of
    every key's self level): ``self_level_share``, ``incl_level_share``.

    Load only ever adds time to a step: a busy neighbour preempts the process in whichever
    module runs, so the upper part of a module's per-step times is the machine's and a low
    quantile is the module's own.  ``run`` numbers the runs pooled in ``samples`` (a history);
    None: one run.
    """
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
    the base runs' median level (``_{m}_ref``), their lowest and highest level share
    (``_{m}_share_lo``, ``_{m}_share_hi``), the candidate's level and share, and ``_{m}_vt``:
    the candidate's share over the base runs' median share, over the median of that ratio
    across every key compared (how much more of the step the module takes than the typical
    module does: machine load moves the typical module too)."""
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
    out = out.with_columns(*(r.alias(f"_{m}_rel") for r, m in zip(ratios, ("self", "incl"), strict=True)))
    return out.with_columns(
        *((pl.col(f"_{m}_rel") / pl.col(f"_{m}_rel").median()).alias(f"_{m}_vt") for m in ("self", "incl"))
    )


def _level_changed(metric: str, options: DiffOptions, direction: int, *, shares: bool = True) -> pl.Expr:
    """Slower (+1) or faster (-1) than the base run(s), on the levels of ``compare_levels``: the
    candidate's level differs from the base runs' median level by more than ``min_delta_ns``
    the same way, and, unless ``options.absolute`` (or not ``shares``), its level share lies
    beyond every base run's by more than ``threshold`` (against a history, by more than the
    spread of the base runs' shares, (highest - lowest) / median, when that is larger) and it
    grew (shrank) against the typical module by more than ``share_threshold``.  With ``absolute`` the share is not
    judged: the level must differ by more than ``threshold`` too, and the Mann-Whitney test of
    the steps be significant (Holm)."""
    m = metric
    delta = (pl.col(f"_{m}_cand") - pl.col(f"_{m}_ref")) * direction
    moved = (delta > options.min_delta_ns).fill_null(False)
    # Beyond the base runs' shares by ``threshold``, or by their own spread when that is wider:
    # what varies from one base run to the next is noise (one base run: no spread, the threshold).
    spread = (pl.col(f"_{m}_share_hi") - pl.col(f"_{m}_share_lo")) / pl.col(f"_{m}_share_mid")
    margin = pl.max_horizontal(pl.lit(options.threshold), spread.fill_nan(0.0).fill_null(0.0))
    if direction > 0:
        share = pl.col(f"_{m}_share_cand") > pl.col(f"_{m}_share_hi") * (1 + margin)
        typical = pl.col(f"_{m}_vt") > 1 + options.share_threshold
    else:
        share = pl.col(f"_{m}_share_cand") < pl.col(f"_{m}_share_lo") * (1 - margin)
        typical = pl.col(f"_{m}_vt") < 1 / (1 + options.share_threshold)
    if options.absolute or not shares:
        significant = (pl.col(f"{m}_p_adjusted") < options.alpha).fill_null(False)
        return moved & significant & (delta > pl.col(f"_{m}_ref") * options.threshold).fill_null(False)
    return moved & share.fill_null(False) & typical.fill_null(False)


def _median_agrees(options: DiffOptions, direction: int, one_base: bool) -> pl.Expr:
    """Against one base run (``one_base``), a module's median self time per step must have moved
    the same way as its level, by more than ``threshold``.  A level is one low quantile of a
    run's few steps: when a busy machine preempts a module in most steps (an oversubscribed CPU,
    modules about a scheduler's slice long), it falls on a preempted step in one run of the two
    while their medians agree (11 A/A false alarms in 30 beside three busy processes, 1 with
    this; docs/performance.md, "Ninth measurement").  A history's own spread of shares already
    widens its bar."""
    if not one_base:
        return pl.lit(True)
    ratio = pl.col("self_ratio")
    moved = ratio > 1 + options.threshold if direction > 0 else ratio < 1 / (1 + options.threshold)
    return moved.fill_null(False)


def _empty_timing() -> pl.DataFrame:
    schema: dict[str, pl.DataType] = {c: pl.Float64() for c in TIMING_COLUMNS}
    schema.update({"fqn": pl.String(), "phase": pl.String(), "verdict": pl.String(),
                   "n_base": pl.Int64(), "n_cand": pl.Int64()})
    return pl.DataFrame(schema=schema)


def _vs_rest(metric: str) -> pl.Expr:
    """Candidate over base of share / (1 - share) at the medians: the module's time relative to the
    rest of the step.  Null when the base share is 0 or a share is the whole step."""
    sb, sc = pl.col(f"{metric}_base"), pl.col(f"{metric}_cand")
    ok = (sb > 0) & (sb < 1) & (sc < 1)
    return pl.when(ok).then((sc / (1 - sc)) / (sb / (1 - sb)))


def _above_blamed(frame: pl.DataFrame) -> pl.Series:
    """Per row: whether a descendant (by name, same phase) is a regression or an improvement.

    An ancestor's inclusive time carries its descendant's change; its share
    of the step may still not move (the root's forward share, when the
    forward and backward of a descendant grew alike), yet it is the context
    of the blamed module.
    """
    blamed: dict[str, list[str]] = {}
    for fqn, phase in frame.filter(pl.col("_sreg") | pl.col("_simp")).select("fqn", "phase").iter_rows():
        blamed.setdefault(phase, []).append(fqn + ".")
    out = [
        inh and any(b.startswith(fqn + ".") for b in blamed.get(phase, ()))
        for fqn, phase, inh in frame.select("fqn", "phase", "_inh_abs").iter_rows()
    ]
    return pl.Series(out, dtype=pl.Boolean)


def _noise_p(frame: pl.DataFrame, metric: str) -> pl.Series:
    """``{metric}_noise_p_adjusted``, reported, not judged: how unlikely each module's
    ``vs_rest`` is as run-to-run noise around the typical module's.

    x = log(vs_rest) of every compared module; the typical module is their
    median m.  Two recordings of the same code on a shared machine differ
    module by module (an op bound by memory slows more than one bound by
    arithmetic when a neighbour loads the machine), with heavier tails than
    a normal law: x - m is taken as Laplace noise whose scale b comes from
    the median absolute deviation (b = MAD / ln 2), an empirical null
    estimated from all the modules of this pair of runs.  The p-value of a
    module, exp(-|x - m| / b), is Holm-adjusted over the modules.  It is
    taken on medians, which a preempted process moves, so the rule judges
    ``vs_typical`` on levels instead (``compare_levels``).
    """
    vs_rest = frame[f"{metric}_vs_rest"]
    logs = [None if v is None or v <= 0 else math.log(v) for v in vs_rest.to_list()]
    m, scale = laplace_null(pl.Series([x for x in logs if x is not None], dtype=pl.Float64))
    return holm(laplace_p(logs, m, scale)).alias(f"{metric}_noise_p_adjusted")
