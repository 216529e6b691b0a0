"""A run's steps under a step rule, and like-with-like comparisons of steps of one kind.

``restep`` reads what a run's steps can be made of (``modtrace.store.roots``:
its recorded rule, whether its step counter advanced, its root calls) and
hands it to ``modtrace.analysis.steps``; ``like_with_like`` keeps the steps
of one kind in each of the frames a comparison takes.  ``run_steps`` gives
a run's default rule and step count for ``runs`` and ``show``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from modtrace.core.errors import UsageError

if TYPE_CHECKING:
    import polars as pl

    from modtrace.store.engine import Store

NO_KIND = "-"  # how a step without a root call names its kind


@dataclass(frozen=True)
class Stepped:
    """A frame with its steps under ``rule``, and each step's kind."""

    frame: pl.DataFrame
    kinds: pl.DataFrame  # analysis.steps.KIND_SCHEMA
    rule: str  # optimizer | manual | root
    recorded_on: str  # runs.step_on

    def kind_counts(self) -> list[tuple[str | None, int]]:
        """(kind, steps), most steps first; None is the kind of steps without a root call."""
        from modtrace.analysis.steps import kind_counts

        return kind_counts(self.kinds)

    def describe(self) -> dict[str, Any]:
        return {
            "step_on": self.recorded_on,
            "step_rule": self.rule,
            "step_kinds": [{"kind": k, "steps": n} for k, n in self.kind_counts()],
        }


def restep(store: Store, run_id: int, run_name: str, frame: pl.DataFrame, step_on: str | None,
           ranks: Sequence[int] | None = None) -> Stepped:
    """``frame`` (spans or calls of the run) with its steps under ``step_on`` (None: the run's own
    rule, ``results.steps.apply_step_rule``), and each step's kind."""
    from modtrace.analysis.steps import step_kinds
    from modtrace.core.step_rules import StepRuleError
    from modtrace.results.steps import NoRootCalls, apply_step_rule

    try:
        stepping = apply_step_rule(store, run_id, frame, step_on, ranks)
    except NoRootCalls:
        why = (f"run {run_name!r} has module calls but no root calls recorded: modtrace noted none before "
               "schema revision 0003, and before 0011 only those of the main thread (a run serving on "
               "worker threads); record it again, or use its recorded steps")
        raise UsageError(f"{why} (step_on='optimizer')", cli=f"{why} (--step-on optimizer)") from None
    except StepRuleError as exc:
        raise UsageError(f"step_on={step_on!r}: run {run_name!r}: {exc}",
                         cli=f"--step-on {step_on}: run {run_name!r}: {exc}") from None
    return Stepped(stepping.frame, step_kinds(stepping.frame, stepping.roots), stepping.rule, stepping.recorded_on)


def run_steps(step_on: str, recorded: int, roots: int) -> tuple[str, int]:
    """(the rule a run's steps follow by default, how many there are): from its runs.step_on,
    its recorded step count and its root calls."""
    from modtrace.core.step_rules import resolve_rule

    rule = resolve_rule(None, step_on, recorded > 0)
    return rule, roots if rule == "root" else recorded


def with_steps(store: Store, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run rows (``list_runs``) with ``steps`` counted under each run's own rule and ``step_rule`` added."""
    from modtrace.store.roots import root_call_counts

    roots = root_call_counts(store, [r["id"] for r in rows])
    for r in rows:
        n = max((k for (i, _), k in roots.items() if i == r["id"]), default=0)
        r["step_rule"], r["steps"] = run_steps(r["step_on"], r["steps"], n)
    return rows


def details_with_steps(store: Store, run_id: int, info: dict[str, Any]) -> dict[str, Any]:
    """``run_details`` with the run's and each rank's steps under its own rule, and ``step_rule``."""
    from modtrace.store.roots import root_call_counts

    roots = root_call_counts(store, [run_id])
    rule, info["steps"] = run_steps(info["step_on"], info["steps"], max(roots.values(), default=0))
    info["step_rule"] = rule
    for rank in info["rank_details"]:
        rank["steps"] = run_steps(info["step_on"], rank["steps"], roots.get((run_id, rank["rank"]), 0))[1]
    return info


def _kind_value(kind: str) -> str | None:
    return None if kind == NO_KIND else kind


def _kinds_text(stepped: Stepped) -> str:
    return ", ".join(f"{NO_KIND if k is None else k} ({n})" for k, n in stepped.kind_counts())


def of_kind(run_name: str, stepped: Stepped, kind: str) -> pl.DataFrame:
    """The rows of steps of ``kind`` (``-``: steps without a root call); a usage error naming the
    run's kinds when it has no step of that kind."""
    from modtrace.analysis.steps import of_kind as keep

    value = _kind_value(kind)
    if value not in set(stepped.kinds["kind"].to_list()):
        why = f"run {run_name!r} has no steps of that kind (its kinds: {_kinds_text(stepped)})"
        raise UsageError(f"step_kind={kind!r}: {why}", cli=f"--step-kind {kind}: {why}")
    return keep(stepped.frame, stepped.kinds, value)


def like_with_like(runs: Sequence[tuple[str, Stepped]], kind: str | None) -> tuple[list[pl.DataFrame], str | None]:
    """The frames to compare: the steps of ``kind`` in each run (None: the kind most steps of the
    runs share, when they have more than one; ``all``: every step), and the kind compared.  Runs
    whose kinds are all different (another batch size) are compared over every step, kind None:
    their structure is still comparable, and ``api._diff.unshared_kinds`` says so and pairs their
    counters."""
    from modtrace.analysis.steps import ALL_KINDS, common_kind

    if kind == ALL_KINDS:
        return [s.frame for _, s in runs], None
    if kind is None:
        chosen = common_kind(*(s.kinds for _, s in runs))
        if chosen is None:
            return [s.frame for _, s in runs], None
        kind = chosen
    return [of_kind(name, s, kind) for name, s in runs], _kind_value(kind)
