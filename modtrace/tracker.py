"""The hooks that see module calls, and the event tuples they append.

``Tracker`` installs global forward hooks (every ``nn.Module`` call in the
process), a global optimizer step hook, and autograd node pre-hooks for the
backward pass.  Each hook builds one tuple in ``modtrace.contracts.EVENT_ROW``
order (a test checks the tuples against it) and hands it to ``append`` -- a ``list.append`` for the
recorder, a small state machine for ``ModuleTracker``.  Nothing here formats
strings, touches a database or builds a hierarchy; that happens later.

How each phase is seen:

* forward: a global pre-hook opens the call, a global post-hook registered
  with ``always_call=True`` closes it (status ``error`` when the forward
  raised, ``early_stop`` when checkpoint recomputation stopped itself).
* backward: for every call that built autograd graph, the node producing
  each output gets an *enter* entry and the node producing each input gets
  an *exit* entry.  One pre-hook per node dispatches all entries of that node
  at once, exits first (innermost first), then enters (outermost first), so
  the ties that torch's per-module hooks produce (a parent and its child
  sharing a tensor) come out already nested.  Backward nesting follows the
  call tree recorded in forward: a call's parent is the call that was open
  on its thread when it started, whoever owns the module (a registered
  child, a module borrowed from a list, one built inside the forward).  A
  backward span still open when the backward of a call that is not its
  descendant starts has finished (the engine runs one node at a time per
  device) and is closed then; spans no hook ever closes (inputs that need no
  grad) are closed, innermost first, when the graph task ends, with status
  ``closed_at_end_of_backward``.  Rows of one dispatch are marked as ties
  only while the analysis' tie order (exits first, then enters by module
  depth) is the order they were written in, so the analysis never moves an
  exit before its own enter.
* recompute: forward hooks firing inside a backward graph task are
  activation-checkpoint recomputation.  Their call id is the original
  forward call's: the outermost recomputed call takes the module's latest
  forward call not yet recomputed in this graph task, nested calls take the
  next unused call of that module made under the linked parent.  Forward
  calls are kept for this while a root call made with or before them is
  alive (its autograd graph or its open forward keeps it) and until the next
  step; a recompute with no call to link to gets a call id of its own.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
import torch.nn.modules.module as _module_hooks
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle
from torch.utils.weak import WeakIdKeyDictionary

from modtrace.codes import Kind, Phase, Status
from modtrace.input_kind import input_kind
from modtrace.module_names import ModuleInfo, ModuleNames, iter_tensors

Event = tuple[Any, ...]
Append = Callable[[Event], Any]

_ENTER = int(Kind.ENTER)
_EXIT = int(Kind.EXIT)
_FORWARD = int(Phase.FORWARD)
_BACKWARD = int(Phase.BACKWARD)
_RECOMPUTE = int(Phase.RECOMPUTE)
_SILENT = -1  # phase of a frame that records nothing (the module of a compile wrapper, run eagerly)
_OK = int(Status.OK)
_ERROR = int(Status.ERROR)
_EARLY_STOP = int(Status.EARLY_STOP)
_CLOSED_AT_END = int(Status.CLOSED_AT_END_OF_BACKWARD)

_graph_task_id = torch._C._current_graph_task_id
_grad_enabled = torch.is_grad_enabled
_Tensor = torch.Tensor
_RAISED = object()  # marks the post-hook call torch makes when a forward raised


# While dynamo traces a module our hooks must do nothing.  It cannot be
# tracing before torch._dynamo is imported, which spares the call in eager code.
_DYNAMO = "torch._dynamo"
_sys_modules = sys.modules
_compiling = torch.compiler.is_compiling


class _Call:
    """One module call: open on its thread's stack during the forward (or
    recompute), then, when it built autograd graph, the backward bookkeeping
    that node hooks refer to."""

    __slots__ = ("module", "module_id", "depth", "parent", "call_id", "device_id", "phase", "task", "tid",
                 "exit_nodes", "bw_task", "exits_seen", "n_exit", "closed", "failed", "__weakref__")

    def __init__(self, module: nn.Module, info: ModuleInfo, parent: _Call | None, call_id: int,
                 device_id: int | None, phase: int, task: int, tid: int) -> None:
        self.module: nn.Module | None = module  # dropped once the forward returns
        self.module_id = info.module_id
        self.depth = info.depth
        self.parent = parent  # the call open on this thread when this one started

        self.call_id = call_id
        self.device_id = device_id
        self.phase = phase
        self.task = task  # graph task of a recompute, -1 in forward
        self.tid = tid
        self.exit_nodes: list[Any] | None = None  # inputs needing grad, until the forward returns
        self.bw_task = -1  # graph task in which the backward was entered
        self.exits_seen = 0
        self.n_exit = 0  # input nodes whose gradient must be ready before the exit
        self.closed = True
        self.failed = False  # the forward raised: the backward of calls inside it never runs

    def descends_from(self, other: _Call) -> bool:
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


class _ThreadState:
    __slots__ = ("tid", "stack", "main")

    def __init__(self, tid: int) -> None:
        self.tid = tid
        self.stack: list[_Call] = []
        self.main = threading.current_thread() is threading.main_thread()


class Tracker:
    """Global hooks turning module calls into event tuples.

    ``append`` receives every event; ``clock`` returns nanoseconds (injected
    in tests).  ``new_modules``, ``new_threads`` and ``new_devices`` collect
    lookup rows not yet handed to the store, ``new_roots`` the root calls
    (outermost on the main thread, unless ``roots`` is false); the owner
    drains them.
    """

    def __init__(self, append: Append, clock: Callable[[], int] | None = None, on_optimizer_step: Callable[[], None] | None = None,
                 roots: bool = True) -> None:
        self._append = append
        self._clock = clock or time.perf_counter_ns
        self._on_optimizer_step = on_optimizer_step
        self.t0 = 0
        self.step = 0
        self._seq = itertools.count()
        self._call_ids = itertools.count(1)
        self._active = False
        # Each tracker keeps its own entries on a node: two recording at once
        # (a Recorder and a ModuleTracker) must not dispatch each other's calls.
        self._meta_key = f"modtrace-{id(self):x}"
        self._handles: list[RemovableHandle] = []
        # keyed by tensor identity (tensors compare elementwise, so not a WeakKeyDictionary)
        self._leaf_handles: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._thread_count = 0
        self._names = ModuleNames(self._lock)
        self.fqns = self._names.fqns
        self.new_modules = self._names.new_modules
        # Forward calls that a checkpoint may recompute: every module's
        # ``recent`` entries in call order, and the root calls still alive
        # (open, or kept by their autograd graph) that keep them.
        self._recent_order: deque[ModuleInfo] = deque()
        self._live_roots: weakref.WeakSet[_Call] = weakref.WeakSet()
        self._pruned_step = 0
        self._failures = 0  # forwards that raised (their inner calls' backward is cancelled)
        self._devices: dict[torch.device, int] = {}
        self._cuda_devices: set[int] = set()
        self._device_objs: list[torch.device] = []
        # backward: graph task -> open calls (a stack, innermost last)
        self._bw: dict[int, list[_Call]] = {}
        self._recomputed: dict[int, set[int]] = {}
        self.new_threads: list[tuple[int, int, str]] = []
        self.new_devices: list[tuple[int, str]] = []
        # root calls (outermost on the main thread): (enter seq, call id, kind)
        self.new_roots: list[tuple[int, int, str | None]] = []
        self.roots = 0
        self._note_roots = roots

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> None:
        if self._active:
            raise RuntimeError("tracker already started")
        self.t0 = self._clock()
        self._active = True
        self._handles = [
            register_module_forward_pre_hook(self._forward_pre),
            register_module_forward_hook(self._forward_post, with_kwargs=True, always_call=True),
        ]
        if self._on_optimizer_step is not None:
            callback = self._on_optimizer_step
            self._handles.append(register_optimizer_step_post_hook(lambda opt, args, kwargs: callback()))

    def stop(self) -> None:
        """Remove every hook; node hooks still attached to live graphs become inert."""
        self._active = False
        for handle in self._handles:
            handle.remove()
            # torch's handle for a with_kwargs global hook leaves its id in
            # this registry; take it out so nothing of ours outlives stop().
            _module_hooks._global_forward_hooks_with_kwargs.pop(handle.id, None)
        self._handles = []
        for handle in list(self._leaf_handles.values()):  # type: ignore[no-untyped-call]
            handle.remove()
        self._leaf_handles.clear()
        self._bw.clear()
        self._recomputed.clear()

    @property
    def active(self) -> bool:
        return self._active

    def _open_forward_calls(self) -> int:
        """Forward calls open on this thread."""
        st = getattr(self._local, "st", None)
        return len(st.stack) if st is not None else 0

    def fqn(self, module_id: int) -> str:
        return self.fqns[module_id]

    # -- naming ----------------------------------------------------------------

    def _thread(self) -> _ThreadState:
        with self._lock:
            tid = self._thread_count
            self._thread_count += 1
        st = _ThreadState(tid)
        self._local.st = st
        cur = threading.current_thread()
        self.new_threads.append((tid, threading.get_ident(), cur.name))
        return st

    def _info(self, mod: nn.Module, st: _ThreadState) -> ModuleInfo:
        return self._names.info(mod, (frame.module for frame in reversed(st.stack)))

    def _device(self, dev: torch.device) -> int:
        device_id = self._devices.get(dev)
        if device_id is None:
            with self._lock:
                device_id = self._devices.get(dev)
                if device_id is None:
                    device_id = len(self._devices)
                    self._devices[dev] = device_id
                    self._device_objs.append(dev)
                    if dev.type == "cuda":
                        self._cuda_devices.add(device_id)
                    self.new_devices.append((device_id, str(dev)))
        return device_id

    def _stream(self, device_id: int | None) -> int | None:
        """The current stream on a CUDA device (None elsewhere): a handle that
        tells streams apart within the run."""
        if device_id is None or device_id not in self._cuda_devices:
            return None
        return int(torch.cuda.current_stream(self._device_objs[device_id]).cuda_stream)

    def _module_device(self, mod: nn.Module) -> torch.device | None:
        for t in itertools.chain(mod.parameters(), mod.buffers()):
            return t.device
        return None

    # -- forward ---------------------------------------------------------------

    def _forward_pre(self, mod: nn.Module, args: tuple[Any, ...]) -> None:
        if _DYNAMO in _sys_modules and _compiling():
            return
        try:
            st: _ThreadState = self._local.st
        except AttributeError:
            st = self._thread()
        info = self._names.get(mod) or self._info(mod, st)
        task = _graph_task_id()
        dev = None
        grad_inputs = None
        for a in args:
            if isinstance(a, _Tensor):
                if dev is None:
                    dev = a.device
                if a.requires_grad:
                    if grad_inputs is None:
                        grad_inputs = [a]
                    else:
                        grad_inputs.append(a)
        if dev is None:
            dev = self._module_device(mod)
        device_id = self._devices.get(dev) if dev is not None else None
        if device_id is None and dev is not None:
            device_id = self._device(dev)
        stack = st.stack
        root = False
        parent = stack[-1] if stack else None
        if parent is not None and parent.module_id == info.module_id and getattr(parent.module, "_orig_mod", None) is mod:
            # torch.compile's wrapper running its module eagerly (compilation
            # disabled, or a graph break): the wrapper's call is this call.
            stack.append(_Call(mod, info, parent, parent.call_id, parent.device_id, _SILENT, task, st.tid))
            return
        if task == -1:
            phase = _FORWARD
            if parent is None and self.step != self._pruned_step:
                self._prune_recent()
            call_id = next(self._call_ids)
            info.recent.append((call_id, parent.call_id if parent is not None else 0))
            self._recent_order.append(info)
            if parent is None:
                root = st.main and self._note_roots
        else:
            phase = _RECOMPUTE
            call_id = self._link_recompute(info, stack, task)
        module_id = info.module_id
        frame = _Call(mod, info, parent, call_id, device_id, phase, task, st.tid)
        if parent is None and task == -1:
            self._live_roots.add(frame)
        if grad_inputs is not None and _grad_enabled():
            frame.exit_nodes = grad_inputs
        stack.append(frame)
        seq = next(self._seq)
        if root:
            self._root(seq, call_id, mod, args)
        self._append((seq, self._clock() - self.t0, _ENTER, module_id, phase, call_id, self.step, st.tid,
                      device_id, self._stream(device_id) if self._cuda_devices else None, _OK,
                      None if task == -1 else task, 0))

    def _root(self, seq: int, call_id: int, mod: nn.Module, args: tuple[Any, ...]) -> None:
        """Note a root call (outermost on the main thread) and its input shape.
        Only root calls come here, before their enter event's timestamp is
        taken, so this costs no module time."""
        # A global pre-hook is not given the call's keyword arguments; its
        # caller (Module._call_impl, or the closure it runs) holds them.
        caller = sys._getframe(2)
        kwargs = caller.f_locals.get("kwargs") if caller.f_globals.get("__name__") == _module_hooks.__name__ else None
        self.new_roots.append((seq, call_id, input_kind(mod, args, kwargs)))
        self.roots += 1

    def _link_recompute(self, info: ModuleInfo, stack: list[_Call], task: int) -> int:
        used = self._recomputed.get(task)
        if used is None:
            used = self._recomputed[task] = set()
        recent = info.recent
        parent = stack[-1] if stack and stack[-1].phase == _RECOMPUTE else None
        chosen = 0
        if parent is not None:
            for call_id, parent_id in recent:
                if parent_id == parent.call_id and call_id not in used:
                    chosen = call_id
                    break
        if not chosen:
            for call_id, _ in reversed(recent):
                if call_id not in used:
                    chosen = call_id
                    break
        if not chosen:
            return next(self._call_ids)
        used.add(chosen)
        return chosen

    def _forward_post(self, mod: nn.Module, args: tuple[Any, ...], kwargs: Any, output: Any = _RAISED) -> None:
        # torch calls this with (module, args, kwargs, output) after a forward
        # returns, and with (module, args, output) when the forward raised.
        if output is _RAISED:
            self._forward_failed(mod)
            return
        found = self._pop_call(mod)
        if found is None:
            return
        st, frame = found
        frame.module = None
        if frame.phase == _SILENT:
            return
        device_id = frame.device_id
        task = frame.task
        self._append((next(self._seq), self._clock() - self.t0, _EXIT, frame.module_id, frame.phase, frame.call_id,
                      self.step, st.tid, device_id, self._stream(device_id) if self._cuda_devices else None, _OK,
                      None if task == -1 else task, 0))
        exit_nodes = frame.exit_nodes
        frame.exit_nodes = None
        if not _grad_enabled():
            return
        # Backward bookkeeping: the node producing each output gets an enter
        # entry, the node producing each input needing grad an exit entry.
        key = self._meta_key
        if kwargs:
            extra = _grad_tensors(kwargs)
            if extra:
                exit_nodes = (exit_nodes or []) + extra
        if exit_nodes is not None:
            if len(exit_nodes) == 1:
                t = exit_nodes[0]
                node = t.grad_fn
                if node is None:
                    node = _leaf_node(t)
                if node is not None:
                    entries = node.metadata.get(key)
                    if entries is None:
                        entries = self._new_entries(node, t)
                    entries[0].append(frame)
                    frame.n_exit = 1
            else:
                self._exit_entries(frame, exit_nodes)
        if isinstance(output, _Tensor):
            node = output.grad_fn
            if node is not None:
                entries = node.metadata.get(key)  # type: ignore[attr-defined]
                if entries is None:
                    entries = self._new_entries(node, output)
                entries[1].append(frame)
        else:
            outs = _grad_tensors(output)
            if outs is not None:
                seen_out: set[int] = set()
                for t in outs:
                    node = t.grad_fn
                    if node is None or id(node) in seen_out:
                        continue
                    seen_out.add(id(node))
                    self._entries(node, t)[1].append(frame)

    def _exit_entries(self, frame: _Call, exit_nodes: list[torch.Tensor]) -> None:
        seen: set[int] = set()
        for t in exit_nodes:
            node = t.grad_fn
            if node is None:
                node = _leaf_node(t)
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            self._entries(node, t)[0].append(frame)
        frame.n_exit = len(seen)

    def _forward_failed(self, mod: nn.Module) -> None:
        """The post-hook of a forward that raised: close the call with status
        error (early_stop for checkpoint recomputation stopping itself)."""
        found = self._pop_call(mod)
        if found is None:
            return
        st, frame = found
        exc_type = sys.exc_info()[0]
        early = frame.phase == _RECOMPUTE and exc_type is not None and exc_type.__name__ == "_StopRecomputationError"
        status = _EARLY_STOP if early else _ERROR
        if status == _ERROR and frame.phase in (_FORWARD, _SILENT):
            # The backward hooks of calls made inside the failed one must never fire.
            frame.failed = True
            self._failures += 1
        self._exit_forward(st, frame, status)
        frame.module = None
        frame.exit_nodes = None

    def _pop_call(self, mod: nn.Module) -> tuple[_ThreadState, _Call] | None:
        """``mod``'s open call, taken off this thread's stack; None when it has
        none here (or while dynamo traces)."""
        if _DYNAMO in _sys_modules and _compiling():
            return None
        st: _ThreadState | None = getattr(self._local, "st", None)
        if st is None or not st.stack:
            return None
        popped = st.stack.pop()
        frame = popped if popped.module is mod else self._unwind(st, popped, mod)
        return None if frame is None else (st, frame)

    def _unwind(self, st: _ThreadState, frame: _Call, mod: nn.Module) -> _Call | None:
        """``frame`` (just popped) is not ``mod``'s: a forward was interrupted by
        something no hook saw (KeyboardInterrupt caught by the program).  Close
        what was left open above ``mod``'s call and return that call; None
        (and the stack as it was) when ``mod`` has no open call here."""
        stack = st.stack
        if not any(f.module is mod for f in stack):
            stack.append(frame)
            return None
        while frame.module is not mod:
            self._exit_forward(st, frame, _ERROR)
            frame = stack.pop()
        return frame

    def _exit_forward(self, st: _ThreadState, frame: _Call, status: int) -> None:
        if frame.phase == _SILENT:
            return
        stream = self._stream(frame.device_id) if self._cuda_devices else None
        self._append((next(self._seq), self._clock() - self.t0, _EXIT, frame.module_id, frame.phase, frame.call_id,
                      self.step, st.tid, frame.device_id, stream, status, None if frame.task == -1 else frame.task, 0))

    def _entries(self, node: Any, t: torch.Tensor) -> tuple[list[_Call], list[_Call]]:
        entries: tuple[list[_Call], list[_Call]] | None = node.metadata.get(self._meta_key)
        if entries is None:
            entries = self._new_entries(node, t)
        return entries

    def _new_entries(self, node: Any, t: torch.Tensor) -> tuple[list[_Call], list[_Call]]:
        entries: tuple[list[_Call], list[_Call]] = ([], [])
        node.metadata[self._meta_key] = entries
        leaf = t.grad_fn is None
        handle = node.register_prehook(partial(self._dispatch, entries, leaf))
        if leaf:
            old = self._leaf_handles.get(t)  # type: ignore[no-untyped-call]
            if old is not None:
                old.remove()
            self._leaf_handles[t] = handle
        return entries

    # -- backward --------------------------------------------------------------
    #
    # ``group`` below is the tie state of one dispatch: None before its first
    # row, -1 while the rows since the last tie=0 row are all exits, else the
    # module depth of the last enter.  A row is tied to the previous one only
    # when the analysis' tie order (exits first, then enters by module depth)
    # keeps it where it was written.

    def _dispatch(self, entries: tuple[list[_Call], list[_Call]], leaf: bool, grad_outputs: Any) -> None:
        # Runs for every hooked node in every backward: the events are
        # appended inline, with no per-event method call.
        if not self._active:
            return None
        exits, enters = entries
        if leaf:
            # AccumulateGrad nodes outlive the graph: take their entries once.
            exits, enters = list(exits), list(enters)
            entries[0].clear()
            entries[1].clear()
        task = _graph_task_id()
        open_calls = self._bw.get(task)
        if open_calls is None:
            open_calls = self._bw[task] = []
            torch.autograd.Variable._execution_engine.queue_callback(partial(self._end_of_task, task))
        try:
            tid = self._local.st.tid
        except AttributeError:
            tid = self._thread().tid
        append, seq, clock, t0, step = self._append, self._seq, self._clock, self.t0, self.step
        cuda = self._cuda_devices
        failures = self._failures
        group: int | None = None
        for call in exits:
            if failures and call.cancelled():
                continue
            if call.bw_task != task:
                if call in enters:  # output is its input (an identity): enter, then exit
                    group = self._bw_enter(call, task, open_calls, tid, group)
                else:
                    continue  # its outputs never got a gradient: it had no backward
            if call.closed:
                continue
            call.exits_seen += 1
            if call.exits_seen < call.n_exit:
                continue
            call.closed = True
            while open_calls:
                top = open_calls.pop()
                top.closed = True  # a descendant nothing closed is done too, innermost first
                append((next(seq), clock() - t0, _EXIT, top.module_id, _BACKWARD, top.call_id, step, tid,
                        top.device_id, self._stream(top.device_id) if cuda else None, _OK, task,
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
                    group = self._bw_enter(call, task, open_calls, tid, group)
                    continue
            call.bw_task = task
            call.exits_seen = 0
            call.closed = False
            open_calls.append(call)
            depth = call.depth
            append((next(seq), clock() - t0, _ENTER, call.module_id, _BACKWARD, call.call_id, step, tid,
                    call.device_id, self._stream(call.device_id) if cuda else None, _OK, task,
                    1 if group is not None and depth >= group else 0))
            group = depth
        return None

    def _bw_enter(self, call: _Call, task: int, open_calls: list[_Call], tid: int, group: int | None) -> int:
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

    def _bw_event(self, call: _Call, kind: int, status: int, task: int, tid: int, group: int | None) -> int:
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

    def _prune_recent(self) -> None:
        """Forget forward calls no checkpoint can recompute any more: those made
        before every root call still alive (a root call lives while it is open
        or its autograd graph is)."""
        self._pruned_step = self.step
        floor = min((call.call_id for call in list(self._live_roots)), default=None)
        order = self._recent_order
        while order:
            recent = order[0].recent
            if floor is not None and recent[0][0] >= floor:
                break
            recent.popleft()
            order.popleft()

    def close_open_forward(self, status: int = _ERROR) -> int:
        """Close this thread's forward calls left open (an exception no hook saw)."""
        st = getattr(self._local, "st", None)
        if st is None:
            return 0
        n = 0
        while st.stack:
            self._exit_forward(st, st.stack.pop(), status)
            n += 1
        return n


def _leaf_node(t: torch.Tensor) -> Any:
    """The AccumulateGrad node of a leaf tensor needing grad, else None."""
    if t.requires_grad:
        view_node = t.view_as(t).grad_fn
        return view_node.next_functions[0][0] if view_node is not None else None
    return None


def _grad_tensors(obj: Any) -> list[torch.Tensor] | None:
    """Tensors needing grad in a (possibly nested) output or kwargs structure."""
    if isinstance(obj, _Tensor):
        return [obj] if obj.requires_grad else None
    found = [t for t in iter_tensors(obj, _Tensor) if t.requires_grad]
    return found or None
