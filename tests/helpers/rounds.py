"""A recording's spans cut into rounds as the analysis that follows a recording closes them
(``results.incremental``): by the seq of their exit, calls never exited in the last round, each
round's spans keyed by step (``analysis.steps.step_keys``) from the root calls entered up to its
last span only, as they would be while the program still runs.  The folds'
(``analysis.tree_fold``, ``analysis.step_fold``) tests feed these rounds."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from modtrace.analysis.steps import ROOT_SCHEMA, step_keys
from modtrace.results.materialize import compute
from modtrace.results.steps import Stepping, apply_step_rule
from modtrace.store.engine import open_store
from modtrace.store.roots import StepBasis, read_step_basis


@dataclass
class Rounds:
    """A run's spans whole (sorted by rank and span id), stepped under its rule, and cut into rounds."""

    spans: pl.DataFrame
    stepping: Stepping
    basis: StepBasis
    rounds: list[pl.DataFrame]  # each with ``_key``


def keyed_rounds(db: str, run: str, rounds: int) -> Rounds:
    store = open_store(db)
    try:
        rid = int(store.engine.connect().exec_driver_sql(f"SELECT id FROM runs WHERE name = '{run}'").scalar())
        spans = compute(store, rid).spans.sort("rank", "span_id")
        stepping = apply_step_rule(store, rid, spans)
        basis = read_step_basis(store, rid)
    finally:
        store.dispose()
    last = int(spans["exit_seq"].max())  # type: ignore[arg-type]
    cuts = [last * i // rounds for i in range(1, rounds)] + [last + 1]
    parts, low = [], -1
    for i, cut in enumerate(cuts):
        part = spans.filter((pl.col("exit_seq") > low) & (pl.col("exit_seq") <= cut) if i < rounds - 1
                            else (pl.col("exit_seq") > low) | pl.col("exit_seq").is_null())
        low = cut
        if part.height == 0:
            continue
        bound = int(part["span_id"].max())  # type: ignore[arg-type]
        roots = pl.DataFrame([r for r in basis.roots if r[1] <= bound], schema=ROOT_SCHEMA, orient="row")
        parts.append(part.with_columns(step_keys(part, roots, stepping.rule).alias("_key")))
    return Rounds(spans, stepping, basis, parts)
