"""Diff: the calls of two runs -> what changed between them, and which module to blame.

Everything here is a pure function of frames; the CLI reads them from the
store (``modtrace.store.samples.read_closed_calls``) and hands the result to
a renderer.  A run enters as ``RunCalls``: its closed calls (``CALL_SCHEMA``,
integer codes) and its module and device lookups.  ``calls_of_spans`` makes
one from a spans frame (a run analysed in memory, or a test's).  Modules are
matched between the runs by name: every (fqn, phase) gets one integer key
shared by both runs, and names come back only on the few result rows.

Steps (``step_units``)
    The compared steps of a run: each rank's steps after its first
    ``skip_steps`` (step 0 usually pays one-time costs: allocator warm-up,
    lazy initialisation), with ``step_ns``, the time in root spans (depth 0,
    every phase) of that (rank, step).  With several ranks, each (rank, step)
    is one sample.

Samples (``compared_samples`` + ``fill_steps``)
    One row per (rank, step, module, phase): the module's call count and its
    inclusive and self time summed over those calls.  A module that ran in
    some compared steps but not others counts 0 in the others, so a sample is
    always "time per step".  Each sample also has its *share of the step*:
    self (inclusive) time / the (rank, step)'s time in module calls of the
    compared phases (the sum of their self times; without a phase filter,
    the time in root spans), in parts per billion.

Timing (``compare_timing``), one row per (fqn, phase) present in both runs
    Four metrics: self and inclusive time per step, and their shares of the
    step.  For each: the median per step in each run, their difference
    (``delta``) and ratio, a confidence interval of the difference (each
    median's standard error from order statistics, McKean-Schrader,
    combined), and a two-sided Mann-Whitney U test over the per-step samples
    (normal approximation with tie and continuity correction), its p-value
    Holm-adjusted over all the keys compared.

    A time *changed* when its adjusted p < ``alpha`` and it moved by more
    than ``threshold`` (relative) and by more than ``min_delta_ns`` per step.
    A share changed when its adjusted p < ``alpha`` and it moved by more
    than ``threshold`` relative to the typical module (``_typical``):
    ``vs_rest`` is the ratio, candidate over base, of share / (1 - share) at
    the medians (how much slower the module got compared with the rest of
    its step), ``vs_typical`` is ``vs_rest`` over the median ``vs_rest`` of
    all the modules compared, and its run-to-run noise p
    (``noise_p_adjusted``, an empirical null from all the modules) is below
    ``alpha`` too.

    Why shares: when the machine gets busier or quieter between two
    recordings, every module and the step slow down or speed up alike, so
    absolute times change everywhere while shares do not move; a module that
    really got slower takes a larger share of the step (and every other
    module a smaller one: hence against the typical module, not against 1).
    So ``verdict``:

    - ``regression``: self time got slower (absolute criteria) *and* its
      share of the step grew (share criteria);
    - ``improvement``: the same, faster and smaller;
    - ``inherited``: self time did not change, inclusive time did by the same
      two criteria, or by the absolute ones above a descendant that is a
      regression or improvement: the change belongs to a descendant (context,
      not blame);
    - ``unchanged``.

    With ``absolute=True`` only the absolute criteria count (runs recorded
    on an equally quiet machine, or a change that slows every module alike
    and should be blamed on each).  ``impact_ns`` is the change of median
    self time per step: what the module itself adds to (or saves from) every
    step.  Rows are sorted regressions first (largest impact first), then
    improvements, inherited, unchanged.

Structure (``compare_structure``), one row per finding
    ``module_removed`` / ``module_added`` (a module called in one run only),
    ``phase_removed`` / ``phase_added`` (e.g. a recompute that appeared),
    ``calls_changed`` (median calls per step), ``device_changed``,
    ``stream_changed``, and ``order_changed`` (the call sequences of the
    k-th compared step of the lowest rank of each run differ, for the first
    such k; ``first_divergence`` gives an aligned excerpt).

``diff_runs`` (``diff_spans`` for spans frames) runs all of it and returns a
``DiffResult``.
"""

from __future__ import annotations

import difflib
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from statistics import NormalDist

import polars as pl

from modtrace import contracts
from modtrace.analysis.events import lookup_key
from modtrace.contracts import CALL_FRAME

PHASES: tuple[str, ...] = contracts.PHASES  # index = phase code (codes.Phase)
VERDICTS: tuple[str, ...] = ("regression", "improvement", "inherited", "unchanged")
STRUCTURE_KINDS: tuple[str, ...] = (
    "module_removed", "module_added", "phase_removed", "phase_added",
    "calls_changed", "device_changed", "stream_changed", "order_changed",
)
METRICS: tuple[str, ...] = ("self", "incl")
SHARE_METRICS: tuple[str, ...] = ("self_share", "incl_share")
PPB = 1_000_000_000  # shares are computed in parts per billion

# One closed span, as a diff reads it: codes, no names.
CALL_SCHEMA: dict[str, pl.DataType] = CALL_FRAME.polars()

# Per-step samples: ``key`` names (fqn, phase) in both runs (``module_keys``).
SAMPLE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "step": pl.Int32(),
    "key": pl.Int64(),
    "calls": pl.Int64(),
    "incl_ns": pl.Int64(),
    "self_ns": pl.Int64(),
}

STRUCTURE_SCHEMA: dict[str, pl.DataType] = {
    "kind": pl.String(),
    "fqn": pl.String(),
    "phase": pl.String(),
    "base": pl.String(),
    "cand": pl.String(),
    "message": pl.String(),
}

EXCERPT_SCHEMA: dict[str, pl.DataType] = {
    "op": pl.String(),  # = same, - base only, + candidate only, ~ differs
    "base_pos": pl.Int64(),
    "cand_pos": pl.Int64(),
    "base": pl.String(),
    "cand": pl.String(),
}

