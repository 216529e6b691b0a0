"""Recompute linking: forward hooks firing inside a backward graph task while
activation checkpointing recomputes are recomputation, and take the original
forward call's id; any other module call made during backward (by a custom
autograd Function's backward, a backward hook) is a ``backward_call`` of its own.

What made the call is told by the Python frames above its hook, and only for
the outermost module call made in a graph task (the calls inside it are what
it is): the first frame that is checkpoint's recomputation (the unpack hook of
non-reentrant ``torch.utils.checkpoint``, the backward of its reentrant
``CheckpointFunction``; Hugging Face's and Lightning's gradient checkpointing
run these) makes a recompute; the first that is other backward code (a custom
Function's backward, run by ``BackwardCFunction.apply``; a backward started by
``_engine_run_backward``, whose hooks made the call), or none, a backward call.
Ordinary forwards never look.

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
import warnings
import weakref
from collections import deque
from functools import cache
from types import CodeType, FrameType

import torch

from modtrace.core.codes import PHASE_RECOMPUTE
from modtrace.tracking.calls import Call
from modtrace.tracking.module_names import ModuleInfo

# The torch whose private names below were checked (a test pins them).
TESTED_TORCH = "2.13"


@cache
def backward_codes() -> dict[CodeType, bool] | None:
    """The code objects whose frames tell what made a module call in a backward
    graph task: True for checkpoint recomputation, False for other backward
    code.  None, with a warning once, when this torch lacks one of them (they
    are private: torch.utils.checkpoint's ``_checkpoint_hook`` and
    ``CheckpointFunction``, torch.autograd's ``BackwardCFunction`` and
    ``_engine_run_backward``, as in torch 2.13)."""
    try:
        from torch.autograd.function import BackwardCFunction
        from torch.autograd.graph import _engine_run_backward
        from torch.utils import checkpoint as ckpt

        unpack = [c for c in ckpt._checkpoint_hook.__init__.__code__.co_consts
                  if isinstance(c, CodeType) and c.co_name == "unpack_hook"]
        if len(unpack) != 1:
            raise LookupError("torch.utils.checkpoint._checkpoint_hook has no one unpack_hook")
        return {
            unpack[0]: True,
            ckpt.CheckpointFunction.backward.__code__: True,
            BackwardCFunction.apply.__code__: False,
            BackwardCFunction.apply_boxed.__code__: False,
            _engine_run_backward.__code__: False,
        }
    except (ImportError, AttributeError, LookupError) as exc:
        warnings.warn(
            f"modtrace: torch {torch.__version__} lacks the internals that tell checkpoint recomputation from other"
            f" module calls made during backward (tested with torch {TESTED_TORCH}: {exc}); every module call made"
            " during backward is recorded as a recompute", RuntimeWarning, stacklevel=2)
        return None


def recomputing(frame: FrameType | None) -> bool:
    """Whether the module call whose hook runs below ``frame`` (in a backward
    graph task) is checkpoint recomputation; see the module docstring."""
    codes = backward_codes()
    if codes is None:
        return True
    while frame is not None:
        found = codes.get(frame.f_code)
        if found is not None:
            return found
        frame = frame.f_back
    return False



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
        parent = stack[-1] if stack and stack[-1].phase == PHASE_RECOMPUTE else None
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
