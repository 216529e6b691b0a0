"""The hooks that see module calls, and the event tuples they append.

``Tracker`` installs global forward hooks (every ``nn.Module`` call in the
process), a global optimizer step hook, and autograd node pre-hooks for the
backward pass.  Each hook builds one tuple in ``modtrace.core.contracts.EVENT_ROW``
order (a test checks the tuples against it) and hands it to ``append`` -- a ``list.append`` for the
recorder, a small state machine for ``ModuleTracker``.  Nothing here formats
strings, touches a database or builds a hierarchy; that happens later.

How each phase is seen:

* forward (here): a global pre-hook opens the call, a global post-hook
  registered with ``always_call=True`` closes it (status ``error`` when the
  forward raised, ``early_stop`` when checkpoint recomputation stopped
  itself).
* backward (``modtrace.tracking.backward``, ``calls.NodeHook``): the
  post-hook hangs the call on the autograd nodes of its inputs and outputs;
  one pre-hook per node writes the backward enter and exit rows.
* recompute (``modtrace.tracking.recompute``): forward hooks firing inside a
  backward graph task while activation checkpointing recomputes, linked to
  the original forward call's id; other module calls made during backward
  (a custom autograd Function's backward calling a module) are phase
  ``backward_call``, calls of their own.

The hooks run for every module call of the program, so they are written for
it: attributes read once into locals, no per-call helper where an inline line
does, and as few objects per call as the bookkeeping allows (a ``Call``, which
is also the hook of its output node, and the event tuples): every other
object made per call and kept until the backward is work for Python's
garbage collector, whose young-generation passes (and the full passes that
objects living until the backward bring on) cost a program more than the
hooks themselves.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.modules.module as _module_hooks
from torch import nn
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.hooks import RemovableHandle
from torch.utils.weak import WeakIdKeyDictionary

from modtrace.core.codes import (
    KIND_ENTER,
    KIND_EXIT,
    PHASE_BACKWARD,
    PHASE_BACKWARD_CALL,
    PHASE_FORWARD,
    PHASE_RECOMPUTE,
    STATUS_ATTRIBUTED,
    STATUS_OK,
    STATUS_UNLINKED,
)
from modtrace.tracking.backward import BackwardHooks, _leaf_node
from modtrace.tracking.calls import (
    _DYNAMO,
    _SILENT,
    Call,
    ForwardUnwind,
    ThreadState,
    _compiler,
    _dynamo_compiling,
    _sys_modules,
    joined,
)
from modtrace.tracking.compiled import Attributed, CompiledDetail, frame_module
from modtrace.tracking.devices import DeviceLookup
from modtrace.tracking.module_names import ModuleInfo, ModuleNames, as_list, grad_tensors
from modtrace.tracking.recompute import RecomputeLinks, recomputing
from modtrace.tracking.step_kind import input_kind

if TYPE_CHECKING:
    from modtrace.tracking.device_timer import DeviceClock

Event = tuple[Any, ...]
Append = Callable[[Event], Any]

_graph_task_id = torch._C._current_graph_task_id
_grad_enabled = torch.is_grad_enabled
_Tensor = torch.Tensor
_RAISED = object()  # marks the post-hook call torch makes when a forward raised
_new_call = object.__new__


class Tracker(BackwardHooks, RecomputeLinks, ForwardUnwind, DeviceLookup):
    """Global hooks turning module calls into event tuples.

    ``append`` receives every event; ``clock`` returns nanoseconds (injected
    in tests).  ``new_modules``, ``new_threads`` and ``new_devices`` collect
    lookup rows not yet handed to the store, ``new_roots`` the root calls
    (outermost on their thread, unless ``roots`` is false); the owner
    drains them.
    """

    def __init__(self, append: Append, clock: Callable[[], int] | None = None, on_optimizer_step: Callable[[], None] | None = None,
                 roots: bool = True, device_time: bool | None = None, device_clock: DeviceClock | None = None,
                 compiled_detail: bool = False) -> None:
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
        self._handles: list[RemovableHandle | None] = []
        # keyed by tensor identity (tensors compare elementwise, so not a WeakKeyDictionary)
        self._leaf_handles: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._local = threading.local()
        self._lock = threading.Lock()
        self._thread_count = 0
        self._names = ModuleNames(self._lock)
        self._known = self._names.by_id.get  # id(module) -> its info, if named
        self.fqns = self._names.fqns
        self.new_modules = self._names.new_modules
        self._wrappers = self._names.wrappers  # ids of torch.compile wrappers (empty unless compile is used)
        # Forward calls that a checkpoint may recompute: every module's
        # ``recent`` entries in call order, and the root calls still alive
        # (open, or kept by their autograd graph) that keep them.
        self._recent_order: deque[ModuleInfo] = deque()
        self._live_roots: weakref.WeakSet[Call] = weakref.WeakSet()
        self._pruned_step = 0
        self._failures = 0  # forwards that raised (their inner calls' backward is cancelled)
        # backward: graph task -> open calls (a stack, innermost last)
        self._bw: dict[int, list[Call]] = {}
        self._recomputed: dict[int, set[int]] = {}
        self.new_threads: list[tuple[int, int, str]] = []
        self.new_devices: list[tuple[int, str]] = []
        # root calls (outermost on their thread: a serving pool's worker threads make them
        # too): (enter seq, call id, kind)
        self.new_roots: list[tuple[int, int, str | None]] = []
        self.roots = 0
        self._note_roots = roots
        # Called with (seq, kind) at each root call noted, before its enter row: the
        # counters' step starts (modtrace.tracking.counters.Counting.on_root).
        self.on_root: Callable[[int, str | None], None] | None = None
        # Optimizers seen stepping (their state is a counted region's baseline memory, modtrace.tracking.memory).
        self.optimizers: weakref.WeakSet[Any] = weakref.WeakSet()
        self._init_devices(device_time, device_clock)
        # Time per module inside torch.compile'd code (modtrace.tracking.compiled), when asked.
        self._compiled_detail = compiled_detail
        self._detail: CompiledDetail | None = None
        # Why compiled modules are recorded whole (a torch the detail was not tested on), shown once one runs.
        self.compiled_note: str | None = None

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
            optimizers = self.optimizers

            def stepped(opt: Any, args: Any, kwargs: Any) -> None:
                optimizers.add(opt)
                callback()

            self._handles.append(register_optimizer_step_post_hook(stepped))
        if self._compiled_detail:
            detail = CompiledDetail(self, self._clock)
            self.compiled_note = detail.install()
            if self.compiled_note is None:
                self._detail = detail

    def stop(self) -> None:
        """Remove every hook; node hooks still attached to live graphs become inert."""
        self._active = False
        if self._detail is not None:
            self._detail.uninstall()
            self._detail = None
        for handle in self._handles:
            if handle is None:  # paused
                continue
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

    def now(self) -> int:
        """Nanoseconds since ``start`` on the events' clock (their ``ts_ns``)."""
        return self._clock() - self.t0

    @property
    def emitting(self) -> bool:
        """Whether module calls are being recorded now (started, not paused by a schedule)."""
        return self._active and bool(self._handles) and self._handles[0] is not None

    # -- compiled code's inner modules: what compiled.DetailTracker names -------

    def module_id_of(self, fqn: str) -> int | None:
        """A module's id by its name, if one was named so."""
        return self._names.id_of(fqn)

    def compiled_root(self, backward: bool, roots: list[tuple[int, bool]] | None
                      ) -> tuple[int, bool, int | None] | None:
        """The module whose compiled graph just ran on this thread: (module id,
        synthetic, graph task).  Synthetic: no hook saw the call (the module was
        compiled in place, ``module.compile()``), so the caller writes it too.
        A forward graph's module is pushed on ``roots`` (None: an inference graph,
        with no backward); a backward graph's is the latest one pushed whose
        backward has not run (one graph may serve several modules, e.g. each
        block compiled in place, and backward runs them in reverse)."""
        try:
            st: ThreadState = self._local.st
        except AttributeError:
            st = self._thread()
        if not backward:
            mod = frame_module(2)
            top = st.stack[-1] if st.stack else None
            if mod is None:
                if top is None:
                    return None
                found = (top.module_id, False)
            else:
                info = self._known(id(mod)) or self._info(mod, st)
                found = (info.module_id, top is None or top.module_id != info.module_id)
            if roots is None:  # an inference graph: no backward to pair with
                return (*found, None)
            # (grad mode is off here, inside the compiled autograd function's forward)
            roots.append(found)
            if len(roots) > 256:  # forwards whose backward never ran (inference)
                del roots[:128]
            return (*found, None)
        task = _graph_task_id()
        open_calls = self._bw.get(task) or []
        known = roots.pop() if roots else None
        if known is None:
            if not open_calls:
                return None
            return open_calls[-1].module_id, False, task
        module_id = known[0]
        return module_id, not any(c.module_id == module_id for c in open_calls), task

    def append_attributed(self, root_id: int, rows: list[tuple[int, int, int, int]], t0: int, t1: int,
                          synthetic: bool, task: int | None, device_id: int | None = None,
                          stream: int | None = None) -> Attributed:
        """Append the rows of a compiled graph's inner module calls ((time, kind,
        module id, phase), nested, in time order; status attributed), and, when
        ``synthetic``, the compiled module's own call around them (t0 to t1).
        ``device_id``/``stream``: the device and stream the graph's kernels ran on,
        when they are timed there (their events are queued by the caller)."""
        st: ThreadState = self._local.st
        tid, step, base = st.tid, self.step, self.t0
        task_col = task
        phase = PHASE_FORWARD if task is None else PHASE_BACKWARD
        root_call = enter_seq = 0
        if synthetic:
            root_call = next(self._call_ids)
            seq = next(self._seq)
            if task is None and not st.stack and self._note_roots:
                self.new_roots.append((seq, root_call, None))
                with self._lock:
                    self.roots += 1
            self._names.mark_compiled(root_id)
            self._append((seq, t0 - base, KIND_ENTER, root_id, phase, root_call, step, tid, device_id, stream, STATUS_OK,
                          task_col, 0))
            enter_seq = seq
        open_ids: list[int] = []
        given: list[int] = []
        seqs: list[int] = []
        for ts, kind, module_id, ph in rows:
            if kind == KIND_ENTER:
                call_id = next(self._call_ids)
                open_ids.append(call_id)
                given.append(call_id)
            else:
                call_id = open_ids.pop()
            seq = next(self._seq)
            seqs.append(seq)
            self._append((seq, ts - base, kind, module_id, ph, call_id, step, tid, device_id, stream,
                          STATUS_ATTRIBUTED, None if ph == PHASE_FORWARD else task_col, 0))
        if synthetic:
            seq = next(self._seq)
            self._append((seq, t1 - base, KIND_EXIT, root_id, phase, root_call, step, tid, device_id, stream, STATUS_OK,
                          task_col, 0))
            return Attributed(given, (root_call, phase, -1 if task is None else task), seqs, (enter_seq, seq))
        return Attributed(given, None, seqs, None)

    def device_of(self, dev: torch.device) -> tuple[int, bool]:
        """(the run's id of device ``dev``, whether its calls are timed on the device now)."""
        device_id = self._device(dev)
        return device_id, (device_id in self._cuda_devices and self.device_timer is not None and self.device_marks)

    # -- a recording schedule's off steps (modtrace.recording.schedule) -------

    def pause(self) -> None:
        """Remove the global module hooks, keeping the optimizer step hook
        (steps still advance): module calls cost nothing until ``resume()``.
        Call between steps, when no forward call is open."""
        if self._active and len(self._handles) >= 2 and self._handles[0] is not None:
            for handle in self._handles[:2]:
                if handle is not None:
                    handle.remove()
                    _module_hooks._global_forward_hooks_with_kwargs.pop(handle.id, None)
            self._handles[:2] = [None, None]

    def resume(self) -> None:
        """Install the module hooks again after ``pause()``."""
        if self._active and len(self._handles) >= 2 and self._handles[0] is None:
            self._handles[:2] = [
                register_module_forward_pre_hook(self._forward_pre),
                register_module_forward_hook(self._forward_post, with_kwargs=True, always_call=True),
            ]

    @property
    def next_seq(self) -> int:
        """The seq the next event gets (``rewind`` takes it back)."""
        seq = next(self._seq)
        self._seq = itertools.count(seq)
        return seq

    def rewind(self, seq: int) -> None:
        """Number the next event ``seq`` again: the events since were thrown away (a warm-up step)."""
        self._seq = itertools.count(seq)

    def innermost_call(self, task: int) -> tuple[int, int]:
        """(call id, phase) of the innermost module call open on this thread in graph task
        ``task`` (-1: outside any backward), as the work counters charge an op to it;
        call id 0 when none is open."""
        st = getattr(self._local, "st", None)
        if st is not None and st.stack:
            top = st.stack[-1]
            if top.phase == _SILENT:  # a compile wrapper's module run eagerly: the wrapper's call
                top = top.parent
            if top is not None and (task == -1 or top.task == task):
                return top.call_id, top.phase
        if task != -1:
            open_calls = self._bw.get(task)
            return (open_calls[-1].call_id if open_calls else 0), PHASE_BACKWARD
        return 0, PHASE_FORWARD

    def live_modules(self) -> list[nn.Module]:
        """The modules named so far that are still alive."""
        return self._names.live_modules()

    def set_memory(self, log: Any) -> None:
        """Note the counted region's memory log open on this thread (None: none), whose
        forward calls' returned storages the forward exit hands it."""
        try:
            st: ThreadState = self._local.st
        except AttributeError:
            st = self._thread()
        st.memory = log

    def _open_forward_calls(self) -> int:
        """Forward calls open on this thread."""
        st = getattr(self._local, "st", None)
        return len(st.stack) if st is not None else 0

    def fqn(self, module_id: int) -> str:
        return self.fqns[module_id]

    # -- naming ----------------------------------------------------------------

    def _thread(self) -> ThreadState:
        with self._lock:
            tid = self._thread_count
            self._thread_count += 1
        st = ThreadState(tid)
        self._local.st = st
        cur = threading.current_thread()
        self.new_threads.append((tid, threading.get_ident(), cur.name))
        return st

    def _info(self, mod: nn.Module, st: ThreadState) -> ModuleInfo:
        return self._names.info(mod, (frame.module for frame in reversed(st.stack)))

    # -- forward ---------------------------------------------------------------

    def _forward_pre(self, mod: nn.Module, args: tuple[Any, ...]) -> None:
        if _DYNAMO in _sys_modules and (_dynamo_compiling() or _compiler._is_compiling_flag):
            return
        try:
            st: ThreadState = self._local.st
        except AttributeError:
            st = self._thread()
        info = self._known(id(mod)) or self._info(mod, st)
        task = _graph_task_id()
        dev = None
        grad_inputs: Any = None  # one tensor (no list for the usual single input), or a list
        for a in args:
            if isinstance(a, _Tensor):
                if dev is None:
                    dev = a.device
                if a.requires_grad:
                    if grad_inputs is None:
                        grad_inputs = a
                    elif type(grad_inputs) is list:
                        grad_inputs.append(a)
                    else:
                        grad_inputs = [grad_inputs, a]
        if dev is None:
            dev = self._module_device(mod)
        if dev is not None:
            device_id = self._devices.get(dev)
            if device_id is None:
                device_id = self._device(dev)
        else:
            device_id = None
        stack = st.stack
        root = False
        parent = stack[-1] if stack else None
        if parent is not None and parent.module_id == info.module_id and getattr(parent.module, "_orig_mod", None) is mod:
            # torch.compile's wrapper running its module eagerly (compilation
            # disabled, or a graph break): the wrapper's call is this call.
            parent.ran_eager = True
            stack.append(Call(mod, info, parent, parent.call_id, parent.device_id, _SILENT, None if task == -1 else task))
            return
        tid = st.tid
        status = STATUS_OK
        exit_nodes = grad_inputs if grad_inputs is not None and _grad_enabled() else None
        if task == -1:
            phase = PHASE_FORWARD
            call_id = next(self._call_ids)
            if parent is None:
                if self.step != self._pruned_step:
                    self._prune_recent()
                info.recent_parents.append(0)
                frame = Call(mod, info, None, call_id, device_id, phase, None, exit_nodes)
                self._live_roots.add(frame)
                root = self._note_roots
            else:
                info.recent_parents.append(parent.call_id)
                # Call(mod, info, parent, call_id, device_id, phase, None, exit_nodes) without the
                # __init__ call, for the usual call (a test checks it is the same record)
                frame = _new_call(Call)
                frame.module, frame.module_id, frame.depth = mod, info.module_id, info.depth
                frame.parent, frame.call_id, frame.device_id = parent, call_id, device_id
                frame.phase, frame.task, frame.exit_nodes = phase, None, exit_nodes
                frame.bw_task, frame.failed = -1, False
            info.recent.append(call_id)
            self._recent_order.append(info)
            task_col = None
        else:
            # A module call inside a backward graph task: checkpoint recomputing a
            # forward, or backward code calling a module.  A call inside another
            # one of the same task is what that one is; the outermost asks its frames.
            if parent is not None and parent.task == task and (parent.phase == PHASE_RECOMPUTE or parent.phase == PHASE_BACKWARD_CALL):
                phase = parent.phase
            else:
                phase = PHASE_RECOMPUTE if recomputing(sys._getframe(1)) else PHASE_BACKWARD_CALL
            if phase == PHASE_RECOMPUTE:
                call_id = self._link_recompute(info, stack, task)
                if call_id < 0:  # no forward call to link to: a call id of its own, and the row says so
                    call_id, status = -call_id, STATUS_UNLINKED
            else:
                call_id = next(self._call_ids)
            frame = Call(mod, info, parent, call_id, device_id, phase, task, exit_nodes)
            task_col = task
        stack.append(frame)
        seq = next(self._seq)
        if root:
            self._root(seq, call_id, mod, args)
        self._append((seq, self._clock() - self.t0, KIND_ENTER, info.module_id, phase, call_id, self.step, tid,
                      device_id, self._stream(device_id, seq) if self._cuda_devices else None, status, task_col, 0))

    def _root(self, seq: int, call_id: int, mod: nn.Module, args: tuple[Any, ...]) -> None:
        """Note a root call (outermost on its thread) and its input shape.
        Only root calls come here, before their enter event's timestamp is
        taken, so this costs no module time."""
        # A global pre-hook is not given the call's keyword arguments; its
        # caller (Module._call_impl, or the closure it runs) holds them.
        caller = sys._getframe(2)
        kwargs = caller.f_locals.get("kwargs") if caller.f_globals.get("__name__") == _module_hooks.__name__ else None
        kind = input_kind(mod, args, kwargs)
        self.new_roots.append((seq, call_id, kind))
        with self._lock:  # threads may note root calls at once; only root calls take the lock
            self.roots += 1
        if self.on_root is not None:  # counters (modtrace.tracking.counters) start or end here
            self.on_root(seq, kind)

    def _forward_post(self, mod: nn.Module, args: tuple[Any, ...], kwargs: Any, output: Any = _RAISED) -> None:
        # torch calls this with (module, args, kwargs, output) after a forward
        # returns, and with (module, args, output) when the forward raised.
        if output is _RAISED:
            self._forward_failed(mod)
            return
        if _DYNAMO in _sys_modules and (_dynamo_compiling() or _compiler._is_compiling_flag):
            return
        try:
            st: ThreadState = self._local.st
        except AttributeError:
            return
        stack = st.stack
        if not stack:
            return
        popped = stack.pop()
        frame = popped if popped.module is mod else self._unwind(st, popped, mod)
        if frame is None:
            return
        frame.module = None
        if frame.phase == _SILENT:
            return
        device_id = frame.device_id
        seq = next(self._seq)
        self._append((seq, self._clock() - self.t0, KIND_EXIT, frame.module_id, frame.phase, frame.call_id,
                      self.step, st.tid, device_id, self._stream(device_id, seq) if self._cuda_devices else None, STATUS_OK,
                      frame.task, 0))
        if st.memory is not None and frame.phase == PHASE_FORWARD:  # a counted region's (modtrace.tracking.memory)
            st.memory.returned(frame.call_id, output)
        if self._wrappers and id(mod) in self._wrappers and not hasattr(frame, "ran_eager"):
            # torch.compile's wrapper ran its module compiled: no hook saw the calls inside
            self._names.mark_compiled(frame.module_id)
            if self.compiled_note is not None:
                print(f"modtrace: {self.compiled_note}", file=sys.stderr)
                self.compiled_note = None
        exit_nodes = frame.exit_nodes
        frame.exit_nodes = None
        if not _grad_enabled():
            return
        # Backward bookkeeping: the node producing each output gets an enter
        # entry, the node producing each input needing grad an exit entry.
        key = self._meta_key
        if kwargs:
            extra = grad_tensors(kwargs)
            if extra:
                exit_nodes = as_list(exit_nodes) + extra
        if exit_nodes is not None:
            if type(exit_nodes) is not list:
                t = exit_nodes
                node = t.grad_fn
                leaf = node is None
                if leaf:
                    node = _leaf_node(t)
                if node is not None:
                    hook = node.metadata.get(key)
                    if hook is None:
                        hook = self._new_hook(node, t, leaf)
                    exits = hook.exits
                    hook.exits = frame if exits is None else joined(exits, frame)
                    frame.n_exit = 1
            else:
                self._exit_entries(frame, exit_nodes)
        if isinstance(output, _Tensor):
            node = output.grad_fn
            if node is not None:
                meta: dict[str, Any] = node.metadata  # type: ignore[assignment]
                hook = meta.get(key)
                if hook is None:
                    # The call is the hook of its output node: no object of the node's own.
                    frame.tracker = self
                    frame.exits = frame.enters = None
                    meta[key] = frame
                    node.register_prehook(frame)
                else:
                    enters = hook.enters
                    hook.enters = frame if enters is None else joined(enters, frame)
        else:
            outs = grad_tensors(output)
            if outs is not None:
                seen_out: set[int] = set()
                for t in outs:
                    node = t.grad_fn
                    if node is None or id(node) in seen_out:
                        continue
                    seen_out.add(id(node))
                    hook = self._hook(node, t)
                    hook.enters = joined(hook.enters, frame)

