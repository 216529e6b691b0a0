"""A module call's record, each thread's stack of open calls, and closing
the calls a forward left open when it raised.

``Call`` is what the tracker's hooks share about one module call: open on its
thread's stack during the forward (or recompute), then, when it built
autograd graph, the backward bookkeeping that node hooks refer to.  It is the
only object made per call (beside the node hook of the call's output node and
the event tuples), so it carries every field the backward needs instead of
hanging more objects off it.

``ForwardUnwind`` (a mixin of the tracker) closes calls whose forward raised
(status ``error``, or ``early_stop`` for checkpoint recomputation stopping
itself) and those an exception no hook saw left open.
"""

from __future__ import annotations

import itertools
import sys
import threading
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from modtrace.core.codes import (
    KIND_ENTER,
    KIND_EXIT,
    PHASE_BACKWARD,
    PHASE_FORWARD,
    PHASE_RECOMPUTE,
    STATUS_EARLY_STOP,
    STATUS_ERROR,
    STATUS_OK,
)
from modtrace.tracking.module_names import ModuleInfo

_SILENT = -1  # phase of a frame that records nothing (the module of a compile wrapper, run eagerly)
_graph_task_id = torch._C._current_graph_task_id

# While dynamo traces a module our hooks must do nothing.  It cannot be
# tracing before torch._dynamo is imported, which spares the call in eager code.
_DYNAMO = "torch._dynamo"
_sys_modules = sys.modules
_compiler = torch.compiler


def _compiling() -> bool:
    """``torch.compiler.is_compiling()`` (the hooks inline it: one Python call
    fewer per hook once torch._dynamo is imported).  Dynamo folds
    ``is_dynamo_compiling()`` to True while it traces, as it does
    ``is_compiling()``; in eager code ``is_compiling()`` is the flag that
    torch.export and dynamo's compilation set."""
    return _dynamo_compiling() or _compiler._is_compiling_flag


