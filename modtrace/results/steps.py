"""A run's step rule applied to a frame of its rows, in one place: the rule read from what
was recorded (``store.roots``), the steps assigned (``analysis.steps``).  ``tree``, ``diff``,
``report`` and ``check`` (through ``api._steps.restep``), the tree stored with an analysis
(``results.tree``) and the steps stored with it (tables ``step_rows`` and ``step_starts``, read
by the ``steps`` and ``span_steps`` views) all step a run through ``stepped``.

The stored steps follow the run's own rule; a caller's other rule (``--step-on``,
``Database.steps``) is computed from the spans."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from modtrace.core.step_rules import StepRuleError

if TYPE_CHECKING:
    import polars as pl

    from modtrace.store.engine import Store
    from modtrace.store.roots import StepBasis


class NoRootCalls(StepRuleError):
    """The rule is root calls, and the run has module calls but no root call recorded."""


@dataclass(frozen=True)
class Stepping:
    """A frame with its steps under ``rule``, and the root calls they were made of."""

    frame: pl.DataFrame
    roots: pl.DataFrame  # analysis.steps.ROOT_SCHEMA
    rule: str  # optimizer | manual | root
    recorded_on: str  # runs.step_on


def stepped(basis: StepBasis, frame: pl.DataFrame, step_on: str | None = None) -> Stepping:
    """``frame`` (rows of a run with ``rank``, ``span_id`` and ``step``) with ``step`` under
    ``step_on`` (None: the run's own rule, resolved as ``runs`` shows it), given what the run's
    steps can be made of (``basis``).  Raises ``StepRuleError`` for a rule the recording cannot
    follow, ``NoRootCalls`` when the rule is root calls and none was recorded."""
    import polars as pl

    from modtrace.analysis.steps import ROOT_SCHEMA, assign_steps
    from modtrace.core.step_rules import resolve_rule

    rule = resolve_rule(step_on, basis.step_on, basis.made_steps)
    roots = pl.DataFrame(basis.roots, schema=ROOT_SCHEMA, orient="row")
    if rule == "root" and roots.height == 0 and frame.height:
        raise NoRootCalls("it has module calls but no root calls recorded")
    return Stepping(assign_steps(frame, roots, rule), roots, rule, basis.step_on)


def apply_step_rule(store: Store, run_id: int, frame: pl.DataFrame, step_on: str | None = None,
                    ranks: Sequence[int] | None = None) -> Stepping:
    """``stepped`` with the run's basis read from the store (of ``ranks`` only when given)."""
    from modtrace.store.roots import read_step_basis

    return stepped(read_step_basis(store, run_id, ranks), frame, step_on)


def step_rows(run_id: int, basis: StepBasis, spans: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame] | None:
    """(step_rows, step_starts) of ``spans`` (span rows of the run, or of some of its ranks, with
    ``rank``, ``span_id``, ``step``, ``thread_id``, ``depth``, ``phase``, ``start_ns``, ``end_ns``,
    ``duration_ns``, ``self_ns``) under the run's own rule, with those tables' columns; None when
    there are no spans or the rule cannot be applied.  ``basis``: the whole run's
    (``store.roots.read_step_basis``), since the rule is the run's."""
    from modtrace.analysis.step_time import step_table
    from modtrace.analysis.steps import step_starts

    if spans.height == 0:
        return None
    try:
        stepping = stepped(basis, spans)
    except StepRuleError:
        return None
    return stored_step_rows(run_id, stepping.rule, step_table(stepping.frame, with_start=True),
                            step_starts(stepping.frame))


def stored_step_rows(run_id: int, rule: str, table: pl.DataFrame,
                     starts: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(step_rows, step_starts) with those tables' columns, from ``step_table(..., with_start=True)``
    and ``step_starts`` of a run's spans under its ``rule`` (or of their fold: ``analysis.step_fold``)."""
    import polars as pl

    run = pl.lit(run_id, pl.Int64).alias("run_id")
    return table.select(run, pl.all(), pl.lit(rule).alias("step_rule")), starts.select(run, pl.all())
