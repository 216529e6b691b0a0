"""Recompute linking: forward hooks firing inside a backward graph task are
activation-checkpoint recomputation, and take the original forward call's id.

The outermost recomputed call takes the module's latest forward call not yet
recomputed in this graph task, nested calls take the next unused call of that
module made under the linked parent.  Forward calls are kept for this (in
each module's ``ModuleInfo.recent`` and ``recent_parents``) while a root call
made with or before them is alive (its autograd graph or its open forward
keeps it) and until the next step.  A recompute with no call to link to (its
forward ran before the recording started, or was not seen) gets a call id of
its own, and its enter row the status ``unlinked`` that the analysis reports.
"""

from __future__ import annotations

import itertools
import weakref
from collections import deque

from modtrace.tracking.calls import _RECOMPUTE, Call
from modtrace.tracking.module_names import ModuleInfo


class RecomputeLinks:
    """The tracker's recompute half (a mixin of ``Tracker``)."""

    step: int
    _call_ids: itertools.count[int]
    # Forward calls that a checkpoint may recompute: every module's
    # ``recent`` entries in call order, and the root calls still alive
    # (open, or kept by their autograd graph) that keep them.
    _recent_order: deque[ModuleInfo]
    _live_roots: weakref.WeakSet[Call]
    _pruned_step: int
    _recomputed: dict[int, set[int]]  # graph task -> forward call ids recomputed in it

    def _link_recompute(self, info: ModuleInfo, stack: list[Call], task: int) -> int:
        """The forward call id a recompute of ``info``'s module takes; minus a
        new call id when there is none to link to."""
        used = self._recomputed.get(task)
        if used is None:
            used = self._recomputed[task] = set()
        recent = info.recent
        parent = stack[-1] if stack and stack[-1].phase == _RECOMPUTE else None
        chosen = 0
        if parent is not None:
            for call_id, parent_id in zip(recent, info.recent_parents, strict=True):
                if parent_id == parent.call_id and call_id not in used:
                    chosen = call_id
                    break
        if not chosen:
            for call_id in reversed(recent):
                if call_id not in used:
                    chosen = call_id
                    break
        if not chosen:
            return -next(self._call_ids)
        used.add(chosen)
        return chosen

    def _prune_recent(self) -> None:
        """Forget forward calls no checkpoint can recompute any more: those made
        before every root call still alive (a root call lives while it is open
        or its autograd graph is)."""
        self._pruned_step = self.step
        floor = min((call.call_id for call in list(self._live_roots)), default=None)
        order = self._recent_order
        while order:
            info = order[0]
            if floor is not None and info.recent[0] >= floor:
                break
            info.recent.popleft()
            info.recent_parents.popleft()
            order.popleft()
