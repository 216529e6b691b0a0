"""A run's calls -> its compared steps and per-step samples, matched by module name.

Steps (``step_units``)
    The compared steps of a run: each rank's steps after its first
    ``skip_steps`` (step 0 usually pays one-time costs: allocator warm-up,
    lazy initialisation), with ``step_ns``, the step time
    (``analysis.step_time``) of that (rank, step).  With several ranks, each
    (rank, step) is one sample.

Samples (``compared_samples`` + ``fill_steps``)
    One row per (rank, step, module, phase): the module's call count and its
    inclusive and self time summed over those calls.  A module that ran in
    some compared steps but not others counts 0 in the others, so a sample is
    always "time per step".  Each sample also has its *share of the step*:
    self (inclusive) time / the (rank, step)'s time in module calls of the
    compared phases (the sum of their self times; without a phase filter,
    the step time), in parts per billion.
"""

from __future__ import annotations

import polars as pl

from modtrace.analysis.diff.frames import (
    CALL_SCHEMA,
    PHASE_SLOTS,
    PPB,
    SAMPLE_SCHEMA,
    RunCalls,
    of_phases,
    pack_key,
)
from modtrace.analysis.events import lookup_key
from modtrace.analysis.step_time import summed_step_time

# Group keys are packed into one Int64 below this bound (else grouped on three columns).
_PACKED_LIMIT = 2**62


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

    ``pack_key(mkey, phase)`` names (fqn, phase) the same way in both runs.
    """
    names = pl.concat([m.select(pl.col("fqn").cast(pl.String)) for m in module_frames]).unique().sort("fqn")
    return names.with_row_index("mkey").select("fqn", pl.col("mkey").cast(pl.Int64))


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
        .agg(summed_step_time().cast(pl.Int64).alias("step_ns"))
        .with_columns(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int32))
        .sort("rank", "step")
    )


def compared_samples(compared: pl.DataFrame, phases: tuple[str, ...] | None = None) -> pl.DataFrame:
    """Compared calls with ``mkey`` -> per-step samples (``SAMPLE_SCHEMA``) of ``phases``, unordered.

    Only modules that ran in a step have a row for it; ``fill_steps`` adds the zeros.
    """
    sp = of_phases(compared, phases)
    sums = (
        pl.len().alias("calls"),
        pl.col("duration_ns").sum().alias("incl_ns"),
        pl.col("self_ns").sum().alias("self_ns"),
    )
    key = pack_key(pl.col("mkey"), pl.col("phase").cast(pl.Int64))
    if sp.height == 0:
        return pl.DataFrame(schema=SAMPLE_SCHEMA)
    r0, r1, s0, s1, m1 = sp.select(
        pl.col("rank").min().alias("r0"), pl.col("rank").max().alias("r1"), pl.col("step").min().alias("s0"),
        pl.col("step").max().alias("s1"), pl.col("mkey").max().alias("m1"),
    ).row(0)
    ranks, steps, keys = r1 - r0 + 1, s1 - s0 + 1, (m1 + 1) * PHASE_SLOTS
    if ranks * steps * keys >= _PACKED_LIMIT:
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