_STAT_COLUMNS = ("base", "cand", "delta", "ratio", "ci_low", "ci_high", "p_value", "p_adjusted")
_TIME_STATS = tuple(c if c in ("ratio", "p_value", "p_adjusted") else f"{c}_ns" for c in _STAT_COLUMNS)
TIMING_COLUMNS: tuple[str, ...] = (
    "fqn", "phase", "verdict", "impact_ns", "impact_pct", "n_base", "n_cand", "calls_base", "calls_cand",
    *(f"{m}_{c}" for m in METRICS for c in _TIME_STATS),
    # shares of the step as fractions (0.25 = a quarter of the step); delta and CI in fractions too
    *(f"{m}_{c}" for m in SHARE_METRICS for c in _STAT_COLUMNS),
    "self_vs_rest", "incl_vs_rest", "self_vs_typical", "incl_vs_typical",
    "self_noise_p_adjusted", "incl_noise_p_adjusted",
)


@dataclass(frozen=True)
class DiffOptions:
    """What counts as a change.  ``threshold`` is relative (0.10 = 10%)."""

    threshold: float = 0.10
    min_delta_ns: int = 20_000
    alpha: float = 0.01
    skip_steps: int = 1
    phases: tuple[str, ...] | None = None  # None: every phase
    absolute: bool = False  # judge absolute times only (no share-of-step criterion)
    excerpt_context: int = 3
    excerpt_changes: int = 8


@dataclass(frozen=True)
class RunCalls:
    """One side of a diff: closed calls (``CALL_SCHEMA``) and the lookups that name them."""

    calls: pl.DataFrame
    modules: pl.DataFrame  # rank, module_id, fqn (events.MODULE_SCHEMA; other columns ignored)
    devices: pl.DataFrame  # rank, device_id, name (events.DEVICE_SCHEMA)


@dataclass(frozen=True)
class Divergence:
    """Where the call sequences of two aligned steps first differ."""

    rank_base: int
    rank_cand: int
    step_base: int
    step_cand: int
    position: int  # 1-based position of the first differing call in the step
    excerpt: pl.DataFrame  # EXCERPT_SCHEMA


@dataclass(frozen=True)
class DiffResult:
    timing: pl.DataFrame  # TIMING_COLUMNS
    structure: pl.DataFrame  # STRUCTURE_SCHEMA
    divergence: Divergence | None
    summary: dict[str, object] = field(default_factory=dict)


# -- inputs ---------------------------------------------------------------------


def calls_of_spans(spans: pl.DataFrame) -> RunCalls:
    """Spans frame (``spans.SPAN_COLUMNS``) -> ``RunCalls`` of its closed spans."""
    closed = spans.filter(pl.col("duration_ns").is_not_null())
    calls = closed.select(
        *(pl.col(c) for c in CALL_SCHEMA if c != "phase"),
        pl.col("phase").to_physical().cast(pl.Int8),
    ).select(list(CALL_SCHEMA)).cast(CALL_SCHEMA)  # type: ignore[arg-type]
    modules = spans.select("rank", "module_id", pl.col("fqn").cast(pl.String)).unique()
    devices = (
        spans.select("rank", "device_id", pl.col("device").cast(pl.String).alias("name"))
        .drop_nulls("device_id").unique()
    )
    return RunCalls(calls, modules, devices)


def module_keys(*module_frames: pl.DataFrame) -> pl.DataFrame:
    """(fqn, mkey): every module name of these runs, numbered in name order.

    ``key = mkey * 4 + phase`` names (fqn, phase) the same way in both runs.
    """
    names = pl.concat([m.select(pl.col("fqn").cast(pl.String)) for m in module_frames]).unique().sort("fqn")
    return names.with_row_index("mkey").select("fqn", pl.col("mkey").cast(pl.Int64))


def _key_fqn(key: pl.Expr, names: pl.DataFrame) -> pl.Expr:
    return pl.lit(names["fqn"]).gather(key // 4)


def _key_phase(key: pl.Expr) -> pl.Expr:
    return pl.lit(pl.Series(PHASES)).gather(key % 4)


def module_lookup(run: RunCalls) -> pl.DataFrame:
    """(rank, module_id, fqn) of the run's modules; a module its calls name that the lookup lacks
    is ``<module N>``."""
    known = run.modules.select(
        pl.col("rank").cast(pl.Int32), pl.col("module_id").cast(pl.Int32), pl.col("fqn").cast(pl.String)
    ).unique(["rank", "module_id"])
    missing = run.calls.select("rank", "module_id").join(known, on=["rank", "module_id"], how="anti")
    if missing.height == 0:
        return known
    unknown = missing.unique().with_columns(pl.format("<module {}>", "module_id").alias("fqn"))
    return pl.concat([known, unknown])


def with_mkey(calls: pl.DataFrame, lookup: pl.DataFrame, names: pl.DataFrame) -> pl.DataFrame:
    """Calls with ``mkey`` (``module_keys``) from their (rank, module_id)."""
    keys = lookup.join(names, on="fqn").select(lookup_key("rank", "module_id").alias("_mk"), "mkey")
    return calls.with_columns(lookup_key("rank", "module_id").alias("_mk")).join(
        keys, on="_mk", how="left"
    ).drop("_mk")


# -- samples --------------------------------------------------------------------


def compared_calls(calls: pl.DataFrame, skip_steps: int) -> pl.DataFrame:
    """Closed calls of the compared steps: each rank's steps after its first ``skip_steps``."""
    closed = calls.filter(pl.col("duration_ns").is_not_null())
    if skip_steps == 0:
        return closed
    return closed.filter(pl.col("step") >= pl.col("step").min().over("rank") + skip_steps)


def step_units(compared: pl.DataFrame) -> pl.DataFrame:
    """Compared calls (every phase) -> (rank, step, step_ns), sorted: one row per compared step."""
    return (
        compared.group_by("rank", "step")
        .agg(pl.col("duration_ns").filter(pl.col("depth") == 0).sum().cast(pl.Int64).alias("step_ns"))
        .with_columns(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int32))
        .sort("rank", "step")
    )


def _phase_codes(phases: tuple[str, ...] | None) -> list[int] | None:
    return None if phases is None else [PHASES.index(p) for p in phases]


