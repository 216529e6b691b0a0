"""Lines that say what a comparison's steps are: their rule and their kinds."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from modtrace.core.step_rules import RULE_TEXT


def kinds_text(kinds: list[Mapping[str, Any]]) -> str:
    return ", ".join(f"{'-' if k['kind'] is None else k['kind']}: {k['steps']}" for k in kinds)


def step_lines(base: Mapping[str, Any], cand: Mapping[str, Any]) -> list[str]:
    """The runs' step rules when they differ, and the kind compared with each run's steps per kind."""
    lines = []
    rb, rc = base.get("step_rule"), cand.get("step_rule")
    if rb and rc and rb != rc:
        lines.append(f"note: the runs' steps follow different rules: base's are {RULE_TEXT.get(rb, rb)}, "
                     f"cand's {RULE_TEXT.get(rc, rc)} (--step-on chooses one rule for both)")
    kb, kc = base.get("step_kinds") or [], cand.get("step_kinds") or []
    kind = base.get("step_kind")
    named = [{k["kind"] for k in kinds if k["kind"] is not None} for kinds in (kb, kc)]
    unshared = all(named) and not named[0] & named[1]  # one kind each, but not the same one
    if kind is not None or len(kb) > 1 or len(kc) > 1 or unshared:
        what = f"steps of kind {kind} compared" if kind is not None else "steps of every kind compared"
        if unshared:
            what = f"the runs share no step kind: {what}"
        lines.append(f"{what} (--step-kind); steps per kind: base {kinds_text(kb)}; cand {kinds_text(kc)}")
    return lines
