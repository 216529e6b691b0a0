"""The exact diff of work counters: per step kind, module and phase, the self FLOPs,
bytes and ops of the first counted step of that kind in each run, and the memory its calls
kept (``kept_mem_bytes``: their own ``kept_mem_bytes_self`` summed) where both runs tracked it.

The same shapes doing different work is a fact, not a statistic: no test, no
threshold.  A module is named only where its own (self) count changed; its
ancestors' inclusive counts inherit the change and are not findings.  Step
kinds, modules and phases found on one side only are left to the structure diff.
"""

from __future__ import annotations

import polars as pl

from modtrace.core.codes import Phase

COUNTERS = ("flops", "bytes", "ops")
# Compared like a counter when both sides have it: bytes the module's own calls allocated and
# still held at their exit (the spans' kept_mem_bytes_self), the same for the same shapes.
KEPT = "kept_mem_bytes"
COUNTER_CHANGE_SCHEMA = {"kind": pl.String, "fqn": pl.String, "phase": pl.String, "counter": pl.String,
                         "base": pl.Int64, "cand": pl.Int64, "lower_bound": pl.Boolean}


def _per_module(spans: pl.DataFrame) -> pl.DataFrame:
    """Self counts per (kind, fqn, phase) over the first counted range of each kind of each rank
    (and the kept memory, null where no span of the group has it)."""
    first = spans.group_by("rank", pl.col("kind").fill_null("")).agg(pl.col("first_seq").min())
    kept = (pl.col(f"{KEPT}_self").sum().alias(KEPT) if f"{KEPT}_self" in spans.columns
            else pl.lit(None, dtype=pl.Int64).alias(KEPT))
    counted = (
        spans.with_columns(pl.col("kind").fill_null(""))
        .join(first, on=["rank", "kind", "first_seq"], how="semi")
    )
    has_kept = (pl.col(f"{KEPT}_self").is_not_null().any() if f"{KEPT}_self" in spans.columns else pl.lit(False))
    return counted.group_by("kind", "fqn", "phase").agg(
        *(pl.col(f"{c}_self").sum().alias(c) for c in COUNTERS), (pl.col("unknown_ops_self").sum() > 0).alias("unknown"),
        kept, has_kept.alias("has_kept"),
    ).with_columns(pl.when(pl.col("has_kept")).then(pl.col(KEPT)).alias(KEPT)).drop("has_kept")


def counter_changes(base: pl.DataFrame, cand: pl.DataFrame, phases: tuple[str, ...] | None = None) -> pl.DataFrame:
    """The counters that differ (``COUNTER_CHANGE_SCHEMA``), one row per (kind, module, phase,
    counter), sorted; ``base`` and ``cand`` are ``store.counters.read_counted_spans`` frames,
    with ``kept_mem_bytes_self`` where the runs tracked memory (``KEPT`` is compared only where
    both sides have it).  ``lower_bound``: either side's FLOPs count unknown ops."""
    if base.height == 0 or cand.height == 0:
        return pl.DataFrame(schema=COUNTER_CHANGE_SCHEMA)
    joined = _per_module(base).join(_per_module(cand), on=["kind", "fqn", "phase"], how="inner", suffix="_cand")
    names = {int(p): p.name.lower() for p in Phase}
    rows = []
    for r in joined.sort("kind", "fqn", "phase").iter_rows(named=True):
        phase = names.get(r["phase"], str(r["phase"]))
        if phases is not None and phase not in phases:
            continue
        for c in (*COUNTERS, KEPT):
            if c == KEPT and (r[c] is None or r[f"{c}_cand"] is None):
                continue
            if r[c] != r[f"{c}_cand"]:
                rows.append((r["kind"] or None, r["fqn"], phase, c, r[c], r[f"{c}_cand"],
                             bool(r["unknown"] or r["unknown_cand"])))
    return pl.DataFrame(rows, schema=COUNTER_CHANGE_SCHEMA, orient="row")
