"""Backward bookkeeping: the autograd node hooks that turn a call's backward
into enter and exit rows.

For every call that built autograd graph, the node producing each output
gets an *enter* entry and the node producing each input gets an *exit*
entry.  One pre-hook per node (a ``NodeHook``, kept in the node's metadata so
later calls find it) dispatches all entries of that node at once, exits first
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
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from modtrace.call_stack import _BACKWARD, _CLOSED_AT_END, _ENTER, _EXIT, _OK, Call, ThreadState

_graph_task_id = torch._C._current_graph_task_id


Entries = Call | list[Call] | None  # one call (the usual case: no list kept per node), several, or none


def joined(entries: Entries, call: Call) -> Call | list[Call]:
    """``entries`` with ``call`` added last."""
    if entries is None:
        return call
    if type(entries) is list:
        entries.append(call)
        return entries
    return [entries, call]  # type: ignore[list-item]


class NodeHook:
    """One autograd node's pre-hook: the calls whose backward it exits
    (``exits``, in the order their forwards returned) and enters (``enters``),
    each ``Entries``.  It is the hook itself (no closure per node): calling it
    dispatches them."""

    __slots__ = ("tracker", "leaf", "exits", "enters")

    def __init__(self, tracker: BackwardHooks, leaf: bool) -> None:
        self.tracker = tracker
        self.leaf = leaf  # an AccumulateGrad node: it outlives the graph
        self.exits: Entries = None
        self.enters: Entries = None

    def __call__(self, grad_outputs: Any) -> None:
        # Runs for every hooked node in every backward: the events are
        # appended inline, with no per-event method call.
        tr = self.tracker
        if not tr._active:
            return None
        exit_entries, enter_entries = self.exits, self.enters
        if self.leaf:
            # AccumulateGrad nodes outlive the graph: take their entries once.
            self.exits = self.enters = None
        exits: Sequence[Call] = () if exit_entries is None else exit_entries if type(exit_entries) is list else (exit_entries,)  # type: ignore[assignment]
        enters: Sequence[Call] = () if enter_entries is None else enter_entries if type(enter_entries) is list else (enter_entries,)  # type: ignore[assignment]
        task = _graph_task_id()
        open_calls = tr._bw.get(task)
        if open_calls is None:
            open_calls = tr._bw[task] = []
            torch.autograd.Variable._execution_engine.queue_callback(partial(tr._end_of_task, task))
        try:
            tid = tr._local.st.tid
        except AttributeError:
            tid = tr._thread().tid
        append, seq, clock, t0, step = tr._append, tr._seq, tr._clock, tr.t0, tr.step
        cuda = tr._cuda_devices
        failures = tr._failures
        group: int | None = None
        for call in exits:
            if failures and call.cancelled():
                continue
            if call.bw_task != task:
                if call in enters:  # output is its input (an identity): enter, then exit
                    group = tr._bw_enter(call, task, open_calls, tid, group)
                else:
                    continue  # its outputs never got a gradient: it had no backward
            if call.closed:
                continue
            seen = call.exits_seen + 1
            if seen < call.n_exit:
                call.exits_seen = seen
                continue
            call.closed = True
            while open_calls:
                top = open_calls.pop()
                top.closed = True  # a descendant nothing closed is done too, innermost first
                append((next(seq), clock() - t0, _EXIT, top.module_id, _BACKWARD, top.call_id, step, tid,
                        top.device_id, tr._stream(top.device_id) if cuda else None, _OK, task,
                        1 if group == -1 else 0))
                group = -1
                if top is call:
                    break
        for call in reversed(enters):
            if call.bw_task == task or (failures and call.cancelled()):
                continue
            if open_calls:
                top = open_calls[-1]
                if top is not call.parent and not call.descends_from(top):
                    group = tr._bw_enter(call, task, open_calls, tid, group)
                    continue
            call.bw_task = task
            call.exits_seen = 0
            call.closed = False
            open_calls.append(call)
            depth = call.depth
            append((next(seq), clock() - t0, _ENTER, call.module_id, _BACKWARD, call.call_id, step, tid,
                    call.device_id, tr._stream(call.device_id) if cuda else None, _OK, task,
                    1 if group is not None and depth >= group else 0))
            group = depth
        return None


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
        def _stream(self, device_id: int | None) -> int | None: ...
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
            group = self._bw_event(top, _EXIT, _OK, task, tid, group)
        open_calls.append(call)
        return self._bw_event(call, _ENTER, _OK, task, tid, group)

    def _bw_event(self, call: Call, kind: int, status: int, task: int, tid: int, group: int | None) -> int:
        """Append one backward row; returns the dispatch's new tie state."""
        if kind == _EXIT:
            tie, group = (1 if group == -1 else 0), -1
        else:
            tie, group = (1 if group is not None and call.depth >= group else 0), call.depth
        stream = self._stream(call.device_id) if self._cuda_devices else None
        self._append((next(self._seq), self._clock() - self.t0, kind, call.module_id, _BACKWARD, call.call_id,
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
            group = self._bw_event(call, _EXIT, _CLOSED_AT_END, task, tid, group)


def _leaf_node(t: torch.Tensor) -> Any:
    """The AccumulateGrad node of a leaf tensor needing grad, else None."""
    if t.requires_grad:
        view_node = t.view_as(t).grad_fn
        return view_node.next_functions[0][0] if view_node is not None else None
    return None