_dynamo_compiling = torch.compiler.is_dynamo_compiling


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
    own = False  # True for a Call (the hook of its own output node), whose ``enters`` leave itself out

    def __init__(self, tracker: Any, leaf: bool) -> None:
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
        if enter_entries is None and self.own and type(exit_entries) is not list and exit_entries is not self \
                and not tr._failures:
            # The usual node: made by one call (this one), the input of at
            # most one other call, no other call's output: that call's exit,
            # then this call's enter, without the general case's sequences.
            me: Call = self  # type: ignore[assignment]
            task = _graph_task_id()
            open_calls = tr._bw.get(task)
            if open_calls is None:
                open_calls = tr._bw[task] = []
                torch.autograd.Variable._execution_engine.queue_callback(partial(tr._end_of_task, task))
            try:
                tid = tr._local.st.tid
            except AttributeError:
                tid = tr._thread().tid
            group: int | None = None
            done: Call | None = exit_entries  # type: ignore[assignment]
            if done is not None and done.bw_task == task and not done.closed:
                seen = done.exits_seen + 1
                if seen < done.n_exit:
                    done.exits_seen = seen
                else:
                    done.closed = True
                    append, seq, clock, t0, step, cuda = tr._append, tr._seq, tr._clock, tr.t0, tr.step, tr._cuda_devices
                    while open_calls:
                        top = open_calls.pop()
                        top.closed = True  # a descendant nothing closed is done too, innermost first
                        n = next(seq)
                        append((n, clock() - t0, KIND_EXIT, top.module_id, PHASE_BACKWARD, top.call_id, step, tid,
                                top.device_id, tr._stream(top.device_id, n) if cuda else None, STATUS_OK, task,
                                1 if group == -1 else 0))
                        group = -1
                        if top is done:
                            break
            if me.bw_task == task:
                return None
            if open_calls:
                top = open_calls[-1]
                if top is not me.parent and not me.descends_from(top):
                    tr._bw_enter(me, task, open_calls, tid, group)
                    return None
            me.bw_task = task
            me.exits_seen = 0
            me.closed = False
            open_calls.append(me)
            n = next(tr._seq)
            tr._append((n, tr._clock() - tr.t0, KIND_ENTER, me.module_id, PHASE_BACKWARD, me.call_id, tr.step, tid,
                        me.device_id, tr._stream(me.device_id, n) if tr._cuda_devices else None, STATUS_OK, task,
                        1 if group is not None and me.depth >= group else 0))
            return None
        if self.leaf:
            # AccumulateGrad nodes outlive the graph: take their entries once.
            self.exits = self.enters = None
        exits: Sequence[Call] = () if exit_entries is None else exit_entries if type(exit_entries) is list else (exit_entries,)  # type: ignore[assignment]
        enters: Sequence[Call]
        if self.own:  # a call hooking its output node: it enters first, then the calls in ``enters``
            me = self  # type: ignore[assignment]
            enters = (me,) if enter_entries is None else [me, *enter_entries] if type(enter_entries) is list else (me, enter_entries)  # type: ignore[assignment]
        else:
            enters = () if enter_entries is None else enter_entries if type(enter_entries) is list else (enter_entries,)  # type: ignore[assignment]
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
        group = None
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
                n = next(seq)
                append((n, clock() - t0, KIND_EXIT, top.module_id, PHASE_BACKWARD, top.call_id, step, tid,
                        top.device_id, tr._stream(top.device_id, n) if cuda else None, STATUS_OK, task,
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
            n = next(seq)
            append((n, clock() - t0, KIND_ENTER, call.module_id, PHASE_BACKWARD, call.call_id, step, tid,
                    call.device_id, tr._stream(call.device_id, n) if cuda else None, STATUS_OK, task,
                    1 if group is not None and depth >= group else 0))
            group = depth
        return None


class Call(NodeHook):
    """One module call (see the module docstring).  It is also the node hook
    of its output node (``NodeHook``'s fields are set when it becomes one), so
    that node needs no object of its own.  It enters that node's dispatch first
    without being in its own ``enters``: no reference cycle keeps it alive."""

    own = True
    leaf = False  # never an AccumulateGrad node's hook (read-only: shadows NodeHook's slot)

    ran_eager: bool
    exits_seen: int
    closed: bool
    n_exit: int

    __slots__ = ("module", "module_id", "depth", "parent", "call_id", "device_id", "phase", "task",
                 "exit_nodes", "bw_task", "exits_seen", "n_exit", "closed", "failed", "ran_eager", "__weakref__")

    def __init__(self, module: nn.Module, info: ModuleInfo, parent: Call | None, call_id: int,
                 device_id: int | None, phase: int, task: int | None, exit_nodes: Any = None) -> None:
        self.module: nn.Module | None = module  # dropped once the forward returns
        self.module_id = info.module_id
        self.depth = info.depth
        self.parent = parent  # the call open on this thread when this one started

        self.call_id = call_id
        self.device_id = device_id
        self.phase = phase
        self.task = task  # graph task of a recompute or backward_call, None in forward: the rows' task column
        # inputs needing grad, until the forward returns: one tensor, or a list of them
        self.exit_nodes = exit_nodes
        self.bw_task = -1  # graph task in which the backward was entered
        self.failed = False  # the forward raised: the backward of calls inside it never runs
        # Set later, where they are first needed (one store fewer each per call):
        # ``exits_seen`` and ``closed`` when the backward enters the call (read
        # only once ``bw_task`` is that backward's), ``n_exit`` when the call is
        # hung on its input nodes (read only for calls in a node's ``exits``).
        # ran_eager, set only on a torch.compile wrapper's call: its module ran eagerly inside it

    def descends_from(self, other: Call) -> bool:
        parent = self.parent
        while parent is not None:
            if parent is other:
                return True
            parent = parent.parent
        return False

    def cancelled(self) -> bool:
        """Made inside a forward that raised."""
        parent = self.parent
        while parent is not None:
            if parent.failed:
                return True
            parent = parent.parent
        return False


Entries = Call | list[Call] | None  # one call (the usual case: no list kept per node), several, or none


class ThreadState:
    __slots__ = ("tid", "stack", "memory")

    def __init__(self, tid: int) -> None:
        self.tid = tid
        self.stack: list[Call] = []
        # The counted region's memory log open on this thread (modtrace.tracking.memory), else None
        self.memory: Any = None


class ForwardUnwind:
    """Closing forward calls that raised or were left open (a mixin of ``Tracker``)."""

    _append: Callable[[tuple[Any, ...]], Any]
    _seq: itertools.count[int]
    _clock: Callable[[], int]
    t0: int
    step: int
    _cuda_devices: set[int]
    _failures: int
    _local: threading.local

    if TYPE_CHECKING:
        def _stream(self, device_id: int | None, seq: int) -> int | None: ...

    def _forward_failed(self, mod: nn.Module) -> None:
        """The post-hook of a forward that raised: close the call with status
        error (early_stop for checkpoint recomputation stopping itself)."""
        found = self._pop_call(mod)
        if found is None:
            return
        st, frame = found
        exc_type = sys.exc_info()[0]
        early = frame.phase == PHASE_RECOMPUTE and exc_type is not None and exc_type.__name__ == "_StopRecomputationError"
        status = STATUS_EARLY_STOP if early else STATUS_ERROR
        if status == STATUS_ERROR and frame.phase in (PHASE_FORWARD, _SILENT):
            # The backward hooks of calls made inside the failed one must never fire.
            frame.failed = True
            self._failures += 1
        self._exit_forward(st, frame, status)
        frame.module = None
        frame.exit_nodes = None

    def _pop_call(self, mod: nn.Module) -> tuple[ThreadState, Call] | None:
        """``mod``'s open call, taken off this thread's stack; None when it has
        none here (or while dynamo traces)."""
        if _DYNAMO in _sys_modules and (_dynamo_compiling() or _compiler._is_compiling_flag):
            return None
        st: ThreadState | None = getattr(self._local, "st", None)
        if st is None or not st.stack:
            return None
        popped = st.stack.pop()
        frame = popped if popped.module is mod else self._unwind(st, popped, mod)
        return None if frame is None else (st, frame)

    def _unwind(self, st: ThreadState, frame: Call, mod: nn.Module) -> Call | None:
        """``frame`` (just popped) is not ``mod``'s: a forward was interrupted by
        something no hook saw (KeyboardInterrupt caught by the program).  Close
        what was left open above ``mod``'s call and return that call; None
        (and the stack as it was) when ``mod`` has no open call here."""
        stack = st.stack
        if not any(f.module is mod for f in stack):
            stack.append(frame)
            return None
        while frame.module is not mod:
            self._exit_forward(st, frame, STATUS_ERROR)
            frame = stack.pop()
        return frame

    def _exit_forward(self, st: ThreadState, frame: Call, status: int) -> None:
        if frame.phase == _SILENT:
            return
        seq = next(self._seq)
        stream = self._stream(frame.device_id, seq) if self._cuda_devices else None
        self._append((seq, self._clock() - self.t0, KIND_EXIT, frame.module_id, frame.phase, frame.call_id,
                      self.step, st.tid, frame.device_id, stream, status, frame.task, 0))

    def close_open_forward(self, status: int = STATUS_ERROR) -> int:
        """Close this thread's forward calls left open (an exception no hook saw)."""
        st = getattr(self._local, "st", None)
        if st is None:
            return 0
        n = 0
        while st.stack:
            self._exit_forward(st, st.stack.pop(), status)
            n += 1
        return n
