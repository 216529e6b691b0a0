"""A run's step rule applied to a frame of its rows: the one place that reads what its steps
can be made of (``store.roots``) and assigns them (``analysis.steps``).  ``tree``, ``diff``,
``report``, ``check`` (through ``api._steps.restep``) and the tree stored with an analysis
(``results.tree``) all step a run through ``apply_step_rule``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from modtrace.core.step_rules import StepRuleError

if TYPE_CHECKING:
    import polars as pl

    from modtrace.store.engine import Store


class NoRootCalls(StepRuleError):
    """The rule is root calls, and the run has module calls but no root call recorded."""


@dataclass(frozen=True)
class Stepping:
    """A frame with its steps under ``rule``, and the root calls they were made of."""

    frame: pl.DataFrame
    roots: pl.DataFrame  # analysis.steps.ROOT_SCHEMA
    rule: str  # optimizer | manual | root
    recorded_on: str  # runs.step_on


def apply_step_rule(store: Store, run_id: int, frame: pl.DataFrame, step_on: str | None = None,
                    ranks: Sequence[int] | None = None) -> Stepping:
    """``frame`` (rows of the run with ``rank``, ``span_id`` and ``step``) with ``step`` under
    ``step_on`` (None: the run's own rule, resolved as ``runs`` shows it).  Raises
    ``StepRuleError`` for a rule the recording cannot follow, ``NoRootCalls`` when the rule is
    root calls and none was recorded."""
    import polars as pl

    from modtrace.analysis.steps import ROOT_SCHEMA, assign_steps
    from modtrace.core.step_rules import resolve_rule
    from modtrace.store.roots import read_step_basis

    basis = read_step_basis(store, run_id, ranks)
    rule = resolve_rule(step_on, basis.step_on, basis.made_steps)
    roots = pl.DataFrame(basis.roots, schema=ROOT_SCHEMA, orient="row")
    if rule == "root" and roots.height == 0 and frame.height:
        raise NoRootCalls("it has module calls but no root calls recorded")
    return Stepping(assign_steps(frame, roots, rule), roots, rule, basis.step_on)
