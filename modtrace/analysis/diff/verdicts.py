"""Timing: the filled samples of two runs -> per (module, phase) statistics and a verdict.

``compare_timing`` gives one row per (fqn, phase) present in both runs.
Four metrics: self and inclusive time per step, and their shares of the
step.  For each: the median per step in each run, their difference
(``delta``) and ratio, a confidence interval of the difference (each
median's standard error from order statistics, McKean-Schrader, combined),
and a two-sided Mann-Whitney U test over the per-step samples, its p-value
Holm-adjusted over all the keys compared (``stats``).

A time *changed* when its adjusted p < ``alpha`` and it moved by more than
``threshold`` (relative) and by more than ``min_delta_ns`` per step.  A
share changed when its adjusted p < ``alpha`` and it moved by more than
``threshold`` relative to the typical module (``_typical``): ``vs_rest`` is
the ratio, candidate over base, of share / (1 - share) at the medians (how
much slower the module got compared with the rest of its step),
``vs_typical`` is ``vs_rest`` over the median ``vs_rest`` of all the
modules compared, and its run-to-run noise p (``noise_p_adjusted``, an
empirical null from all the modules) is below ``alpha`` too.

Why shares: when the machine gets busier or quieter between two
recordings, every module and the step slow down or speed up alike, so
absolute times change everywhere while shares do not move; a module that
really got slower takes a larger share of the step (and every other module
a smaller one: hence against the typical module, not against 1).  So
``verdict``:

- ``regression``: self time got slower (absolute criteria) *and* its share
  of the step grew (share criteria);
- ``improvement``: the same, faster and smaller;
- ``inherited``: self time did not change, inclusive time did by the same
  two criteria, or by the absolute ones above a descendant that is a
  regression or improvement: the change belongs to a descendant (context,
  not blame);
- ``unchanged``.

With ``absolute=True`` only the absolute criteria count (runs recorded on
an equally quiet machine, or a change that slows every module alike and
should be blamed on each).  ``impact_ns`` is the change of median self time
per step: what the module itself adds to (or saves from) every step.  Rows
are sorted regressions first (largest impact first), then improvements,
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
    normal_quantile,
    two_sample_stats,
)

# The four metrics of a key: (name, sample column).
_METRIC_COLUMNS = (("self", "self_ns"), ("incl", "incl_ns"), ("self_share", "self_share"), ("incl_share", "incl_share"))
SLOWER, FASTER = 1, -1


def compare_timing(
    base: pl.DataFrame, cand: pl.DataFrame, names: pl.DataFrame, options: DiffOptions,
    *, n_base: int, n_cand: int, step_ns: float | None = None, history: pl.DataFrame | None = None,
) -> pl.DataFrame:
    """Filled samples of two runs (``fill_steps``; ``n_base`` / ``n_cand`` compared steps) -> timing
    frame (``TIMING_COLUMNS``).

    Only keys present in both runs are compared; the others are structure
    findings.  ``step_ns`` (the base run's median step time) gives ``impact_pct``.  With
    ``history`` (``history.run_ranges``: per key the lowest and highest of the base runs'
    medians; ``base`` then pools those runs' steps) the verdict follows ``_changed_history``.
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
    frame = frame.with_columns(*_typical(frame, "self"), *_typical(frame, "incl"))
    if history is None:
        frame = frame.with_columns(
            *(pl.lit(None, dtype=pl.Float64).alias(c) for c in _HISTORY_COLUMNS),
            _changed("self", options, SLOWER).alias("_sreg"),
            _changed("self", options, FASTER).alias("_simp"),
            (_changed("incl", options, SLOWER) | _changed("incl", options, FASTER)).alias("_inh"),
            (_changed("incl", options, SLOWER, shares=False) | _changed("incl", options, FASTER, shares=False))
            .alias("_inh_abs"),
        )
    else:
        frame = frame.join(history, on="key", how="left").with_columns(
            *(pl.col(f"{m}_{b}").cast(pl.Float64).alias(f"{m}_history_{b}_ns") for m in ("self", "incl")
              for b in ("low", "high")),
            *((pl.col(f"self_share_{b}") / PPB).alias(f"self_share_history_{b}") for b in ("low", "high")),
        )
        frame = frame.with_columns(
            _changed_history("self", options, SLOWER).alias("_sreg"),
            _changed_history("self", options, FASTER).alias("_simp"),
            (_changed_history("incl", options, SLOWER) | _changed_history("incl", options, FASTER)).alias("_inh"),
            (_changed_history("incl", options, SLOWER, shares=False)
             | _changed_history("incl", options, FASTER, shares=False)).alias("_inh_abs"),
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


_HISTORY_COLUMNS = tuple(c for c in TIMING_COLUMNS if "_history_" in c)


def _beyond(value: pl.Expr, low: pl.Expr, high: pl.Expr, threshold: float, direction: int) -> pl.Expr:
    """Whether ``value`` lies beyond the history's range [low, high] by more than ``threshold``
    (relative): above high * (1 + threshold) (slower), or below low * (1 - threshold) (faster)."""
    if direction > 0:
        return value > high * (1 + threshold)
    return value < low * (1 - threshold)


def _changed_history(metric: str, options: DiffOptions, direction: int, *, shares: bool = True) -> pl.Expr:
    """Slower (+1) or faster (-1) than a history of base runs (``analysis.diff.history``): the
    candidate's median per step lies beyond every base run's median by more than ``threshold``
    (``_beyond``), by more than ``min_delta_ns`` from the history's median, and the Mann-Whitney
    test of its steps against the pooled steps of the history is significant (Holm).

    Unless ``options.absolute`` (or not ``shares``), its share of the step must also lie beyond
    the base runs' range of shares by more than ``threshold``: a machine busier than in any base
    run slows every module, a slower module more than the rest.  No test of the share's
    significance: the absolute test stands for it, and a share's steps are noisier than its
    times (the step time it divides by varies with load more than most modules do).
    """
    delta = pl.col(f"{metric}_delta_ns") * direction
    absolute = (
        (pl.col(f"{metric}_p_adjusted") < options.alpha).fill_null(False)
        & (delta > options.min_delta_ns)
        & _beyond(pl.col(f"{metric}_cand_ns"), pl.col(f"{metric}_low"), pl.col(f"{metric}_high"),
                  options.threshold, direction).fill_null(False)
    )
    if options.absolute or not shares:
        return absolute
    share = f"{metric}_share"
    return absolute & _beyond(pl.col(f"{share}_cand") * PPB, pl.col(f"{share}_low"), pl.col(f"{share}_high"),
                              options.threshold, direction).fill_null(False)


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


def _typical(frame: pl.DataFrame, metric: str) -> list[pl.Series]:
    """``{metric}_vs_typical`` and ``{metric}_noise_p_adjusted``: each module's ``vs_rest`` against
    the typical module's, and how unlikely that is as run-to-run noise.

    x = log(vs_rest) of every compared module; the typical module is their
    median m.  Two recordings of the same code on a shared machine differ
    module by module (an op bound by memory slows more than one bound by
    arithmetic when a neighbour loads the machine), with heavier tails than
    a normal law: x - m is taken as Laplace noise whose scale b comes from
    the median absolute deviation (b = MAD / ln 2), an empirical null
    estimated from all the modules of this pair of runs.  The p-value of a
    module, exp(-|x - m| / b), is Holm-adjusted over the modules.  A
    regression of one module does not move the median; a change of most
    modules at once does (``absolute`` judges those).
    """
    vs_rest = frame[f"{metric}_vs_rest"]
    logs = [None if v is None or v <= 0 else math.log(v) for v in vs_rest.to_list()]
    m, scale = laplace_null(pl.Series([x for x in logs if x is not None], dtype=pl.Float64))
    return [
        (vs_rest / math.exp(m)).alias(f"{metric}_vs_typical"),
        holm(laplace_p(logs, m, scale)).alias(f"{metric}_noise_p_adjusted"),
    ]


def _changed(metric: str, options: DiffOptions, direction: int, *, shares: bool = True) -> pl.Expr:
    """Slower (+1) or faster (-1) by the absolute criteria -- significant, larger than
    ``min_delta_ns`` and than ``threshold`` relative to the base -- and, unless
    ``options.absolute`` (or not ``shares``), by the share criteria: its share of the step
    moved the same way, significantly, by more than ``threshold`` relative to the rest of
    the step."""
    base = pl.col(f"{metric}_base_ns")
    delta = pl.col(f"{metric}_delta_ns") * direction
    relative = pl.when(base > 0).then(delta / base).otherwise(pl.lit(math.inf) if direction > 0 else pl.lit(0.0))
    absolute = (
        (pl.col(f"{metric}_p_adjusted") < options.alpha).fill_null(False)
        & (delta > options.min_delta_ns)
        & (relative > options.threshold)
    )
    if options.absolute or not shares:
        return absolute
    share = f"{metric}_share"
    # a module whose base share is 0 has no vs_rest: its share grew (or not), and the absolute
    # criteria judge it
    moved = ((pl.col(f"{metric}_vs_typical") - 1) * direction > options.threshold).fill_null(
        pl.col(f"{share}_delta") * direction > 0
    )
    beyond_noise = (pl.col(f"{metric}_noise_p_adjusted") < options.alpha).fill_null(True)
    return absolute & (pl.col(f"{share}_p_adjusted") < options.alpha).fill_null(False) & moved & beyond_noise
