"""``--step-on`` and ``--step-kind``: a run's steps as the commands compare them.

``restep`` reads what a run's steps can be made of (``modtrace.store.roots``)
and hands it to ``modtrace.analysis.steps``; ``like_with_like`` keeps the
steps of one kind in each of the frames a command compares.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import click

from modtrace.errors import UsageError
from modtrace.step_rules import STEP_RULES

if TYPE_CHECKING:
    import polars as pl

    from modtrace.store.engine import Store

NO_KIND = "-"  # how a step without a root call shows its kind

F = TypeVar("F", bound=Callable[..., Any])


def step_on_option(f: F) -> F:
    return click.option(
        "--step-on", type=click.Choice(STEP_RULES), default=None,
        help="What makes a step: auto (optimizer steps when the run made any, else root calls: each outermost "
             "module call, e.g. one per generated token), optimizer, root, manual (Recorder.step() only). "
             "Default: the rule the run was recorded with.",
    )(f)


def step_kind_option(default: str) -> Callable[[F], F]:
    def wrap(f: F) -> F:
        return click.option(
            "--step-kind", metavar="KIND|all", default=None,
            help="Only steps of this kind: the input shape of the step's first root call, e.g. input_ids=1x1 "
                 f"(decode) vs input_ids=1x7 (prefill); all for every step. Default: {default}.",
        )(f)
    return wrap


@dataclass(frozen=True)
class Stepped:
    """A frame with its steps under ``rule``, and each step's kind."""

    frame: pl.DataFrame
    kinds: pl.DataFrame  # analysis.steps.KIND_SCHEMA
    rule: str  # optimizer | manual | root
    recorded_on: str  # runs.step_on

    def describe(self) -> dict[str, Any]:
        from modtrace.analysis.steps import kind_counts

        return {
            "step_on": self.recorded_on,
            "step_rule": self.rule,
            "step_kinds": [{"kind": k, "steps": n} for k, n in kind_counts(self.kinds)],
        }


def restep(store: Store, run_id: int, run_name: str, frame: pl.DataFrame, step_on: str | None,
           ranks: Sequence[int] | None = None) -> Stepped:
    """``frame`` (spans or calls of the run) with its steps under ``step_on`` (None: the run's own rule)."""
    import polars as pl

    from modtrace.analysis.steps import ROOT_SCHEMA, assign_steps, step_kinds
    from modtrace.step_rules import StepRuleError, resolve_rule
    from modtrace.store.roots import read_step_basis

    basis = read_step_basis(store, run_id, ranks)
    try:
        rule = resolve_rule(step_on, basis.step_on, basis.made_steps)
    except StepRuleError as exc:
        raise UsageError(f"--step-on {step_on}: run {run_name!r}: {exc}") from None
    roots = pl.DataFrame(basis.roots, schema=ROOT_SCHEMA, orient="row")
    if rule == "root" and roots.height == 0 and frame.height:
        raise UsageError(f"run {run_name!r} has no root calls recorded (recorded before modtrace knew them); "
                         "its steps are its optimizer steps (--step-on optimizer)")
    stepped = assign_steps(frame, roots, rule)
    return Stepped(stepped, step_kinds(stepped, roots), rule, basis.step_on)


def run_steps(step_on: str, recorded: int, roots: int) -> tuple[str, int]:
    """(the rule a run's steps follow by default, how many there are): from its runs.step_on,
    its recorded step count and its root calls (``runs`` and ``show``)."""
    from modtrace.step_rules import resolve_rule

    rule = resolve_rule(None, step_on, recorded > 0)
    return rule, roots if rule == "root" else recorded


def rule_label(step_on: str, rule: str) -> str:
    """``root`` or, for a rule resolved from auto, ``auto: root``."""
    return f"{step_on}: {rule}" if step_on != rule else rule


def kind_value(kind: str) -> str | None:
    return None if kind == NO_KIND else kind


def _kinds_text(kinds: pl.DataFrame) -> str:
    from modtrace.analysis.steps import kind_counts

    return ", ".join(f"{NO_KIND if k is None else k} ({n})" for k, n in kind_counts(kinds))


def of_kind(run_name: str, stepped: Stepped, kind: str) -> pl.DataFrame:
    """The rows of steps of ``kind`` (a usage error naming the run's kinds when it has none)."""
    from modtrace.analysis.steps import of_kind as keep

    value = kind_value(kind)
    if value not in set(stepped.kinds["kind"].to_list()):
        raise UsageError(f"--step-kind {kind}: run {run_name!r} has no steps of that kind "
                         f"(its kinds: {_kinds_text(stepped.kinds)})")
    return keep(stepped.frame, stepped.kinds, value)


def like_with_like(runs: Sequence[tuple[str, Stepped]], kind: str | None) -> tuple[list[pl.DataFrame], str | None]:
    """The frames to compare: the steps of ``kind`` in each run (None: the kind most steps of the
    runs share, when they have more than one; ``all``: every step), and the kind compared."""
    from modtrace.analysis.steps import ALL_KINDS, common_kind

    if kind == ALL_KINDS:
        return [s.frame for _, s in runs], None
    if kind is None:
        chosen = common_kind(*(s.kinds for _, s in runs))
        if chosen is None:
            return [s.frame for _, s in runs], None
        kind = chosen
    return [of_kind(name, s, kind) for name, s in runs], kind_value(kind)
