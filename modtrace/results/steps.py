"""A run's steps under its own step rule, as its analysis stores them (tables ``step_rows`` and
``step_starts``, read by the ``steps`` and ``span_steps`` views).

The step table and each span's step are ``modtrace.analysis`` (``step_time.step_table``,
``steps.assign_steps``); this computes them from a run's spans once, when the spans are
written (``materialize``), so that SQL reads a run's steps by key.  A caller's other rule
(``--step-on``, ``Database.steps``) is computed from the spans as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

    from modtrace.store.roots import StepBasis


def own_rule(basis: StepBasis) -> str | None:
    """The run's own step rule (``runs.step_on`` resolved), None when it cannot be applied."""
    from modtrace.core.step_rules import StepRuleError, resolve_rule

    try:
        return resolve_rule(None, basis.step_on, basis.made_steps)
    except StepRuleError:
        return None


def step_rows(run_id: int, basis: StepBasis, spans: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    """(step_rows, step_starts) of ``spans`` (span rows of the run, or of some of its ranks, with
    ``rank``, ``span_id``, ``step``, ``thread_id``, ``depth``, ``phase``, ``start_ns``, ``end_ns``,
    ``duration_ns``, ``self_ns``) under the run's own rule, with those tables' columns; None when
    there are no spans or the rule cannot be applied.  ``basis``: the whole run's
    (``store.roots.read_step_basis``), since the rule is the run's."""
    import polars as pl

    from modtrace.analysis.step_time import step_table
    from modtrace.analysis.steps import ROOT_SCHEMA, assign_steps, step_starts

    rule = own_rule(basis)
    if rule is None or spans.height == 0:
        return None
    roots = pl.DataFrame(basis.roots, schema=ROOT_SCHEMA, orient="row")
    stepped = assign_steps(spans, roots, rule)
    run = pl.lit(run_id, pl.Int64).alias("run_id")
    table = step_table(stepped, with_start=True).select(run, pl.all(), pl.lit(rule).alias("step_rule"))
    return table, step_starts(stepped).select(run, pl.all())
