"""The precise stack walk: one stack's rows, one at a time, every exit checked.

The vectorised rebuild in ``spans.py`` handles stacks whose rows nest
cleanly.  A stack whose rows do not (a dropped, duplicated or reordered row,
a crash) is walked here instead, so that every structural problem is named
at the row where it shows.  Pure Python, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from modtrace.core.codes import Kind, Phase, Status

# The structural issue kinds this walk reports (status-based kinds are found
# in nesting.py from the exit rows themselves).
from modtrace.core.contracts import (
    CROSSED,
    DUPLICATE_ENTER,
    DUPLICATE_EXIT,
    NO_ENTER,
    REENTERED,
    UNCLOSED,
)

__all__ = ["CROSSED", "DUPLICATE_ENTER", "DUPLICATE_EXIT", "NO_ENTER", "REENTERED", "UNCLOSED", "walk_stack"]

# (seq, kind, module_id, phase, call_id, status) of one row, in hierarchy order.
Row = tuple[int, int, int, int, int, int]


# An open call: (enter seq, module id, (call_id, phase), depth, parent enter seq).
# A tuple, not a dataclass: the walk makes one per enter, millions on a big stack.
_Open = tuple[int, int, tuple[int, int], int, int | None]


@dataclass
class WalkResult:
    """Spans as (enter_seq, exit_seq or None, parent_span_id, depth); issues as
    (seq, kind, module_id, phase, call_id, detail) where detail holds the seqs
    and module the message needs."""

    spans: list[tuple[int, int | None, int | None, int]] = field(default_factory=list)
    issues: list[tuple[int, str, int, int, int, dict[str, int | None]]] = field(default_factory=list)


def walk_stack(rows: Iterable[Row]) -> WalkResult:
    """Rebuild one stack (one rank, thread and graph task) with a checked stack.

    - an exit closes the innermost open call when it is that call's;
    - an exit of an open call that is not innermost is ``crossed``: the
      calls opened inside it are set aside (closed later if their exit
      comes, else reported ``unclosed``);
    - an exit of a call never entered is ``no_enter``, of one already
      closed ``duplicate_exit``; neither makes a span;
    - an enter of an open call is ``reentered``, of a call that already ran
      ``duplicate_enter`` (a recompute may legitimately run again); the
      repeated enter is ignored;
    - calls still open at the end are ``unclosed``.
    """
    out = WalkResult()
    spans, issues = out.spans, out.issues
    stack: list[_Open] = []
    open_keys: dict[tuple[int, int], _Open] = {}
    aside: dict[tuple[int, int], _Open] = {}
    closed: dict[tuple[int, int], tuple[int, int]] = {}  # key -> (enter seq, exit seq)
    recompute = int(Phase.RECOMPUTE)
    enter = int(Kind.ENTER)
    for seq, kind, module_id, phase, call_id, status in rows:
        key = (call_id, phase)
        if kind == enter:
            if key in open_keys:
                issues.append((seq, REENTERED, module_id, phase, call_id, {"other": open_keys[key][0]}))
                continue
            if key in aside:
                issues.append((seq, REENTERED, module_id, phase, call_id, {"other": aside[key][0]}))
                continue
            if phase != recompute and key in closed:
                first, last = closed[key]
                issues.append((seq, DUPLICATE_ENTER, module_id, phase, call_id, {"other": first, "other_exit": last}))
                continue
            entry = (seq, module_id, key, len(stack), stack[-1][0] if stack else None)
            stack.append(entry)
            open_keys[key] = entry
            continue
        if stack and stack[-1][2] == key:
            entry = stack.pop()
            del open_keys[key]
            spans.append((entry[0], seq, entry[4], entry[3]))
            closed[key] = (entry[0], seq)
        elif key in open_keys:
            top = stack[-1]
            issues.append((seq, CROSSED, module_id, phase, call_id, {"other": top[0], "other_module": top[1]}))
            while stack[-1][2] != key:
                inner = stack.pop()
                del open_keys[inner[2]]
                aside[inner[2]] = inner
            entry = stack.pop()
            del open_keys[key]
            spans.append((entry[0], seq, entry[4], entry[3]))
            closed[key] = (entry[0], seq)
        elif key in aside:
            entry = aside.pop(key)
            spans.append((entry[0], seq, entry[4], entry[3]))
            closed[key] = (entry[0], seq)
        elif key in closed:
            first, last = closed[key]
            issues.append((seq, DUPLICATE_EXIT, module_id, phase, call_id, {"other": first, "other_exit": last}))
        else:
            issues.append((seq, NO_ENTER, module_id, phase, call_id, {"status": status}))
    leftover = sorted([*stack, *aside.values()], key=lambda e: e[0])
    for entry in leftover:
        spans.append((entry[0], None, entry[4], entry[3]))
        issues.append((entry[0], UNCLOSED, entry[1], entry[2][1], entry[2][0], {}))
    return out


def is_acknowledged_no_enter(status: int | None) -> bool:
    """The recorder itself marked this exit as having no enter (not a corruption)."""
    return status == Status.NO_ENTER
