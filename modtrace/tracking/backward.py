"""Backward bookkeeping: the autograd node hooks that turn a call's backward
into enter and exit rows.

For every call that built autograd graph, the node producing each output
gets an *enter* entry and the node producing each input gets an *exit*
entry.  One pre-hook per node (``calls.NodeHook``: the call that made
the node, or a ``NodeHook`` of its own for a node no call made, kept in the
node's metadata so later calls find it) dispatches all entries of that node
at once, exits first
(innermost first), then enters (outermost first), so the ties that torch's
per-module hooks produce (a parent and its child sharing a tensor) come out
already nested.  Backward nesting follows the call tree recorded in forward:
a call's parent is the call that was open on its thread when it started,
whoever owns the module (a registered child, a module borrowed from a list,
one built inside the forward).  A backward span still open when the backward
of a call that is not its descendant starts has finished (the engine runs one
node at a time per device) and is closed then; spans no hook ever closes
(inputs that need no grad) are closed, innermost first, when the graph task
ends, with status ``closed_at_end_of_backward``.  Rows of one dispatch are
marked as ties only while the analysis' tie order (exits first, then enters
by module depth) is the order they were written in, so the analysis never
moves an exit before its own enter.

``group`` below is the tie state of one dispatch: None before its first row,
-1 while the rows since the last tie=0 row are all exits, else the module
depth of the last enter.  A row is tied to the previous one only when the
analysis' tie order keeps it where it was written.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from modtrace.core.codes import (
    KIND_ENTER,
    KIND_EXIT,
    PHASE_BACKWARD,
    STATUS_CLOSED_AT_END_OF_BACKWARD,
    STATUS_OK,
)
from modtrace.tracking.calls import (
    Call,
    NodeHook,
    ThreadState,
    joined,
)


class BackwardHooks:
    """The tracker's backward half (a mixin of ``Tracker``): node hooks made
    in the forward post-hook, the dispatch's helpers, the end of a graph task."""

    _active: bool
    _append: Callable[[tuple[Any, ...]], Any]
    _seq: itertools.count[int]
    _clock: Callable[[], int]
    t0: int
    step: int
    _cuda_devices: set[int]
    _failures: int
    _local: threading.local
    _meta_key: str
    _leaf_handles: WeakIdKeyDictionary
    # backward: graph task -> open calls (a stack, innermost last)
    _bw: dict[int, list[Call]]
    _recomputed: dict[int, set[int]]

    if TYPE_CHECKING:
        def _thread(self) -> ThreadState: ...
        def _stream(self, device_id: int | None, seq: int) -> int | None: ...
        def _prune_recent(self) -> None: ...
        def _open_forward_calls(self) -> int: ...

    def _exit_entries(self, frame: Call, exit_nodes: list[torch.Tensor]) -> None:
        seen: set[int] = set()
        for t in exit_nodes:
            node = t.grad_fn
            if node is None:
                node = _leaf_node(t)
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            hook = self._hook(node, t)
            hook.exits = joined(hook.exits, frame)
        frame.n_exit = len(seen)

    def _hook(self, node: Any, t: torch.Tensor) -> NodeHook:
        hook: NodeHook | None = node.metadata.get(self._meta_key)
        if hook is None:
            hook = self._new_hook(node, t, t.grad_fn is None)
        return hook

    def _new_hook(self, node: Any, t: torch.Tensor, leaf: bool) -> NodeHook:
        """Hang a new hook on ``node``, made by ``t`` (``leaf``: ``node`` is the
        AccumulateGrad node of ``t``, a leaf tensor)."""
        hook = NodeHook(self, leaf)
        node.metadata[self._meta_key] = hook
        handle = node.register_prehook(hook)
        if leaf:
            old = self._leaf_handles.get(t)  # type: ignore[no-untyped-call]
            if old is not None:
                old.remove()
            self._leaf_handles[t] = handle
        return hook

    def _bw_enter(self, call: Call, task: int, open_calls: list[Call], tid: int, group: int | None) -> int:
        call.bw_task = task
        call.exits_seen = 0
        call.closed = False
        while open_calls:
            top = open_calls[-1]
            if top is call.parent or call.descends_from(top):
                break
            # The backward of a call outside this one's starts: the open one has finished.
            open_calls.pop()
            top.closed = True
            group = self._bw_event(top, KIND_EXIT, STATUS_OK, task, tid, group)
        open_calls.append(call)
        return self._bw_event(call, KIND_ENTER, STATUS_OK, task, tid, group)

    def _bw_event(self, call: Call, kind: int, status: int, task: int, tid: int, group: int | None) -> int:
        """Append one backward row; returns the dispatch's new tie state."""
        if kind == KIND_EXIT:
            tie, group = (1 if group == -1 else 0), -1
        else:
            tie, group = (1 if group is not None and call.depth >= group else 0), call.depth
        seq = next(self._seq)
        stream = self._stream(call.device_id, seq) if self._cuda_devices else None
        self._append((seq, self._clock() - self.t0, kind, call.module_id, PHASE_BACKWARD, call.call_id,
                      self.step, tid, call.device_id, stream, status, task, tie))
        return group

    def _end_of_task(self, task: int) -> None:
        open_calls = self._bw.pop(task, None)
        self._recomputed.pop(task, None)
        if not self._bw and not self._open_forward_calls():
            self._prune_recent()  # a backward pass ended outside any forward
        if not open_calls or not self._active:
            return
        try:
            tid = self._local.st.tid
        except AttributeError:
            tid = self._thread().tid
        group: int | None = None
        for call in reversed(open_calls):
            call.closed = True
            group = self._bw_event(call, KIND_EXIT, STATUS_CLOSED_AT_END_OF_BACKWARD, task, tid, group)


def _leaf_node(t: torch.Tensor) -> Any:
    """The AccumulateGrad node of a leaf tensor needing grad, else None."""
    if t.requires_grad:
        view_node = t.view_as(t).grad_fn
        return view_node.next_functions[0][0] if view_node is not None else None
    return None
