"""What makes a step: the rules, shared by the recorder, the analysis and the CLI.

The recorder writes the recorded step counter (``events.step``: optimizer
steps and ``Recorder.step()``, or ``Recorder.step()`` alone under
``manual``) and root calls (``root_calls``: each outermost module call on
any thread).  ``resolve_rule`` says which of them a run's steps are;
``modtrace.analysis.steps`` builds them.  No torch or polars here.
"""

from __future__ import annotations

from modtrace.core.contracts import STEP_RULES

__all__ = ["RULE_TEXT", "STEP_RULES", "StepRuleError", "resolve_rule"]

# What a resolved rule's steps are, for people.
RULE_TEXT: dict[str, str] = {
    "optimizer": "optimizer steps",
    "manual": "Recorder.step() calls",
    "root": "root calls",
}


class StepRuleError(ValueError):
    """A rule that cannot be applied to a run after the fact."""


def resolve_rule(asked: str | None, recorded_on: str, made_steps: bool) -> str:
    """The rule a run's steps follow: ``optimizer``, ``manual`` or ``root``.

    ``asked`` is the caller's choice (None: the one the run was recorded
    with, ``recorded_on``); ``made_steps`` whether the run's recorded step
    counter ever advanced.  ``auto`` is the recorded steps when there are
    any, else root calls: a training loop keeps its optimizer steps
    (gradient accumulation and Lightning's closures included), an inference
    loop gets a step per ``model(...)``.  What the recorder did not record
    cannot be asked for: optimizer steps of a run recorded with ``manual``,
    or ``Recorder.step()`` alone of a run that also counted optimizer steps.
    """
    rule = asked or recorded_on
    if rule not in STEP_RULES:
        raise StepRuleError(f"step rule must be one of {', '.join(STEP_RULES)}, not {rule!r}")
    counter = "manual" if recorded_on == "manual" else "optimizer"
    if rule == "auto":
        return counter if made_steps else "root"
    if rule in ("optimizer", "manual") and rule != counter:
        if rule == "optimizer":
            raise StepRuleError("its optimizer steps were not recorded (it was recorded with step_on manual)")
        raise StepRuleError("its Recorder.step() calls cannot be told from its optimizer steps "
                            f"(it was recorded with step_on {recorded_on}); use optimizer")
    return rule