def compared_samples(compared: pl.DataFrame, phases: tuple[str, ...] | None = None) -> pl.DataFrame:
    """Compared calls with ``mkey`` -> per-step samples (``SAMPLE_SCHEMA``) of ``phases``, unordered.

    Only modules that ran in a step have a row for it; ``fill_steps`` adds the zeros.
    """
    codes = _phase_codes(phases)
    sp = compared if codes is None else compared.filter(pl.col("phase").is_in(codes))
    sums = (
        pl.len().alias("calls"),
        pl.col("duration_ns").sum().alias("incl_ns"),
        pl.col("self_ns").sum().alias("self_ns"),
    )
    key = pl.col("mkey") * 4 + pl.col("phase").cast(pl.Int64)
    if sp.height == 0:
        return pl.DataFrame(schema=SAMPLE_SCHEMA)
    r0, r1, s0, s1, m1 = sp.select(
        pl.col("rank").min().alias("r0"), pl.col("rank").max().alias("r1"), pl.col("step").min().alias("s0"),
        pl.col("step").max().alias("s1"), pl.col("mkey").max().alias("m1"),
    ).row(0)
    ranks, steps, keys = r1 - r0 + 1, s1 - s0 + 1, (m1 + 1) * 4
    if ranks * steps * keys >= 2**62:
        grouped = sp.group_by("rank", "step", key.alias("key")).agg(*sums)
    else:
        # One Int64 group key (rank, step, key), sorted first: a sorted key is grouped without
        # hashing, which matters as most groups hold one call (a module called once per step).
        g = ((pl.col("rank").cast(pl.Int64) - r0) * steps + (pl.col("step").cast(pl.Int64) - s0)) * keys + key
        rest = pl.col("_g") // keys
        grouped = sp.select(g.alias("_g"), "duration_ns", "self_ns").sort("_g").group_by("_g").agg(*sums).with_columns(
            (rest // steps + r0).alias("rank"), (rest % steps + s0).alias("step"), (pl.col("_g") % keys).alias("key")
        )
    return grouped.select(list(SAMPLE_SCHEMA)).cast(SAMPLE_SCHEMA)  # type: ignore[arg-type]


def fill_steps(samples: pl.DataFrame, units: pl.DataFrame) -> pl.DataFrame:
    """Samples with a zero row for every compared (rank, step) in which a module did not run,
    and the shares of the step (``self_share``, ``incl_share``, parts per billion).

    A share's denominator is the time of the step in module calls of the
    sampled phases: the sum of every sample's self time in that (rank, step)
    (self times partition the time of the root spans, and a phase filter
    keeps the phases it compares).  Only modules missing from some step get
    rows added (usually none).
    """
    totals = samples.group_by("rank", "step").agg(pl.col("self_ns").sum().alias("_total"))
    counts = samples.group_by("key").agg(pl.len().alias("_n"))
    short = counts.filter(pl.col("_n") < units.height).select("key")
    if short.height:
        grid = short.join(units.select("rank", "step"), how="cross")
        missing = grid.join(samples, on=["rank", "step", "key"], how="anti")
        zeros = missing.select(
            "rank", "step", "key",
            *(pl.lit(0, dtype=pl.Int64).alias(c) for c in ("calls", "incl_ns", "self_ns")),
        )
        samples = pl.concat([samples, zeros.select(samples.columns).cast(samples.schema)])
    total = pl.col("_total").cast(pl.Float64)

    def share(column: str) -> pl.Expr:
        return (
            pl.when(pl.col("_total") > 0).then(pl.col(column).cast(pl.Float64) * PPB / total).otherwise(0.0)
            .round().cast(pl.Int64)
        )

    return (
        samples.with_columns(lookup_key("rank", "step").alias("_u"))
        .join(totals.select(lookup_key("rank", "step").alias("_u"), "_total"), on="_u", how="left")
        .with_columns(share("self_ns").alias("self_share"), share("incl_ns").alias("incl_share"))
        .drop("_u", "_total")
    )


# -- statistics -----------------------------------------------------------------


def normal_quantile(p: float) -> float:
    return NormalDist().inv_cdf(p)


def two_sided_p(z: float | None) -> float | None:
    """p of a standard normal |Z| >= z."""
    if z is None or math.isnan(z):
        return None
    return math.erfc(abs(z) / math.sqrt(2.0))


def min_p_value(n_base: int, n_cand: int) -> float:
    """The smallest p the Mann-Whitney test (normal approximation) can give for these sample sizes."""
    if n_base < 1 or n_cand < 1:
        return 1.0
    prod = n_base * n_cand
    sd = math.sqrt(prod * (n_base + n_cand + 1) / 12.0)
    p = two_sided_p((prod / 2.0 - 0.5) / sd)
    return 1.0 if p is None else p


def holm(p_values: pl.Series) -> pl.Series:
    """Holm-adjusted p-values (family-wise error over all the keys compared); nulls stay null.

    With one test per module and phase, some raw p < 0.01 are expected by
    chance alone in a large model; the adjusted ones are < alpha only for
    changes that are real with probability 1 - alpha over the whole family.
    """
    values = p_values.to_list()
    present = sorted((p, i) for i, p in enumerate(values) if p is not None)
    m = len(present)
    out: list[float | None] = [None] * len(values)
    running = 0.0
    for rank, (p, i) in enumerate(present):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return pl.Series(p_values.name, out, dtype=pl.Float64)


def sort_within(key: pl.Series, value: pl.Series) -> pl.DataFrame:
    """(key, value) rows sorted by key, then value: ``k`` (Int64) and ``x`` (Int64).

    Both must be non-negative integers.  Packed into one Int64 when they fit
    (one single-column sort, several times faster than sorting two columns).
    """
    k = key.cast(pl.Int64)
    x = value.cast(pl.Int64)
    if k.len() == 0:
        return pl.DataFrame({"k": k, "x": x})
    width = int(x.max()) + 1
    if (int(k.max()) + 1) * width < 2**63:
        packed = (k * width + x).sort()
        # k is sorted: flagged so, group_by("k") takes its fast path (no hashing)
        return pl.DataFrame({"k": (packed // width).set_sorted(), "x": packed % width})
    return pl.DataFrame({"k": k, "x": x}).sort("x").sort("k", maintain_order=True)


def rank_sums(key: pl.Series, side: pl.Series, value: pl.Series) -> pl.DataFrame:
    """Per key ``k`` of two samples (``side`` 0 and 1) of integers: n, n1, r1 (sum of the average
    ranks of side 1 in the pooled sample) and tie (sum over blocks of t equal values of t^3 - t)."""
    v = value.cast(pl.Int64)
    shift = int(v.min()) if v.len() else 0
    return _rank_sums_sorted(sort_within(key, (v - shift) * 2 + side.cast(pl.Int64)))


def _mw_p(sums: pl.DataFrame) -> pl.DataFrame:
    """``rank_sums`` -> k, u (U of side 1) and p_value (normal approximation, tie-corrected
    variance, continuity correction; null when a side is empty, 1.0 when every value is tied)."""
    n1 = pl.col("n1")
    big_n = pl.col("n")
    n0 = big_n - n1
    per = sums.with_columns(
        (pl.col("r1") - n1 * (n1 + 1) / 2).alias("u"),
        (n0 * n1 / 12 * ((big_n + 1) - pl.col("tie") / (big_n * (big_n - 1)))).alias("_var"),
    ).with_columns(
        pl.when((n0 > 0) & (n1 > 0) & (pl.col("_var") > 1e-9))
        .then(((pl.col("u") - n0 * n1 / 2).abs() - 0.5).clip(lower_bound=0) / pl.col("_var").sqrt())
        .alias("_z"),
        ((n0 > 0) & (n1 > 0)).alias("_ok"),
    )
    p = [
        (two_sided_p(z) if z is not None else 1.0) if ok else None
        for z, ok in zip(per["_z"].to_list(), per["_ok"].to_list(), strict=True)
    ]
    return per.select("k", "u", pl.Series("p_value", p, dtype=pl.Float64))


def mann_whitney(long: pl.DataFrame) -> pl.DataFrame:
    """Two-sided Mann-Whitney U per ``key`` of ``long`` (key, side 0 base / 1 cand, v integer).

    Returns key, ``u`` (U of the candidate) and ``p_value``.  The ranks come
    from one sort of (key, v); the tie term sum(t^3 - t) sums t^2 - 1 over
    the t rows of each block of equal values.
    """
    out = _mw_p(rank_sums(long["key"], long["side"], long["v"]))
    return out.select(pl.col("k").alias("key"), "u", "p_value")


def _order_stat_positions(n: int, confidence: float) -> tuple[int, int, int, int, float]:
    """0-based positions of (median low, median high, lower, upper order statistic) in n sorted values, and z.

    McKean-Schrader: se = (x[n - c + 1] - x[c]) / (2 z), c = round((n + 1) / 2
    - z sqrt(n) / 2), x sorted (1-based), z the normal quantile of ``confidence``.
    """
    z = normal_quantile(0.5 + confidence / 2)
    c = max(1, round((n + 1) / 2 - z * math.sqrt(n) / 2))
    return (n - 1) // 2, n // 2, c - 1, n - c, z


def _block_stats(sorted_x: pl.Series, n_keys: int, n: int, confidence: float, prefix: str) -> pl.DataFrame:
    """Median and its standard error of ``n_keys`` blocks of ``n`` sorted values each."""
    lo, hi, a, b, z = _order_stat_positions(n, confidence)
    base = pl.int_range(n_keys, dtype=pl.Int64, eager=True) * n
    x = sorted_x.cast(pl.Float64)

    def at(i: int) -> pl.Series:
        out: pl.Series = x.gather(base + i)
        return out

    return pl.DataFrame({
        "k": pl.int_range(n_keys, dtype=pl.Int64, eager=True),
        f"{prefix}median": (at(lo) + at(hi)) / 2,
        f"{prefix}se": (at(b) - at(a)) / (2 * z),
    })


def median_summary(samples: pl.DataFrame, column: str, confidence: float) -> pl.DataFrame:
    """Per ``key`` of filled samples: n, median of ``column`` and its standard error (McKean-Schrader)."""
    counts = samples.group_by("key").agg(pl.len().alias("_n")).sort("key")
    sizes = set(counts["_n"].to_list())
    if len(sizes) > 1:
        raise ValueError("median_summary needs the same number of samples for every key (use fill_steps)")
    n = sizes.pop() if sizes else 0
    dense = counts.with_row_index("_g").select("key", pl.col("_g").cast(pl.Int64))
    s = samples.join(dense, on="key")
    v = s[column].cast(pl.Int64)
    shift = int(v.min()) if v.len() else 0
    ordered = sort_within(s["_g"], v - shift)
    stats = _block_stats(ordered["x"] + shift, dense.height, n, confidence, "")
    return dense.join(stats, left_on="_g", right_on="k").select(
        "key", pl.lit(n, dtype=pl.Int64).alias("n"), "median", "se"
    )


def _metric(base: pl.DataFrame, cand: pl.DataFrame, column: str, n_keys: int, n_b: int, n_c: int,
            confidence: float, z: float) -> pl.DataFrame:
    """Filled samples of both runs (dense key ``k`` in [0, n_keys), ``n_b`` / ``n_c`` rows per key)
    -> per k: medians, standard errors, U and p of ``column``, from one sort.

    The hot loop of a diff (four metrics of every module and step of both
    runs).  Every key has n = n_b + n_c values, so after one sort of
    (k, value, side) packed into an Int64 the key of row i is i // n and its
    position in the key i % n: ranks, rank sums and order statistics need no
    grouping (``rank_sums`` is the general form, for unequal groups).
    """
    n = n_b + n_c
    key = pl.concat([base["k"], cand["k"]]).cast(pl.Int64)
    v = pl.concat([base[column], cand[column]]).cast(pl.Int64)
    side = pl.concat([pl.zeros(base.height, pl.Int64, eager=True), pl.ones(cand.height, pl.Int64, eager=True)])
    shift = int(v.min())
    width = (int(v.max()) - shift) * 2 + 2
    if n_keys * width >= 2**63:
        return _metric_grouped(key, side, v, n_keys, n_b, n_c, confidence, z)
    x = ((key * width + (v - shift) * 2 + side).sort() % width).alias("x")
    # A run of t equal values at positions f..l (0-based, in its key) has the average rank
    # (f + l + 2) / 2 for each and adds t^3 - t (t^2 - 1 per value) to the tie term.
    pos = pl.col("_i") % n
    u = pl.col("x") // 2
    lo = pl.when((pos == 0) | (u != u.shift(1))).then(pos).forward_fill()
    hi = pl.when((pos == n - 1) | (u != u.shift(-1))).then(pos).backward_fill()
    rows = (
        pl.DataFrame(x).lazy()
        .with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("_i"))
        .select(u.alias("_u"), (pl.col("x") % 2).alias("_s"), lo.alias("_lo"), hi.alias("_hi"))
        .select("_u", "_s", ((pl.col("_lo") + pl.col("_hi") + 2) * pl.col("_s")).alias("_r2"),
                ((pl.col("_hi") - pl.col("_lo") + 1) ** 2 - 1).alias("_t"))
        .collect()
    )

    def per_key(column: str) -> pl.Series:
        out: pl.Series = rows[column].reshape((n_keys, n)).arr.sum().cast(pl.Float64)
        return out

    sums = pl.DataFrame({
        "k": pl.int_range(n_keys, dtype=pl.Int64, eager=True),
        "n": pl.repeat(float(n), n_keys, dtype=pl.Float64, eager=True),
        "n1": pl.repeat(float(n_c), n_keys, dtype=pl.Float64, eager=True),
        "r1": per_key("_r2") / 2,
        "tie": per_key("_t"),
    })
    value = rows["_u"] + shift
    is_cand = rows["_s"] == 1
    return _with_medians(_mw_p(sums), value.filter(~is_cand), value.filter(is_cand), n_keys, n_b, n_c, confidence, z)


def _metric_grouped(key: pl.Series, side: pl.Series, v: pl.Series, n_keys: int, n_b: int, n_c: int,
                    confidence: float, z: float) -> pl.DataFrame:
    """``_metric`` for values too wide to pack with their key."""
    shift = int(v.min())  # type: ignore[arg-type]
    s = sort_within(key, (v - shift) * 2 + side)
    value = s["x"] // 2 + shift
    is_cand = (s["x"] % 2) == 1
    sums = _mw_p(_rank_sums_sorted(s))
    return _with_medians(sums, value.filter(~is_cand), value.filter(is_cand), n_keys, n_b, n_c, confidence, z)


def _with_medians(sums: pl.DataFrame, sorted_b: pl.Series, sorted_c: pl.Series, n_keys: int, n_b: int, n_c: int,
                  confidence: float, z: float) -> pl.DataFrame:
    med_b = _block_stats(sorted_b, n_keys, n_b, confidence, "b_")
    med_c = _block_stats(sorted_c, n_keys, n_c, confidence, "c_")
    return med_b.join(med_c, on="k").join(sums, on="k").with_columns(
        (z * (pl.col("b_se") ** 2 + pl.col("c_se") ** 2).sqrt()).alias("spread")
    )


def _rank_sums_sorted(s: pl.DataFrame, *, ties_apart: bool | None = None) -> pl.DataFrame:
    """``rank_sums`` of rows sorted by ``sort_within`` (x = value * 2 + side, value >= 0).

    A block of t equal values at 0-based positions f..l of its key has the
    average rank (f + l + 2) / 2 for each, and contributes t^3 - t to the
    tie term.  Ties are few in nanosecond times, so by default (when under a
    quarter of the rows tie) every row takes its rank p + 1 and only the
    tied rows are corrected, apart; otherwise (identical runs, many zeros)
    every row gets its block's bounds.  ``ties_apart`` forces one way.
    """
    row = pl.int_range(pl.len(), dtype=pl.Int64)
    u = pl.col("x") // 2
    first = (pl.col("k") != pl.col("k").shift(1)).fill_null(True)
    last = (pl.col("k") != pl.col("k").shift(-1)).fill_null(True)
    tied = ((u == u.shift(1)) & ~first) | ((u == u.shift(-1)) & ~last)
    rows = s.with_columns(
        (row - pl.when(first).then(row).forward_fill()).alias("_p"),
        (pl.col("x") % 2).alias("_s"),
        u.alias("_u"),
        tied.fill_null(False).alias("_tied"),
        first.alias("_first"),
        last.alias("_last"),
    )
    if ties_apart is None:
        ties_apart = int(rows["_tied"].sum()) * 4 < rows.height
    if not ties_apart:
        new = pl.col("_first") | (pl.col("_u") != pl.col("_u").shift(1))
        end = pl.col("_last") | (pl.col("_u") != pl.col("_u").shift(-1))
        lo = pl.when(new).then("_p").forward_fill()
        hi = pl.when(end).then("_p").backward_fill()
        return rows.select(
            "k", "_s", ((lo + hi + 2) * pl.col("_s")).alias("_r2"), ((hi - lo + 1) ** 2 - 1).alias("_t")
        ).group_by("k", maintain_order=True).agg(
            pl.len().cast(pl.Float64).alias("n"),
            pl.col("_s").sum().cast(pl.Float64).alias("n1"),
            (pl.col("_r2").sum() / 2).cast(pl.Float64).alias("r1"),
            pl.col("_t").sum().cast(pl.Float64).alias("tie"),
        )
    rank = pl.col("_p") + 1
    plain = rows.group_by("k", maintain_order=True).agg(
        pl.len().cast(pl.Float64).alias("n"),
        pl.col("_s").sum().cast(pl.Float64).alias("n1"),
        (rank * pl.col("_s")).sum().cast(pl.Float64).alias("_r1"),
    )
    ties = (
        rows.filter("_tied")
        .group_by("k", "_u")
        .agg(
            pl.len().cast(pl.Float64).alias("_t"),
            pl.col("_s").sum().cast(pl.Float64).alias("_c"),
            (rank * pl.col("_s")).sum().cast(pl.Float64).alias("_rs"),
            rank.mean().alias("_avg"),
        )
        .group_by("k")
        .agg(
            (pl.col("_c") * pl.col("_avg") - pl.col("_rs")).sum().alias("_corr"),
            (pl.col("_t") ** 3 - pl.col("_t")).sum().alias("tie"),
        )
    )
    return plain.join(ties, on="k", how="left", maintain_order="left").select(
        "k", "n", "n1",
        (pl.col("_r1") + pl.col("_corr").fill_null(0.0)).alias("r1"),
        pl.col("tie").fill_null(0.0).cast(pl.Float64),
    )


# -- timing ---------------------------------------------------------------------


def compare_timing(
    base: pl.DataFrame, cand: pl.DataFrame, names: pl.DataFrame, options: DiffOptions,
    *, n_base: int, n_cand: int, step_ns: float | None = None,
) -> pl.DataFrame:
    """Filled samples of two runs (``fill_steps``; ``n_base`` / ``n_cand`` compared steps) -> timing
    frame (``TIMING_COLUMNS``).

    Only keys present in both runs are compared; the others are structure
    findings.  ``step_ns`` (the base run's median step time) gives ``impact_pct``.
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
    metrics = (("self", "self_ns"), ("incl", "incl_ns"), ("self_share", "self_share"), ("incl_share", "incl_share"))
    with ThreadPoolExecutor(max_workers=2) as pool:
        stats = list(pool.map(lambda mc: _metric(b, c, mc[1], n_keys, n_base, n_cand, confidence, z), metrics))
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
        _key_fqn(pl.col("key"), names).alias("fqn"),
        _key_phase(pl.col("key")).alias("phase"),
        pl.lit(n_base, dtype=pl.Int64).alias("n_base"),
        pl.lit(n_cand, dtype=pl.Int64).alias("n_cand"),
        _vs_rest("self_share").alias("self_vs_rest"),
        _vs_rest("incl_share").alias("incl_vs_rest"),
        pl.col("self_delta_ns").alias("impact_ns"),
    )
    frame = frame.with_columns(*_typical(frame, "self"), *_typical(frame, "incl"))
    frame = frame.with_columns(
        _changed("self", options, 1).alias("_sreg"),
        _changed("self", options, -1).alias("_simp"),
        (_changed("incl", options, 1) | _changed("incl", options, -1)).alias("_inh"),
        (_changed("incl", options, 1, shares=False) | _changed("incl", options, -1, shares=False)).alias("_inh_abs"),
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
    logs = vs_rest.filter(vs_rest > 0).log()
    m = float(logs.median()) if logs.len() else 0.0
    mad = float((logs - m).abs().median()) if logs.len() else 0.0
    scale = mad / math.log(2)
    p: list[float | None] = []
    for v in vs_rest.to_list():
        if v is None or v <= 0:
            p.append(None)
        else:
            dev = abs(math.log(v) - m)
            p.append(1.0 if dev == 0 else (math.exp(-dev / scale) if scale > 0 else 0.0))
    return [
        (vs_rest / math.exp(m)).alias(f"{metric}_vs_typical"),
        holm(pl.Series(p, dtype=pl.Float64)).alias(f"{metric}_noise_p_adjusted"),
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


# -- structure ------------------------------------------------------------------


def _joined(values: pl.Expr) -> pl.Expr:
    return values.drop_nulls().cast(pl.String).unique().sort().str.join(",")


def placement(compared: pl.DataFrame, devices: pl.DataFrame, phases: tuple[str, ...] | None) -> pl.DataFrame:
    """Compared calls with ``mkey`` -> (mkey, device, stream): each module's device names and
    streams, comma-joined."""
    codes = _phase_codes(phases)
    sp = compared if codes is None else compared.filter(pl.col("phase").is_in(codes))
    names = devices.select(
        lookup_key("rank", "device_id").alias("_dk"), pl.col("name").cast(pl.String).alias("device")
    ).unique("_dk")
    return (
        sp.select("rank", "mkey", "device_id", "stream").unique()
        .with_columns(lookup_key("rank", "device_id").alias("_dk"))
        .join(names, on="_dk", how="left")
        .group_by("mkey")
        .agg(_joined(pl.col("device")).alias("device"), _joined(pl.col("stream")).alias("stream"))
    )


def compare_structure(
    base: pl.DataFrame, cand: pl.DataFrame, names: pl.DataFrame,
    placed_base: pl.DataFrame, placed_cand: pl.DataFrame,
) -> pl.DataFrame:
    """Filled samples and placements of two runs -> structure findings (``STRUCTURE_SCHEMA``), except order."""
    rows: list[dict[str, str | None]] = []
    fqns = names["fqn"]

    def per_key(samples: pl.DataFrame, alias: str) -> pl.DataFrame:
        return samples.group_by("key").agg(pl.col("calls").median().alias(alias))

    calls_b, calls_c = per_key(base, "b"), per_key(cand, "c")
    mods_b = {fqns[int(k) // 4] for k in calls_b["key"].to_list()}
    mods_c = {fqns[int(k) // 4] for k in calls_c["key"].to_list()}
    for fqn, n in collapse_subtrees(mods_b - mods_c):
        rows.append(_row("module_removed", fqn, None, "called", "not called",
                         f"{fqn}{_and(n)} is not called in the candidate"))
    for fqn, n in collapse_subtrees(mods_c - mods_b):
        rows.append(_row("module_added", fqn, None, "not called", "called", f"{fqn}{_and(n)} is new in the candidate"))

    both = (
        calls_b.join(calls_c, on="key", how="full", coalesce=True)
        .with_columns(_key_fqn(pl.col("key"), names).alias("fqn"), _key_phase(pl.col("key")).alias("phase"))
        .filter(pl.col("fqn").is_in(list(mods_b & mods_c)))
        .sort("fqn", pl.col("key") % 4)
    )
    for phase in PHASES:
        of_phase = both.filter(pl.col("phase") == phase)
        added = dict(of_phase.filter(pl.col("b").is_null()).select("fqn", "c").iter_rows())
        for fqn, n in collapse_subtrees(set(added)):
            rows.append(_row("phase_added", fqn, phase, "none", _calls(added[fqn]),
                             f"{fqn}{_and(n)} has {phase} calls in the candidate only ({_calls(added[fqn])}/step)"))
        removed = dict(of_phase.filter(pl.col("c").is_null()).select("fqn", "b").iter_rows())
        for fqn, n in collapse_subtrees(set(removed)):
            rows.append(_row("phase_removed", fqn, phase, _calls(removed[fqn]), "none",
                             f"{fqn}{_and(n)} has no {phase} calls in the candidate (base: {_calls(removed[fqn])}/step)"))
    for fqn, phase, b, c in both.drop_nulls(["b", "c"]).select("fqn", "phase", "b", "c").iter_rows():
        if b != c:
            rows.append(_row("calls_changed", fqn, phase, _calls(b), _calls(c),
                             f"{fqn} {phase}: {_calls(b)} -> {_calls(c)} calls per step"))

    where = (
        placed_base.join(placed_cand, on="mkey", suffix="_c")
        .with_columns(pl.lit(fqns).gather(pl.col("mkey")).alias("fqn"))
        .sort("fqn")
    )
    for what in ("device", "stream"):
        for fqn, b, c in where.filter(pl.col(what) != pl.col(f"{what}_c")).select("fqn", what, f"{what}_c").iter_rows():
            b, c = b or "none", c or "none"
            rows.append(_row(f"{what}_changed", fqn, None, b, c, f"{fqn} runs on {what} {c} (base: {b})"))
    return pl.DataFrame(rows, schema=STRUCTURE_SCHEMA) if rows else pl.DataFrame(schema=STRUCTURE_SCHEMA)


def collapse_subtrees(fqns: set[str]) -> list[tuple[str, int]]:
    """Sorted fqns with their descendants folded in: (topmost fqn, number of descendants in the set)."""
    out: list[tuple[str, int]] = []
    for fqn in sorted(fqns):
        if out and fqn.startswith(out[-1][0] + "."):
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((fqn, 0))
    return out


def _and(n: int) -> str:
    return "" if n == 0 else f" (and {n} submodule{'' if n == 1 else 's'})"


def _calls(value: float | None) -> str:
    if value is None:
        return "none"
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def _row(kind: str, fqn: str | None, phase: str | None, base: str, cand: str, message: str) -> dict[str, str | None]:
    return {"kind": kind, "fqn": fqn, "phase": phase, "base": base, "cand": cand, "message": message}


# -- call order -----------------------------------------------------------------


def call_sequences(compared: pl.DataFrame, phases: tuple[str, ...] | None) -> pl.DataFrame:
    """Compared calls with ``mkey`` of the lowest rank -> its calls in call order (per step, per
    thread, threads in id order): rank, step, ``k`` (0-based ordinal of the step), key and depth."""
    codes = _phase_codes(phases)
    sp = compared if codes is None else compared.filter(pl.col("phase").is_in(codes))
    if sp.height == 0:
        return pl.DataFrame()
    rank = sp["rank"].min()
    seq = sp.filter(pl.col("rank") == rank).select(
        "rank", "step", "span_id", lookup_key("step", "thread_id").alias("_st"),
        (pl.col("mkey") * 4 + pl.col("phase")).alias("key"), "depth",
    )
    # by (step, thread, span_id): two single-column sorts (the first is usually of sorted rows)
    seq = seq.sort("span_id").sort("_st", maintain_order=True)
    first = (pl.col("step") != pl.col("step").shift(1)).fill_null(True)
    return seq.select("rank", "step", (first.cast(pl.Int64).cum_sum() - 1).alias("k"), "key", "depth")


def first_divergence(seq_b: pl.DataFrame, seq_c: pl.DataFrame, names: pl.DataFrame,
                     options: DiffOptions) -> Divergence | None:
    """The first k-th compared step of each run whose call sequences differ, with an aligned excerpt.

    Steps of equal lengths line up row by row, so the runs are compared
    column against column up to the first step whose lengths differ.
    """
    if seq_b.height == 0 or seq_c.height == 0:
        return None
    steps = min(int(seq_b["k"].max()), int(seq_c["k"].max())) + 1  # type: ignore[arg-type]
    len_b = seq_b["k"].filter(seq_b["k"] < steps).value_counts(sort=False).sort("k")["count"]
    len_c = seq_c["k"].filter(seq_c["k"] < steps).value_counts(sort=False).sort("k")["count"]
    unequal = (len_b != len_c).arg_true()
    k_len = int(unequal[0]) if unequal.len() else steps  # the first step whose lengths differ
    rows = int(len_b.head(k_len).sum())
    a, b = seq_b.head(rows), seq_c.head(rows)
    differs = ((a["key"] != b["key"]) | (a["depth"] != b["depth"])).arg_true()
    k = int(a["k"][int(differs[0])]) if differs.len() else k_len
    if k >= steps:
        return None
    one_b = seq_b.filter(pl.col("k") == k)
    one_c = seq_c.filter(pl.col("k") == k)
    excerpt, position = _excerpt(one_b, one_c, names, options)
    return Divergence(
        rank_base=int(seq_b["rank"][0]), rank_cand=int(seq_c["rank"][0]),
        step_base=int(one_b["step"][0]), step_cand=int(one_c["step"][0]), position=position, excerpt=excerpt,
    )


def _display(phase: str, depth: int, fqn: str) -> str:
    return f"{phase:<9} {'  ' * depth}{fqn}"


def _excerpt(a: pl.DataFrame, b: pl.DataFrame, names: pl.DataFrame, options: DiffOptions) -> tuple[pl.DataFrame, int]:
    fqns = names["fqn"]
    la = list(a.select("key", "depth").iter_rows())
    lb = list(b.select("key", "depth").iter_rows())
    da = [_display(PHASES[k % 4], d, fqns[k // 4]) for k, d in la]
    db = [_display(PHASES[k % 4], d, fqns[k // 4]) for k, d in lb]
    ops = difflib.SequenceMatcher(None, la, lb, autojunk=False).get_opcodes()
    first = next(i for i, op in enumerate(ops) if op[0] != "equal")
    tag, i1, i2, j1, j2 = ops[first]
    rows: list[tuple[str, int | None, int | None, str | None, str | None]] = []
    ctx = options.excerpt_context
    for n in range(max(0, i1 - ctx), i1):
        rows.append(("=", n + 1, j1 - (i1 - n) + 1, da[n], db[j1 - (i1 - n)]))
    changed: list[tuple[str, int | None, int | None, str | None, str | None]] = []
    for n in range(max(i2 - i1, j2 - j1)):
        ia, ib = i1 + n, j1 + n
        has_a, has_b = ia < i2, ib < j2
        if has_a and has_b:
            changed.append(("~", ia + 1, ib + 1, da[ia], db[ib]))
        elif has_a:
            changed.append(("-", ia + 1, None, da[ia], None))
        else:
            changed.append(("+", None, ib + 1, None, db[ib]))
    rows.extend(changed[: options.excerpt_changes])
    if len(changed) > options.excerpt_changes:
        rows.append(("…", None, None, f"{len(changed) - options.excerpt_changes} more", None))
    for n in range(ctx):
        ia, ib = i2 + n, j2 + n
        if ia >= len(la) or ib >= len(lb) or la[ia] != lb[ib]:
            break
        rows.append(("=", ia + 1, ib + 1, da[ia], db[ib]))
    return pl.DataFrame(rows, schema=EXCERPT_SCHEMA, orient="row"), min(i1, j1) + 1


# -- the whole diff -------------------------------------------------------------


@dataclass(frozen=True)
class _Side:
    units: pl.DataFrame  # rank, step, step_ns
    samples: pl.DataFrame  # filled samples with shares
    placed: pl.DataFrame  # mkey, device, stream
    sequence: pl.DataFrame  # call_sequences


def _prepare(run: RunCalls, lookup: pl.DataFrame, names: pl.DataFrame, options: DiffOptions) -> _Side:
    compared = with_mkey(compared_calls(run.calls, options.skip_steps), lookup, names)
    units = step_units(compared)
    samples = fill_steps(compared_samples(compared, options.phases), units)
    return _Side(
        units=units,
        samples=samples,
        placed=placement(compared, run.devices, options.phases),
        sequence=call_sequences(compared, options.phases),
    )


def diff_runs(base: RunCalls, cand: RunCalls, options: DiffOptions | None = None) -> DiffResult:
    """Two runs' calls -> timing comparison, structure findings, first order divergence, summary."""
    options = options or DiffOptions()
    lookup_b, lookup_c = module_lookup(base), module_lookup(cand)
    names = module_keys(lookup_b, lookup_c)
    # The two runs, and below the four metrics, are independent: polars releases the GIL,
    # so threads keep every core busy through the steps polars runs on one.
    with ThreadPoolExecutor(max_workers=2) as pool:
        fb = pool.submit(_prepare, base, lookup_b, names, options)
        c = _prepare(cand, lookup_c, names, options)
        b = fb.result()
    n_b, n_c = b.units.height, c.units.height
    step_b = _median(b.units["step_ns"])
    step_c = _median(c.units["step_ns"])
    timing = compare_timing(b.samples, c.samples, names, options, n_base=n_b, n_cand=n_c, step_ns=step_b)
    structure = compare_structure(b.samples, c.samples, names, b.placed, c.placed)
    divergence = first_divergence(b.sequence, c.sequence, names, options)
    if divergence is not None:
        first = divergence.excerpt.filter(pl.col("op") != "=").row(0, named=True)
        what = first["cand"] if first["base"] is None else first["base"]
        message = (
            f"call order differs from call {divergence.position} of step {divergence.step_base}"
            + ("" if divergence.step_base == divergence.step_cand else f" (candidate step {divergence.step_cand})")
            + f": {' '.join(str(what).split())}"
        )
        structure = pl.concat([
            structure,
            pl.DataFrame([_row("order_changed", None, None, f"step {divergence.step_base}",
                               f"step {divergence.step_cand}", message)], schema=STRUCTURE_SCHEMA),
        ])
    counts = timing["verdict"].value_counts()
    by_verdict = dict(zip(counts["verdict"].to_list(), counts["count"].to_list(), strict=True))
    step_ratio = (step_c / step_b) if step_b and step_c is not None else None
    step_p = _step_p_value(b.units, c.units)
    summary: dict[str, object] = {
        "base_steps": n_b,
        "cand_steps": n_c,
        "base_step_ns": step_b,
        "cand_step_ns": step_c,
        "step_ratio": step_ratio,
        "step_p_value": step_p,
        "step_changed": bool(
            step_p is not None and step_p < options.alpha and step_ratio is not None
            and abs(step_ratio - 1) > options.threshold
        ),
        "compared": timing.height,
        "regressions": int(by_verdict.get("regression", 0)),
        "improvements": int(by_verdict.get("improvement", 0)),
        "inherited": int(by_verdict.get("inherited", 0)),
        "structure_changes": structure.height,
        "min_p_value": min_p_value(n_b, n_c),
    }
    return DiffResult(timing=timing, structure=structure, divergence=divergence, summary=summary)


def diff_spans(base_spans: pl.DataFrame, cand_spans: pl.DataFrame, options: DiffOptions | None = None) -> DiffResult:
    """``diff_runs`` of two spans frames."""
    return diff_runs(calls_of_spans(base_spans), calls_of_spans(cand_spans), options)


def _step_p_value(units_b: pl.DataFrame, units_c: pl.DataFrame) -> float | None:
    """Mann-Whitney p of the step times of the two runs."""
    if units_b.height == 0 or units_c.height == 0:
        return None
    v = pl.concat([units_b["step_ns"], units_c["step_ns"]])
    side = pl.concat([pl.zeros(units_b.height, pl.Int64, eager=True), pl.ones(units_c.height, pl.Int64, eager=True)])
    p = _mw_p(rank_sums(pl.zeros(v.len(), pl.Int64, eager=True), side, v))["p_value"][0]
    return None if p is None else float(p)


def _median(values: pl.Series) -> float | None:
    if values.len() == 0:
        return None
    m = values.median()
    return float(m) if m is not None else None  # type: ignore[arg-type]
