"""The exact diff of work counters: per step kind, module and phase, the self FLOPs,
bytes and ops of the first counted step of that kind in each run.

The same shapes doing different work is a fact, not a statistic: no test, no
threshold.  A module is named only where its own (self) count changed; its
ancestors' inclusive counts inherit the change and are not findings.  Step
kinds, modules and phases found on one side only are left to the structure diff.
"""

from __future__ import annotations

import polars as pl

from modtrace.core.codes import Phase

COUNTERS = ("flops", "bytes", "ops")
COUNTER_CHANGE_SCHEMA = {"kind": pl.String, "fqn": pl.String, "phase": pl.String, "counter": pl.String,
                         "base": pl.Int64, "cand": pl.Int64, "lower_bound": pl.Boolean}


def _per_module(spans: pl.DataFrame) -> pl.DataFrame:
    """Self counts per (kind, fqn, phase) over the first counted range of each kind of each rank."""
    first = spans.group_by("rank", pl.col("kind").fill_null("")).agg(pl.col("first_seq").min())
    return (
        spans.with_columns(pl.col("kind").fill_null(""))
        .join(first, on=["rank", "kind", "first_seq"], how="semi")
        .group_by("kind", "fqn", "phase")
        .agg(*(pl.col(f"{c}_self").sum().alias(c) for c in COUNTERS), (pl.col("unknown_ops_self").sum() > 0).alias("unknown"))
    )


def counter_changes(base: pl.DataFrame, cand: pl.DataFrame, phases: tuple[str, ...] | None = None) -> pl.DataFrame:
    """The counters that differ (``COUNTER_CHANGE_SCHEMA``), one row per (kind, module, phase,
    counter), sorted; ``base`` and ``cand`` are ``store.counters.read_counted_spans`` frames.
    ``lower_bound``: either side's FLOPs count unknown ops."""
    if base.height == 0 or cand.height == 0:
        return pl.DataFrame(schema=COUNTER_CHANGE_SCHEMA)
    joined = _per_module(base).join(_per_module(cand), on=["kind", "fqn", "phase"], how="inner", suffix="_cand")
    names = {int(p): p.name.lower() for p in Phase}
    rows = []
    for r in joined.sort("kind", "fqn", "phase").iter_rows(named=True):
        phase = names.get(r["phase"], str(r["phase"]))
        if phases is not None and phase not in phases:
            continue
        for c in COUNTERS:
            if r[c] != r[f"{c}_cand"]:
                rows.append((r["kind"] or None, r["fqn"], phase, c, r[c], r[f"{c}_cand"],
                             bool(r["unknown"] or r["unknown_cand"])))
    return pl.DataFrame(rows, schema=COUNTER_CHANGE_SCHEMA, orient="row")
