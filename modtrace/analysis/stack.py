"""The precise stack walk: one stack's rows, one at a time, every exit checked.

The vectorised rebuild in ``spans.py`` handles stacks whose rows nest
cleanly.  A stack whose rows do not (a dropped, duplicated or reordered row,
a crash) is walked here instead, so that every structural problem is named
at the row where it shows.  Pure Python, no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from modtrace.codes import Kind, Phase, Status

# Structural issue kinds this walk reports (status-based kinds are found in
# nesting.py from the exit rows themselves).
NO_ENTER = "no_enter"
UNCLOSED = "unclosed"
CROSSED = "crossed"
REENTERED = "reentered"
DUPLICATE_ENTER = "duplicate_enter"
DUPLICATE_EXIT = "duplicate_exit"

# (seq, kind, module_id, phase, call_id, status) of one row, in hierarchy order.
Row = tuple[int, int, int, int, int, int]


@dataclass
class _Open:
    seq: int
    module_id: int
    key: tuple[int, int]
    depth: int
    parent: int | None


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
    stack: list[_Open] = []
    open_keys: dict[tuple[int, int], _Open] = {}
    aside: dict[tuple[int, int], _Open] = {}
    closed: dict[tuple[int, int], tuple[int, int]] = {}  # key -> (enter seq, exit seq)
    recompute = int(Phase.RECOMPUTE)
    for seq, kind, module_id, phase, call_id, status in rows:
        key = (call_id, phase)
        if kind == Kind.ENTER:
            if key in open_keys:
                out.issues.append((seq, REENTERED, module_id, phase, call_id, {"other": open_keys[key].seq}))
                continue
            if key in aside:
                out.issues.append((seq, REENTERED, module_id, phase, call_id, {"other": aside[key].seq}))
                continue
            if key in closed and phase != recompute:
                first, last = closed[key]
                out.issues.append((seq, DUPLICATE_ENTER, module_id, phase, call_id, {"other": first, "other_exit": last}))
                continue
            parent = stack[-1].seq if stack else None
            entry = _Open(seq, module_id, key, len(stack), parent)
            stack.append(entry)
            open_keys[key] = entry
            continue
        if stack and stack[-1].key == key:
            entry = stack.pop()
            del open_keys[key]
            out.spans.append((entry.seq, seq, entry.parent, entry.depth))
            closed[key] = (entry.seq, seq)
        elif key in open_keys:
            top = stack[-1]
            out.issues.append(
                (seq, CROSSED, module_id, phase, call_id, {"other": top.seq, "other_module": top.module_id})
            )
            while stack[-1].key != key:
                inner = stack.pop()
                del open_keys[inner.key]
                aside[inner.key] = inner
            entry = stack.pop()
            del open_keys[key]
            out.spans.append((entry.seq, seq, entry.parent, entry.depth))
            closed[key] = (entry.seq, seq)
        elif key in aside:
            entry = aside.pop(key)
            out.spans.append((entry.seq, seq, entry.parent, entry.depth))
            closed[key] = (entry.seq, seq)
        elif key in closed:
            first, last = closed[key]
            out.issues.append((seq, DUPLICATE_EXIT, module_id, phase, call_id, {"other": first, "other_exit": last}))
        else:
            out.issues.append((seq, NO_ENTER, module_id, phase, call_id, {"status": status}))
    leftover = sorted([*stack, *aside.values()], key=lambda e: e.seq)
    for entry in leftover:
        out.spans.append((entry.seq, None, entry.parent, entry.depth))
        out.issues.append((entry.seq, UNCLOSED, entry.module_id, entry.key[1], entry.key[0], {}))
    return out


def is_acknowledged_no_enter(status: int | None) -> bool:
    """The recorder itself marked this exit as having no enter (not a corruption)."""
    return status == Status.NO_ENTER
