"""Diff: two spans frames -> what changed between the runs, and which module to blame.

Everything here is a pure function of spans frames (``spans.SPAN_COLUMNS``);
the CLI reads the frames from the store and hands the result to a renderer.

Per-step samples (``compared_samples``, the sums of ``aggregate.step_samples``)
    One row per (rank, step, fqn, phase) with the module's call count and its
    inclusive and self time summed over those calls.  The first
    ``skip_steps`` steps of each rank are left out (step 0 usually pays
    one-time costs: allocator warm-up, lazy initialisation).  A module that
    ran in some compared steps but not others counts 0 in the others, so a
    sample is always "time per step".  With several ranks, each (rank, step)
    is one sample.

Timing (``compare_timing``), one row per (fqn, phase) present in both runs
    For self and inclusive time: the median per-step time of each run, their
    difference (``delta``) and ratio, a confidence interval of the difference
    (each median's standard error from order statistics, McKean-Schrader,
    combined), and a two-sided Mann-Whitney U test over the per-step samples
    (normal approximation with tie and continuity correction), its p-value
    Holm-adjusted over all the keys compared (``p_adjusted``).  ``verdict``:

    - ``regression``: self time got slower by more than ``threshold`` (relative),
      by more than ``min_delta_ns`` per step, and the adjusted p < ``alpha``;
    - ``improvement``: the same, faster;
    - ``inherited``: self time did not change, inclusive time did by the same
      criteria: the change belongs to a descendant (context, not blame);
    - ``unchanged``.

    ``impact_ns`` is the change of median self time per step: what the
    module itself adds to (or saves from) every step.  Rows are sorted
    regressions first (largest impact first), then improvements, inherited,
    unchanged.

Structure (``compare_structure``), one row per finding
    ``module_removed`` / ``module_added`` (a module called in one run only),
    ``phase_removed`` / ``phase_added`` (e.g. a recompute that appeared),
    ``calls_changed`` (median calls per step), ``device_changed``,
    ``stream_changed``, and ``order_changed`` (the call sequences of a
    compared step differ; ``first_divergence`` gives an aligned excerpt).

``diff_spans`` runs all of it and returns a ``DiffResult``.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field
from statistics import NormalDist

import polars as pl

from modtrace.analysis.events import PHASE_ENUM

PHASES: tuple[str, ...] = ("forward", "backward", "recompute")
VERDICTS: tuple[str, ...] = ("regression", "improvement", "inherited", "unchanged")
STRUCTURE_KINDS: tuple[str, ...] = (
    "module_removed", "module_added", "phase_removed", "phase_added",
    "calls_changed", "device_changed", "stream_changed", "order_changed",
)
METRICS: tuple[str, ...] = ("self", "incl")

SAMPLE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "step": pl.Int32(),
    "fqn": pl.Categorical(),
    "phase": PHASE_ENUM,
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

_STAT_COLUMNS = ("base_ns", "cand_ns", "delta_ns", "ratio", "ci_low_ns", "ci_high_ns", "p_value", "p_adjusted")
TIMING_COLUMNS: tuple[str, ...] = (
    "fqn", "phase", "verdict", "impact_ns", "n_base", "n_cand", "calls_base", "calls_cand",
    *(f"{m}_{c}" for m in METRICS for c in _STAT_COLUMNS),
)


@dataclass(frozen=True)
class DiffOptions:
    """What counts as a change.  ``threshold`` is relative (0.10 = 10%)."""

    threshold: float = 0.10
    min_delta_ns: int = 20_000
    alpha: float = 0.01
    skip_steps: int = 1
    phases: tuple[str, ...] | None = None  # None: every phase
    excerpt_context: int = 3
    excerpt_changes: int = 8


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


# -- samples --------------------------------------------------------------------


def _compared(spans: pl.DataFrame, skip_steps: int, phases: tuple[str, ...] | None) -> pl.DataFrame:
    """Closed spans of the compared steps (after the first ``skip_steps`` of each rank) and phases."""
    sp = spans.filter(pl.col("duration_ns").is_not_null())
    if phases is not None:
        sp = sp.filter(pl.col("phase").cast(pl.String).is_in(list(phases)))
    first = pl.col("step").min().over("rank")
    return sp.filter(pl.col("step") >= first + skip_steps)


def compared_samples(
    spans: pl.DataFrame, *, skip_steps: int = 1, phases: tuple[str, ...] | None = None
) -> pl.DataFrame:
    """Spans frame -> per-step samples of the compared steps and phases (``SAMPLE_SCHEMA``), unordered.

    The same sums as ``aggregate.step_samples``, grouped by the names'
    categorical codes rather than strings: this is the hot loop of a diff of
    millions of spans, and the string grouping costs several times more.
    Only modules that ran in a step have a row for it; ``fill_steps`` adds
    the zeros.
    """
    sp = _compared(spans, skip_steps, phases)
    return (
        sp.group_by("rank", "step", "fqn", "phase")
        .agg(
            pl.len().alias("calls"),
            pl.col("duration_ns").sum().alias("incl_ns"),
            pl.col("self_ns").sum().alias("self_ns"),
        )
        .select(list(SAMPLE_SCHEMA))
        .cast(SAMPLE_SCHEMA)  # type: ignore[arg-type]
    )


def step_units(spans: pl.DataFrame, *, skip_steps: int = 1) -> pl.DataFrame:
    """The compared (rank, step) pairs of a spans frame, with ``step_ns``: time in root spans."""
    sp = _compared(spans, skip_steps, None)
    return (
        sp.group_by("rank", "step")
        .agg(pl.col("duration_ns").filter(pl.col("depth") == 0).sum().cast(pl.Int64).alias("step_ns"))
        .with_columns(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int32))
        .sort("rank", "step")
    )


def fill_steps(samples: pl.DataFrame, units: pl.DataFrame) -> pl.DataFrame:
    """Samples with a zero row for every compared (rank, step) in which a module did not run.

    Only modules missing from some step get rows added (usually none).
    """
    counts = samples.group_by("fqn", "phase").agg(pl.len().alias("_n"))
    short = counts.filter(pl.col("_n") < units.height).select("fqn", "phase")
    if short.height == 0:
        return samples
    grid = short.join(units.select("rank", "step"), how="cross")
    missing = grid.join(samples, on=["rank", "step", "fqn", "phase"], how="anti")
    zeros = missing.select(
        "rank", "step", "fqn", "phase",
        pl.lit(0, dtype=pl.Int64).alias("calls"),
        pl.lit(0, dtype=pl.Int64).alias("incl_ns"),
        pl.lit(0, dtype=pl.Int64).alias("self_ns"),
    )
    return pl.concat([samples, zeros.select(samples.columns).cast(samples.schema)])


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
    return two_sided_p((prod / 2.0 - 0.5) / sd) or 1.0


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


def mann_whitney(long: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """Two-sided Mann-Whitney U per group: ``long`` has ``by`` columns, ``side`` (0 base, 1 cand), ``v``.

    Returns ``by`` + ``u`` (U of the candidate) and ``p_value`` (normal
    approximation, tie-corrected variance, continuity correction; null when
    either side is empty, 1.0 when every value is tied).

    The tie term sum(t^3 - t) over blocks of t equal values comes from the
    average ranks themselves: averaging a block lowers the sum of squared
    ranks by (t^3 - t) / 12, so it is 12 * (N(N+1)(2N+1)/6 - sum(rank^2)).
    """
    cand = pl.col("side") == 1
    ranked = long.with_columns(pl.col("v").rank("average").over(by).alias("_r"))
    per = ranked.group_by(by).agg(
        pl.len().cast(pl.Float64).alias("_n"),
        cand.sum().cast(pl.Float64).alias("_n1"),
        pl.col("_r").filter(cand).sum().cast(pl.Float64).alias("_r1"),
        (pl.col("_r").cast(pl.Float64) ** 2).sum().alias("_r2"),
    )
    n1 = pl.col("_n1")
    big_n = pl.col("_n")
    n0 = big_n - n1
    tie = (12 * (big_n * (big_n + 1) * (2 * big_n + 1) / 6 - pl.col("_r2"))).round(6).clip(lower_bound=0)
    per = per.with_columns(
        (pl.col("_r1") - n1 * (n1 + 1) / 2).alias("u"),
        (n0 * n1 / 12 * ((big_n + 1) - tie / (big_n * (big_n - 1)))).alias("_var"),
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
    return per.with_columns(pl.Series("p_value", p, dtype=pl.Float64)).select(*by, "u", "p_value")


def median_summary(samples: pl.DataFrame, column: str, confidence: float) -> pl.DataFrame:
    """Per ``key`` of filled samples: median of ``column`` and its standard error.

    McKean-Schrader: se = (x[n - c + 1] - x[c]) / (2 z), c = round((n + 1) / 2
    - z sqrt(n) / 2), x sorted (1-based), z the normal quantile of
    ``confidence``.  Filled samples have the same n for every key of a run,
    so the order statistics are fixed quantiles.
    """
    z = normal_quantile(0.5 + confidence / 2)
    counts = samples.group_by("key").agg(pl.len().alias("_n"))
    sizes = set(counts["_n"].to_list())
    n = max(sizes, default=0)
    if len(sizes) > 1:
        raise ValueError("median_summary needs the same number of samples for every key (use fill_steps)")
    c = max(1, round((n + 1) / 2 - z * math.sqrt(n) / 2)) if n else 1
    v = pl.col(column).cast(pl.Float64)

    def order_stat(i: int) -> pl.Expr:  # the i-th smallest, 1-based
        # "lower" takes index floor(q (n - 1)); aim a quarter past i - 1 so rounding cannot miss it.
        return v.quantile(min(1.0, (i - 0.75) / (n - 1)) if n > 1 else 0.0, interpolation="lower")

    return samples.group_by("key").agg(
        pl.len().cast(pl.Int64).alias("n"),
        v.median().alias("median"),
        ((order_stat(n - c + 1) - order_stat(c)) / (2 * z)).alias("se"),
    )


# -- timing ---------------------------------------------------------------------


def compare_timing(
    base: pl.DataFrame, cand: pl.DataFrame, options: DiffOptions, *, step_ns: float | None = None
) -> pl.DataFrame:
    """Filled per-step samples of two runs (``fill_steps``) -> timing frame (``TIMING_COLUMNS``).

    Only (fqn, phase) keys present in both runs are compared; the others are
    structure findings.  ``step_ns`` (the base run's median step time) adds
    ``impact_pct``.
    """
    keys = (
        base.select("fqn", "phase").unique()
        .join(cand.select("fqn", "phase").unique(), on=["fqn", "phase"])
        .with_row_index("key")
    )
    base = base.join(keys, on=["fqn", "phase"])
    cand = cand.join(keys, on=["fqn", "phase"])
    confidence = 1.0 - options.alpha
    z = normal_quantile(0.5 + confidence / 2)
    wide = keys
    for metric, column in (("self", "self_ns"), ("incl", "incl_ns")):
        long = pl.concat([
            base.select("key", pl.lit(0, dtype=pl.Int8).alias("side"), pl.col(column).cast(pl.Float64).alias("v")),
            cand.select("key", pl.lit(1, dtype=pl.Int8).alias("side"), pl.col(column).cast(pl.Float64).alias("v")),
        ])
        med_b = median_summary(base, column, confidence).select(
            "key", pl.col("n").alias("_nb"), pl.col("median").alias("_mb"), pl.col("se").alias("_sb"))
        med_c = median_summary(cand, column, confidence).select(
            "key", pl.col("n").alias("_nc"), pl.col("median").alias("_mc"), pl.col("se").alias("_sc"))
        spread = z * (pl.col("_sb") ** 2 + pl.col("_sc") ** 2).sqrt()
        delta = pl.col("_mc") - pl.col("_mb")
        stats = med_b.join(med_c, on="key").join(mann_whitney(long, ["key"]), on="key").select(
            "key",
            "_nb",
            "_nc",
            pl.col("_mb").alias(f"{metric}_base_ns"),
            pl.col("_mc").alias(f"{metric}_cand_ns"),
            delta.alias(f"{metric}_delta_ns"),
            pl.when(pl.col("_mb") > 0).then(pl.col("_mc") / pl.col("_mb")).alias(f"{metric}_ratio"),
            (delta - spread).alias(f"{metric}_ci_low_ns"),
            (delta + spread).alias(f"{metric}_ci_high_ns"),
            pl.col("p_value").alias(f"{metric}_p_value"),
        )
        stats = stats.with_columns(holm(stats[f"{metric}_p_value"]).alias(f"{metric}_p_adjusted"))
        if metric == "self":
            wide = wide.join(stats.rename({"_nb": "n_base", "_nc": "n_cand"}), on="key")
        else:
            wide = wide.join(stats.drop("_nb", "_nc"), on="key")
    calls = (
        base.group_by("key").agg(pl.col("calls").median().alias("calls_base"))
        .join(cand.group_by("key").agg(pl.col("calls").median().alias("calls_cand")), on="key")
    )
    wide = wide.join(calls, on="key", how="left").with_columns(
        pl.col("fqn").cast(pl.String), pl.col("phase").cast(pl.String)
    )
    frame = wide.with_columns(
        _changed("self", options, 1).alias("_sreg"),
        _changed("self", options, -1).alias("_simp"),
        (_changed("incl", options, 1) | _changed("incl", options, -1)).alias("_inh"),
        pl.col("self_delta_ns").alias("impact_ns"),
    ).with_columns(
        pl.when("_sreg").then(pl.lit("regression"))
        .when("_simp").then(pl.lit("improvement"))
        .when("_inh").then(pl.lit("inherited"))
        .otherwise(pl.lit("unchanged"))
        .alias("verdict")
    )
    order = pl.col("verdict").replace_strict(list(VERDICTS), list(range(len(VERDICTS))), return_dtype=pl.Int8)
    key = (
        pl.when(pl.col("verdict") == "regression").then(-pl.col("impact_ns"))
        .when(pl.col("verdict") == "improvement").then(pl.col("impact_ns"))
        .when(pl.col("verdict") == "inherited").then(-pl.col("incl_delta_ns").abs())
        .otherwise(-pl.col("impact_ns").abs())
    )
    frame = frame.with_columns(order.alias("_vo"), key.alias("_k")).sort("_vo", "_k", "fqn", "phase")
    columns = list(TIMING_COLUMNS)
    if step_ns:
        frame = frame.with_columns((pl.col("impact_ns") / step_ns * 100).alias("impact_pct"))
    else:
        frame = frame.with_columns(pl.lit(None, dtype=pl.Float64).alias("impact_pct"))
    columns.insert(columns.index("impact_ns") + 1, "impact_pct")
    return frame.select(columns).with_columns(
        pl.col("n_base", "n_cand").cast(pl.Int64), pl.col("calls_base", "calls_cand").cast(pl.Float64)
    )


def _changed(metric: str, options: DiffOptions, direction: int) -> pl.Expr:
    """Significant, large enough, and big enough relative to the base: slower (+1) or faster (-1)."""
    base = pl.col(f"{metric}_base_ns")
    delta = pl.col(f"{metric}_delta_ns") * direction
    relative = pl.when(base > 0).then(delta / base).otherwise(pl.lit(math.inf) if direction > 0 else pl.lit(0.0))
    return (
        (pl.col(f"{metric}_p_adjusted") < options.alpha).fill_null(False)
        & (delta > options.min_delta_ns)
        & (relative > options.threshold)
    )


# -- structure ------------------------------------------------------------------


def _joined(values: pl.Expr) -> pl.Expr:
    return values.drop_nulls().cast(pl.String).unique().sort().str.join(",")


def compare_structure(
    base_spans: pl.DataFrame,
    cand_spans: pl.DataFrame,
    base: pl.DataFrame,
    cand: pl.DataFrame,
    options: DiffOptions,
) -> pl.DataFrame:
    """Spans and filled samples of two runs -> structure findings (``STRUCTURE_SCHEMA``), except order."""
    rows: list[dict[str, str | None]] = []
    mods_b = set(base["fqn"].unique().to_list())
    mods_c = set(cand["fqn"].unique().to_list())
    for fqn, n in collapse_subtrees(mods_b - mods_c):
        rows.append(_row("module_removed", fqn, None, "called", "not called",
                         f"{fqn}{_and(n)} is not called in the candidate"))
    for fqn, n in collapse_subtrees(mods_c - mods_b):
        rows.append(_row("module_added", fqn, None, "not called", "called", f"{fqn}{_and(n)} is new in the candidate"))

    calls_b = base.group_by("fqn", "phase").agg(pl.col("calls").median().alias("b"))
    calls_c = cand.group_by("fqn", "phase").agg(pl.col("calls").median().alias("c"))
    both = calls_b.join(calls_c, on=["fqn", "phase"], how="full", coalesce=True).filter(
        pl.col("fqn").is_in(list(mods_b & mods_c))
    ).sort("fqn", "phase")
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

    placed = []
    for spans in (base_spans, cand_spans):
        sp = _compared(spans, options.skip_steps, options.phases).select("fqn", "device", "stream").unique()
        placed.append(
            sp.group_by("fqn").agg(
                _joined(pl.col("device")).alias("device"), _joined(pl.col("stream")).alias("stream")
            ).with_columns(pl.col("fqn").cast(pl.String))
        )
    where = placed[0].join(placed[1], on="fqn", suffix="_c").sort("fqn")
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


def call_sequences(spans: pl.DataFrame, options: DiffOptions) -> pl.DataFrame:
    """Spans of the compared steps of the lowest rank -> (rank, step, phase, depth, fqn, call).

    One row per call in call order (per thread, threads in id order).
    ``call`` hashes (phase, depth, module): equal calls have equal hashes
    within one process, whichever run they come from.
    """
    sp = _compared(spans, options.skip_steps, options.phases)
    if sp.height == 0:
        return pl.DataFrame()
    rank = sp["rank"].min()
    sp = sp.filter(pl.col("rank") == rank).sort("step", "thread_id", "span_id")
    call = pl.struct(
        pl.col("phase").to_physical(), pl.col("depth"), pl.col("fqn").cast(pl.Categorical).to_physical()
    ).hash()
    return sp.select("rank", "step", "phase", "depth", "fqn", call.alias("call"))


def first_divergence(base_spans: pl.DataFrame, cand_spans: pl.DataFrame, options: DiffOptions) -> Divergence | None:
    """The first compared step (k-th of each run) whose call sequences differ, with an aligned excerpt."""
    seq_b = call_sequences(base_spans, options)
    seq_c = call_sequences(cand_spans, options)
    if seq_b.height == 0 or seq_c.height == 0:
        return None

    def sigs(seq: pl.DataFrame) -> pl.DataFrame:
        return (
            seq.group_by("step", maintain_order=True)
            .agg(pl.col("call"))
            .select("step", pl.col("call").hash().alias("sig"))
            .with_row_index("k")
        )

    sb, sc = sigs(seq_b), sigs(seq_c)
    both = sb.join(sc, on="k", suffix="_c").filter(pl.col("sig") != pl.col("sig_c")).sort("k")
    if both.height == 0:
        return None
    step_b, step_c = int(both["step"][0]), int(both["step_c"][0])
    a = seq_b.filter(pl.col("step") == step_b)
    b = seq_c.filter(pl.col("step") == step_c)
    excerpt, position = _excerpt(a, b, options)
    return Divergence(
        rank_base=int(seq_b["rank"][0]), rank_cand=int(seq_c["rank"][0]),
        step_base=step_b, step_cand=step_c, position=position, excerpt=excerpt,
    )


def _display(phase: str, depth: int, fqn: str) -> str:
    return f"{phase:<9} {'  ' * depth}{fqn}"


def _excerpt(a: pl.DataFrame, b: pl.DataFrame, options: DiffOptions) -> tuple[pl.DataFrame, int]:
    la, lb = a["call"].to_list(), b["call"].to_list()
    da = [_display(str(p), d, str(f)) for p, d, f in a.select("phase", "depth", "fqn").iter_rows()]
    db = [_display(str(p), d, str(f)) for p, d, f in b.select("phase", "depth", "fqn").iter_rows()]
    ops = difflib.SequenceMatcher(None, la, lb, autojunk=False).get_opcodes()
    first = next(i for i, op in enumerate(ops) if op[0] != "equal")
    tag, i1, i2, j1, j2 = ops[first]
    rows: list[tuple[str, int | None, int | None, str | None, str | None]] = []
    ctx = options.excerpt_context
    for k in range(max(0, i1 - ctx), i1):
        rows.append(("=", k + 1, j1 - (i1 - k) + 1, da[k], db[j1 - (i1 - k)]))
    changed: list[tuple[str, int | None, int | None, str | None, str | None]] = []
    for k in range(max(i2 - i1, j2 - j1)):
        ia, ib = i1 + k, j1 + k
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
    for k in range(ctx):
        ia, ib = i2 + k, j2 + k
        if ia >= len(la) or ib >= len(lb) or la[ia] != lb[ib]:
            break
        rows.append(("=", ia + 1, ib + 1, da[ia], db[ib]))
    return pl.DataFrame(rows, schema=EXCERPT_SCHEMA, orient="row"), min(i1, j1) + 1


# -- the whole diff -------------------------------------------------------------


def diff_spans(base_spans: pl.DataFrame, cand_spans: pl.DataFrame, options: DiffOptions | None = None) -> DiffResult:
    """Two spans frames -> timing comparison, structure findings, first order divergence, summary."""
    options = options or DiffOptions()
    units_b = step_units(base_spans, skip_steps=options.skip_steps)
    units_c = step_units(cand_spans, skip_steps=options.skip_steps)
    base = fill_steps(compared_samples(base_spans, skip_steps=options.skip_steps, phases=options.phases), units_b)
    cand = fill_steps(compared_samples(cand_spans, skip_steps=options.skip_steps, phases=options.phases), units_c)
    step_b = _median(units_b["step_ns"])
    step_c = _median(units_c["step_ns"])
    timing = compare_timing(base, cand, options, step_ns=step_b)
    structure = compare_structure(base_spans, cand_spans, base, cand, options)
    divergence = first_divergence(base_spans, cand_spans, options)
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
    n_b, n_c = units_b.height, units_c.height
    summary: dict[str, object] = {
        "base_steps": n_b,
        "cand_steps": n_c,
        "base_step_ns": step_b,
        "cand_step_ns": step_c,
        "step_ratio": (step_c / step_b) if step_b and step_c is not None else None,
        "compared": timing.height,
        "regressions": int(by_verdict.get("regression", 0)),
        "improvements": int(by_verdict.get("improvement", 0)),
        "inherited": int(by_verdict.get("inherited", 0)),
        "structure_changes": structure.height,
        "min_p_value": min_p_value(n_b, n_c),
    }
    return DiffResult(timing=timing, structure=structure, divergence=divergence, summary=summary)


def _median(values: pl.Series) -> float | None:
    if values.len() == 0:
        return None
    m = values.median()
    return float(m) if m is not None else None  # type: ignore[arg-type]
