"""The statistics of a diff: Mann-Whitney U, Holm, order-statistic intervals, a Laplace noise null.

Samples of many keys (one per module and phase) are judged at once, from one sort where
possible: ranks, rank sums and order statistics of a sorted block need no grouping.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import polars as pl

# Values are packed with their key into one Int64 when the product stays below this.
INT64_LIMIT = 2**63
# Below this variance of U, every value of a key is tied: p = 1.
_MIN_VARIANCE = 1e-9


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


def min_steps(alpha: float) -> int:
    """The fewest compared steps per run for which the Mann-Whitney test can reach p < ``alpha``."""
    n = 1
    while min_p_value(n, n) >= alpha and n < 10_000:
        n += 1
    return n


def holm(p_values: pl.Series) -> pl.Series:
    """Holm-adjusted p-values (family-wise error over all the keys compared); nulls stay null."""
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
    if (int(k.max()) + 1) * width < INT64_LIMIT:
        packed = (k * width + x).sort()
        # k is sorted: flagged so, group_by("k") takes its fast path (no hashing)
        return pl.DataFrame({"k": (packed // width).set_sorted(), "x": packed % width})
    return pl.DataFrame({"k": k, "x": x}).sort("x").sort("k", maintain_order=True)


def mw_p_values(sums: pl.DataFrame) -> pl.DataFrame:
    """Rank sums (``rank_sums_sorted``) -> k, u (U of side 1) and p_value (normal approximation, tie-corrected
    variance, continuity correction; null when a side is empty, 1.0 when every value is tied)."""
    n1 = pl.col("n1")
    big_n = pl.col("n")
    n0 = big_n - n1
    per = sums.with_columns(
        (pl.col("r1") - n1 * (n1 + 1) / 2).alias("u"),
        (n0 * n1 / 12 * ((big_n + 1) - pl.col("tie") / (big_n * (big_n - 1)))).alias("_var"),
    ).with_columns(
        pl.when((n0 > 0) & (n1 > 0) & (pl.col("_var") > _MIN_VARIANCE))
        .then(((pl.col("u") - n0 * n1 / 2).abs() - 0.5).clip(lower_bound=0) / pl.col("_var").sqrt())
        .alias("_z"),
        ((n0 > 0) & (n1 > 0)).alias("_ok"),
    )
    p = [
        (two_sided_p(z) if z is not None else 1.0) if ok else None
        for z, ok in zip(per["_z"].to_list(), per["_ok"].to_list(), strict=True)
    ]
    return per.select("k", "u", pl.Series("p_value", p, dtype=pl.Float64))


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


def two_sample_stats(base: pl.DataFrame, cand: pl.DataFrame, column: str, n_keys: int, n_b: int, n_c: int,
            confidence: float, z: float) -> pl.DataFrame:
    """Filled samples of both runs (dense key ``k`` in [0, n_keys), ``n_b`` / ``n_c`` rows per key)
    -> per k: medians (``b_median``, ``c_median``), standard errors (McKean-Schrader), ``spread``
    (z times their combined error), ``u`` and ``p_value`` of ``column``.

    The hot loop of a diff.  Every key has n = n_b + n_c values, so after one sort of
    (k, value, side) packed into an Int64 the key of row i is i // n and its position in the
    key i % n: ranks, rank sums and order statistics need no grouping.
    """
    n = n_b + n_c
    key = pl.concat([base["k"], cand["k"]]).cast(pl.Int64)
    v = pl.concat([base[column], cand[column]]).cast(pl.Int64)
    side = pl.concat([pl.zeros(base.height, pl.Int64, eager=True), pl.ones(cand.height, pl.Int64, eager=True)])
    shift = int(v.min())
    width = (int(v.max()) - shift) * 2 + 2
    if n_keys * width >= INT64_LIMIT:
        return _two_sample_stats_grouped(key, side, v, n_keys, n_b, n_c, confidence, z)
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
    return _with_medians(mw_p_values(sums), value.filter(~is_cand), value.filter(is_cand), n_keys, n_b, n_c, confidence, z)


def _two_sample_stats_grouped(key: pl.Series, side: pl.Series, v: pl.Series, n_keys: int, n_b: int, n_c: int,
                    confidence: float, z: float) -> pl.DataFrame:
    """``two_sample_stats`` of values too wide to pack with their key."""
    shift = int(v.min())  # type: ignore[arg-type]
    s = sort_within(key, (v - shift) * 2 + side)
    value = s["x"] // 2 + shift
    is_cand = (s["x"] % 2) == 1
    sums = mw_p_values(rank_sums_sorted(s))
    return _with_medians(sums, value.filter(~is_cand), value.filter(is_cand), n_keys, n_b, n_c, confidence, z)


def _with_medians(sums: pl.DataFrame, sorted_b: pl.Series, sorted_c: pl.Series, n_keys: int, n_b: int, n_c: int,
                  confidence: float, z: float) -> pl.DataFrame:
    med_b = _block_stats(sorted_b, n_keys, n_b, confidence, "b_")
    med_c = _block_stats(sorted_c, n_keys, n_c, confidence, "c_")
    return med_b.join(med_c, on="k").join(sums, on="k").with_columns(
        (z * (pl.col("b_se") ** 2 + pl.col("c_se") ** 2).sqrt()).alias("spread")
    )


def rank_sums_sorted(s: pl.DataFrame) -> pl.DataFrame:
    """Rows sorted by ``sort_within`` (x = value * 2 + side, value >= 0) -> per key ``k``: n, n1,
    r1 (the rank sum of side 1) and tie (the tie term).  A block of t equal values at 0-based
    positions f..l of its key has the average rank (f + l + 2) / 2 and adds t^3 - t."""
    p = pl.int_range(pl.len(), dtype=pl.Int64)
    first = (pl.col("k") != pl.col("k").shift(1)).fill_null(True)
    last = (pl.col("k") != pl.col("k").shift(-1)).fill_null(True)
    rows = s.with_columns((p - pl.when(first).then(p).forward_fill()).alias("_p"), (pl.col("x") // 2).alias("_u"),
                          (pl.col("x") % 2).alias("_s"), first.alias("_first"), last.alias("_last"))
    lo = pl.when(pl.col("_first") | (pl.col("_u") != pl.col("_u").shift(1))).then("_p").forward_fill()
    hi = pl.when(pl.col("_last") | (pl.col("_u") != pl.col("_u").shift(-1))).then("_p").backward_fill()
    return rows.select(
        "k", "_s", ((lo + hi + 2) * pl.col("_s")).alias("_r2"), ((hi - lo + 1) ** 2 - 1).alias("_t")
    ).group_by("k", maintain_order=True).agg(
        pl.len().cast(pl.Float64).alias("n"),
        pl.col("_s").sum().cast(pl.Float64).alias("n1"),
        (pl.col("_r2").sum() / 2).cast(pl.Float64).alias("r1"),
        pl.col("_t").sum().cast(pl.Float64).alias("tie"),
    )


def two_sample_p(a: pl.Series, b: pl.Series) -> float | None:
    """Two-sided Mann-Whitney p of two integer samples (None when one is empty)."""
    if a.len() == 0 or b.len() == 0:
        return None
    v = pl.concat([a, b]).cast(pl.Int64)
    side = pl.concat([pl.zeros(a.len(), pl.Int64, eager=True), pl.ones(b.len(), pl.Int64, eager=True)])
    ordered = sort_within(pl.zeros(v.len(), pl.Int64, eager=True), (v - int(v.min())) * 2 + side)
    p = mw_p_values(rank_sums_sorted(ordered))["p_value"][0]
    return None if p is None else float(p)


def laplace_noise_p(x: list[float | None]) -> pl.Series:
    """p = exp(-|x - m| / b) of each value as Laplace noise around the median m of all, with
    b = MAD / ln 2 (the robust estimate); when more than half the values sit at the median the MAD
    is 0, and b is their mean absolute deviation (Laplace's maximum likelihood estimate).  1 at
    the median, null for a null value."""
    values = pl.Series([v for v in x if v is not None], dtype=pl.Float64)
    m = float(values.median()) if values.len() else 0.0  # type: ignore[arg-type]
    dev = (values - m).abs()
    mad = float(dev.median()) if values.len() else 0.0
    scale = mad / math.log(2) if mad > 0 else float(dev.mean() or 0.0)
    # scale 0: every value sits at the median, no evidence of noise either way
    return pl.Series([None if v is None else 1.0 if v == m or scale <= 0 else math.exp(-abs(v - m) / scale)
                      for v in x], dtype=pl.Float64)
