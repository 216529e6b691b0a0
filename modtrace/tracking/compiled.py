"""Time per module inside code that ``torch.compile`` compiled with inductor.

Module hooks do not run inside compiled code, so a compiled module is one
opaque call to them.  Inductor, though, knows which FX nodes each kernel it
generates runs (its provenance tracking), and each FX node knows the module
calls it was traced from (``nn_module_stack``; backward nodes carry their
forward node's).  While a recorder runs this module:

- at compile time, keeps for each compiled graph the kernel call sites of its
  Python wrapper (``Runner.call``, straight-line code: the k-th call of a
  kernel at run time is its k-th call site) and, for each site, the chain of
  modules its nodes came from (a kernel fused across modules goes to their
  lowest common ancestor) and the phase (forward; backward; a forward node
  that the backward graph recomputes: recompute);
- wraps the wrapper's kernels (the module's globals: ``cpp_fused_*``,
  ``extern_kernels.*``, ``torch.ops.*``) with a clock read either side: the
  hot path appends one tuple per kernel call;
- when a graph call returns, turns its kernels into enter and exit rows of
  the inner modules, status ``attributed``, nested inside the compiled
  module's open call (its forward, or its backward on the graph task).  Time
  between kernels stays with the enclosing module: the compiled module's
  self time holds what no kernel accounts for.

What it reads of inductor is private and changes between releases, so it is
pinned to the torch versions it was tested on (``SUPPORTED``); on another,
one line says so and compiled modules are recorded as a whole, as before.
Kernels that run on a device (Triton's and the extern ones on CUDA) run
after the host launches them: there each kernel launch gets a timing event
either side on the current stream (``DeviceTimer.take``), handed to the
device timer with the rows they time once the graph call returns
(``queue_recorded``), so the attributed calls get device times like hooked
ones.  Graphs on a device whose time is not recorded, and CUDA graphs
(replayed without the wrapper), stay whole.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.abc
import importlib.util
import logging
import re
import sys
import threading
import weakref
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

import torch

from modtrace.core.codes import (
    KIND_ENTER,
    KIND_EXIT,
    PHASE_BACKWARD,
    PHASE_FORWARD,
    PHASE_RECOMPUTE,
)

if TYPE_CHECKING:
    from modtrace.tracking.device_timer import DeviceTimer

# torch releases whose inductor internals (CompiledFxGraph's constructor,
# source_code, inductor_provenance_mapping_str, the provenance comments of the
# Python wrapper, partitioner_tag on backward graph nodes) this was tested on.
SUPPORTED = ((2, 13),)
SUPPORTED_TEXT = "2.13"

# What the detail swallows (it never fails the program's compile or step) is
# logged here at debug level, with its traceback.
log = logging.getLogger("modtrace.compiled")

_SITE = re.compile(r"#\s*\[Provenance debug handles\]\s*(\S+):(\d+)\s*$")
# One step of a dynamo source path: .name, ['name'], [3]
_STEP = re.compile(r"\.(\w+)|\[\s*'([^']*)'\s*\]|\[\s*\"([^\"]*)\"\s*\]|\[\s*(\d+)\s*\]")

# The form of the call sites kept on a compiled graph (and in inductor's on-disk
# cache, which outlives the process): a cached graph whose sites were read by
# other code than this module's is compiled again (once), so a fix here never
# meets sites an older version read wrongly.
SITES_FORMAT = "5:" + hashlib.sha1(Path(__file__).read_bytes()).hexdigest()[:16]

_active = threading.local()  # .buf: the kernel times of the graph call running on this thread
# Compiled graphs whose call sites were read, while they live: a recorder
# started later wraps their kernels again (a second recording in one process).
# (Weak references in a list: a compiled graph is a dataclass, so unhashable.)
_GRAPHS: list[weakref.ref[Any]] = []


# Installed once inductor's compile entry is imported: it imports the cache and the
# compiled graph's class (whose own imports are circular, so not those), and nothing
# compiles before it.
_OUTPUT_CODE = "torch._inductor.compile_fx"
_INSTALLED: CompiledDetail | None = None  # the detail whose patches are in place


class _AfterImport(importlib.abc.MetaPathFinder):
    """Calls ``then()`` once module ``name`` has been imported (and removes itself)."""

    def __init__(self, name: str, then: Callable[[], object]) -> None:
        self.name = name
        self.then = then

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        loader, then = spec.loader, self.then
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            then()

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def unsupported_message(version: str) -> str:
    return (f"compiled detail needs torch {SUPPORTED_TEXT} (this is torch {version}); "
            "recording the compiled modules as a whole")


def torch_supported(version: str | None = None) -> bool:
    """Whether this torch's inductor is one the compiled-module detail was tested on."""
    text = version or torch.__version__
    m = re.match(r"(\d+)\.(\d+)", text)
    return m is not None and (int(m.group(1)), int(m.group(2))) in SUPPORTED


def relative_path(source: str) -> str | None:
    """A dynamo module path (``L['self'].blocks[0]._modules['mlp']``) -> the
    dotted path below the compiled frame's ``self`` (``blocks.0.mlp``); ``''``
    for the frame's module itself; None when it is not below a local."""
    m = re.match(r"\s*L\[\s*['\"][^'\"]+['\"]\s*\]", source)
    if m is None:
        return None
    rest = source[m.end():]
    parts: list[str] = []
    pos = 0
    while pos < len(rest):
        step = _STEP.match(rest, pos)
        if step is None:
            return None
        part = next(g for g in step.groups() if g is not None)
        pos = step.end()
        if part in ("_modules", "_orig_mod"):
            continue
        parts.append(part)
    return ".".join(parts)


def _chain(meta: dict[str, Any]) -> tuple[str, ...] | None:
    """The module calls an FX node was traced in, outermost first, as paths
    below the compiled frame's module (which is left out)."""
    stack = meta.get("nn_module_stack") or meta.get("fwd_nn_module_stack")
    if not stack:
        return None
    chain: list[str] = []
    for value in stack.values():
        source = value[0] if isinstance(value, tuple) else value
        path = relative_path(str(source))
        if path is None:
            return None
        if path and path not in chain:
            chain.append(path)
    return tuple(chain)


def _common(chains: list[tuple[str, ...]]) -> tuple[str, ...]:
    first = chains[0]
    n = len(first)
    for other in chains[1:]:
        n = min(n, len(other))
        for i in range(n):
            if other[i] != first[i]:
                n = i
                break
    return first[:n]


class GraphSites(NamedTuple):
    """A compiled graph's kernel call sites: ``by_callee[name]`` lists, in
    call order, each site's (module chain, phase).  Plain builtins only: it is
    pickled with the compiled graph into inductor's cache, which a process
    without modtrace may read."""

    backward: bool
    by_callee: dict[str, list[tuple[tuple[str, ...], int]]]
    inference: bool = False  # a forward graph with no backward (compiled under no_grad)
    device_type: str = "cpu"  # where its kernels run ("cpu", "cuda")
    launched: tuple[str, ...] = ()  # kernels called as ``name.run(...)`` (Triton's launchers)


def graph_sites(source: str, kernel_nodes: dict[str, list[str]], gm: Any, backward: bool,
                inference: bool = False, device_type: str = "cpu") -> GraphSites | None:
    """Read a compiled graph's call sites from its wrapper source, inductor's
    kernel call site -> post-grad nodes map (``name:handle`` keys, as the
    wrapper's provenance comments give them) and the post-grad graph's node
    metadata."""
    if not source or not kernel_nodes:
        return None
    nodes: dict[str, tuple[tuple[str, ...] | None, str | None]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function":
            nodes[node.name] = (_chain(node.meta), node.meta.get("partitioner_tag"))
    by_callee: dict[str, list[tuple[tuple[str, ...], int]]] = {}
    in_call = False
    for line in source.splitlines():
        stripped = line.strip()
        if stripped.startswith("def call("):
            in_call = True
            continue
        if not in_call:
            continue
        m = _SITE.search(stripped)
        if m is None:
            continue
        name, handle = m.group(1), m.group(2)
        chains: list[tuple[str, ...]] = []
        phase = PHASE_FORWARD
        any_backward = False
        for node_name in kernel_nodes.get(f"{name}:{handle}", ()):
            chain, tag = nodes.get(node_name, (None, None))
            if chain is None:
                continue
            chains.append(chain)
            if backward and tag != "is_forward":
                any_backward = True
        if backward:
            phase = PHASE_BACKWARD if any_backward or not chains else PHASE_RECOMPUTE
        by_callee.setdefault(name, []).append((_common(chains) if chains else (), phase))
    if not by_callee:
        return None
    launched = tuple(name for name in by_callee if re.search(rf"\b{re.escape(name)}\.run\(", source))
    return GraphSites(backward, by_callee, inference, device_type, launched)


class _Proxy:
    """A stand-in for a namespace (``extern_kernels``, ``torch``, ``torch.ops``...)
    whose listed attributes are replaced; every other attribute is the real one."""

    def __init__(self, target: Any, children: dict[str, Any]) -> None:
        self.__dict__["_target"] = target
        self.__dict__.update(children)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_target"], name)


def _timed(fn: Callable[..., Any], name: str, clock: Callable[[], int]) -> Callable[..., Any]:
    def run(*args: Any, **kwargs: Any) -> Any:
        try:
            buf = _active.buf
        except AttributeError:
            return fn(*args, **kwargs)
        # Which kernel runs: work counters charge its ops to it (``counting_key``).
        _active.kernel = len(buf)
        dev = _active.dev
        if dev is None:  # kernels that run as the host calls them: the host clock times them
            t = clock()
            try:
                out = fn(*args, **kwargs)
            finally:
                _active.kernel = None
            buf.append((name, t, clock()))
            return out
        # Kernels launched on a device: a timing event either side, on the stream
        # they are launched to (DeviceTimer.take), resolved later like the hooks' events.
        take, index, stream, handle = dev
        t = clock()
        e0 = take(index, stream, handle)
        try:
            out = fn(*args, **kwargs)
        finally:
            _active.kernel = None
        e1 = take(index, stream, handle)
        buf.append((name, t, clock(), e0, e1))
        return out

    run.__wrapped__ = fn  # type: ignore[attr-defined]
    return run


# Work counters (modtrace.tracking.counters) inside a compiled graph: an op
# dispatched by a wrapped kernel (inductor's extern kernels: matrix products,
# attention) is kept under (kernel index, KERNEL_PHASE, task) until the graph
# returns, then moved to the call the kernel was attributed to.
KERNEL_PHASE = -2


def counting_key(mode: Any, task: int) -> tuple[int, int, int] | None:
    """The counters' key for an op dispatched now, if a wrapped kernel runs it."""
    kernel = getattr(_active, "kernel", None)
    if kernel is None:
        return None
    modes = _active.__dict__.setdefault("modes", set())
    modes.add(mode)
    return kernel, KERNEL_PHASE, task


class Attributed(NamedTuple):
    """What ``DetailTracker.append_attributed`` wrote: the call ids given (in the order of
    the enter rows), the synthetic compiled call's (call id, phase, task) key, the
    seq of each row (in row order) and the synthetic call's (enter, exit) seqs."""

    call_ids: list[int]
    root_call: tuple[int, int, int] | None
    seqs: list[int]
    root_seqs: tuple[int, int] | None


class DetailTracker(Protocol):
    """What ``CompiledDetail`` needs of the tracker it serves (``tracker.Tracker`` is one, by
    its shape): asked once per compiled graph call, never per kernel."""

    compiled_note: str | None  # why compiled modules are recorded whole, shown once one runs

    @property
    def emitting(self) -> bool:
        """Whether module calls are being recorded now."""

    @property
    def timed_device_type(self) -> str:
        """The torch device type whose calls get device time."""

    @property
    def device_timer(self) -> DeviceTimer | None:
        """The device timer the kernels' timing events go to, once a timed device was seen."""

    def device_of(self, dev: torch.device) -> tuple[int, bool]:
        """(the run's id of device ``dev``, whether its calls are timed on the device now)."""

    def fqn(self, module_id: int) -> str:
        """A module id's name."""

    def module_id_of(self, fqn: str) -> int | None:
        """A module's id by its name, if one was named so."""

    def compiled_root(self, backward: bool, roots: list[tuple[int, bool]] | None
                      ) -> tuple[int, bool, int | None] | None:
        """The module whose compiled graph just ran on this thread: (module id, synthetic,
        graph task); None when there is none to attribute to."""

    def append_attributed(self, root_id: int, rows: list[tuple[int, int, int, int]], t0: int, t1: int,
                          synthetic: bool, task: int | None, device_id: int | None = None,
                          stream: int | None = None) -> Attributed:
        """Append the rows of a compiled graph's inner module calls (and, when ``synthetic``,
        the compiled module's own call around them)."""


class CompiledDetail:
    """Installs the compile-time capture and run-time kernel timing for one tracker."""

    def __init__(self, tracker: DetailTracker, clock: Callable[[], int]) -> None:
        self._tracker = tracker
        self._clock = clock
        self._saved: list[tuple[Any, str, Any]] = []  # (object, attribute, original value)
        self._globals: dict[int, tuple[dict[str, Any], dict[str, Any]]] = {}  # id -> (module dict, originals)
        # The (root module id, synthetic) of the forward graph calls whose backward
        # has not run yet, latest last: backward runs them in reverse.  (One list, not
        # one per graph id: a graph loaded from inductor's cache keeps the ids of the
        # process that compiled it, where forward and backward graphs may have had others.)
        self._roots: list[tuple[int, bool]] = []
        self._ids: dict[str, int | None] = {}
        self._waiting: _AfterImport | None = None

    # -- install / uninstall -------------------------------------------------

    def install(self, version: str | None = None) -> str | None:
        """Patch inductor, now if it is imported, else when it is (importing it
        takes seconds, which a program that compiles nothing should not pay);
        None when done or waiting, else the one line that says why not (the
        tracker shows it once a compiled module runs)."""
        version = version or torch.__version__
        if not torch_supported(version):
            return unsupported_message(version)
        if _OUTPUT_CODE not in sys.modules:
            self._waiting = _AfterImport(_OUTPUT_CODE, self._install_later)
            sys.meta_path.insert(0, self._waiting)
            return None
        return self._install_now()

    def _install_later(self) -> None:
        self._waiting = None
        note = self._install_now()
        if note is not None:
            self._tracker.compiled_note = note

    def _install_now(self) -> str | None:
        global _INSTALLED
        if _INSTALLED is not None and _INSTALLED is not self:
            # One detail at a time: a recorder left unstopped (a crash) keeps none of its patches under ours.
            _INSTALLED.uninstall()
        try:
            import torch._inductor.config as inductor_config
            from torch._inductor.codecache import FxGraphCache
            from torch._inductor.output_code import CompiledFxGraph
        except Exception as exc:  # inductor unusable here: nothing compiled through it can run either
            return f"compiled detail is off (inductor could not be imported: {type(exc).__name__}); recording the compiled modules as a whole"
        detail = self
        init, post_compile, call = CompiledFxGraph.__init__, CompiledFxGraph.post_compile, CompiledFxGraph.__call__
        lookup = FxGraphCache._lookup_graph

        def patched_init(cg: Any, current_callable: Any, graph: Any, gm: Any, *args: Any, **kwargs: Any) -> None:
            init(cg, current_callable, graph, gm, *args, **kwargs)
            detail._capture(cg, gm, kwargs.get("fx_kwargs") if "fx_kwargs" in kwargs else _positional_fx_kwargs(args))

        def patched_post_compile(cg: Any, *args: Any, **kwargs: Any) -> Any:
            out = post_compile(cg, *args, **kwargs)
            detail._instrument_safely(cg)
            return out

        def patched_call(cg: Any, inputs: Any) -> Any:
            sites = cg.__dict__.get("_modtrace_live")
            if sites is None or not detail._tracker.emitting:  # not recording, or a schedule's off step
                return call(cg, inputs)
            where = detail._where(sites, inputs)
            if where is None:  # kernels launched to a device whose time is not recorded
                return call(cg, inputs)
            prev = getattr(_active, "buf", None)
            prev_dev = getattr(_active, "dev", None)
            buf: list[tuple[Any, ...]] = []
            _active.buf = buf
            _active.dev = where[1]
            t0 = detail._clock()
            try:
                return call(cg, inputs)
            finally:
                t1 = detail._clock()
                if prev is None:
                    del _active.buf
                else:
                    _active.buf = prev
                _active.dev = prev_dev
                detail._emit(sites, buf, t0, t1, where)

        def patched_lookup(*args: Any, **kwargs: Any) -> Any:
            graph, info = lookup(*args, **kwargs)
            if graph is not None and (graph.__dict__.get("_modtrace_sites") or (None,))[0] != SITES_FORMAT:
                # Compiled without the call sites (before modtrace recorded): compile
                # again, once; the entry saved then carries them.
                return None, info
            return graph, info

        from torch._inductor import debug as inductor_debug

        inductor_debug._inductor_triton_kernel_to_post_grad_node_info.clear()
        self._save(inductor_config.trace, "provenance_tracking_level", 1)
        self._save(FxGraphCache, "_lookup_graph", staticmethod(patched_lookup))
        self._save(CompiledFxGraph, "__init__", patched_init)
        self._save(CompiledFxGraph, "post_compile", patched_post_compile)
        self._save(CompiledFxGraph, "__call__", patched_call)
        _INSTALLED = self
        _GRAPHS[:] = [ref for ref in _GRAPHS if ref() is not None]
        for ref in list(_GRAPHS):
            cg = ref()
            if cg is not None:
                self._instrument_safely(cg)
        return None

    def _save(self, obj: Any, attr: str, value: Any) -> None:
        own = vars(obj) if isinstance(obj, type) else {}
        self._saved.append((obj, attr, own[attr] if attr in own else getattr(obj, attr)))
        setattr(obj, attr, value)

    def uninstall(self) -> None:
        global _INSTALLED
        if self._waiting is not None:
            with contextlib.suppress(ValueError):
                sys.meta_path.remove(self._waiting)
            self._waiting = None
        if _INSTALLED is self:
            _INSTALLED = None
        for obj, attr, value in reversed(self._saved):
            setattr(obj, attr, value)
        self._saved.clear()
        for module_dict, originals in self._globals.values():
            module_dict.update(originals)
        self._globals.clear()

    # -- compile time -----------------------------------------------------------

    def _capture(self, cg: Any, gm: Any, fx_kwargs: Any) -> None:
        fx_kwargs = fx_kwargs or {}
        try:
            from torch._inductor import debug as inductor_debug

            # The map is inductor's global, filled as this graph's kernels were
            # generated.  Its entries are extended, never replaced, and a key
            # (kernel name:handle) may come again in a later graph: emptied after
            # each graph read (and at install), it holds this graph's entries only.
            kernel_nodes = inductor_debug._inductor_triton_kernel_to_post_grad_node_info
            types = set(getattr(cg, "device_types", ())) - {"meta"}
            try:
                sites = graph_sites(getattr(cg, "source_code", ""), kernel_nodes,
                                    gm, bool(fx_kwargs.get("is_backward")),
                                    bool(fx_kwargs.get("is_inference")),
                                    next(iter(types)) if len(types) == 1 else "mixed")
            finally:
                kernel_nodes.clear()
        except Exception:  # provenance is a debugging aid of inductor's: never fail a compile over it
            log.debug("could not read a compiled graph's kernel call sites", exc_info=True)
            sites = None
        if sites is not None and sites.device_type != "mixed":
            # Kept on the compiled graph (as a plain tuple), so a graph loaded
            # from inductor's cache brings them along.
            cg._modtrace_sites = (SITES_FORMAT, tuple(sites))
        else:
            cg._modtrace_sites = (SITES_FORMAT, None)

    def _instrument_safely(self, cg: Any) -> None:
        try:
            self._instrument(cg)
        except Exception:  # never fail the program's compile over the detail: the graph stays whole
            log.debug("could not time a compiled graph's kernels", exc_info=True)
            cg.__dict__["_modtrace_live"] = None

    def _instrument(self, cg: Any) -> None:
        stored = cg.__dict__.get("_modtrace_sites")
        fn = getattr(cg, "current_callable", None)
        if not stored or stored[0] != SITES_FORMAT or stored[1] is None or fn is None:
            return
        sites = GraphSites(*stored[1])
        cg._modtrace_live = sites
        if not any(ref() is cg for ref in _GRAPHS):
            _GRAPHS.append(weakref.ref(cg))
        module_dict = getattr(getattr(fn, "__func__", fn), "__globals__", None)
        if module_dict is None:
            cg._modtrace_live = None
            return
        if id(module_dict) in self._globals:
            return
        originals: dict[str, Any] = {}
        tree: dict[str, Any] = {}
        for name in sites.by_callee:
            parts = name.split(".")
            if parts[0] not in module_dict:
                continue
            if name in sites.launched:  # a Triton kernel: its launcher's run() is what the wrapper calls
                parts = [*parts, "run"]
            node = tree
            for part in parts[:-1]:
                node = node.setdefault(part, {})
            node[parts[-1]] = name

        def build(target: Any, children: dict[str, Any]) -> Any:
            replaced = {}
            for attr, child in children.items():
                value = getattr(target, attr, None)
                if value is None:
                    continue
                replaced[attr] = (_timed(value, child, self._clock) if isinstance(child, str)
                                  else build(value, child))
            return _Proxy(target, replaced)

        for head, child in tree.items():
            original = module_dict[head]
            originals[head] = original
            module_dict[head] = _timed(original, child, self._clock) if isinstance(child, str) else build(original, child)
        self._globals[id(module_dict)] = (module_dict, originals)

    # -- run time ----------------------------------------------------------------

    def _where(self, sites: GraphSites, inputs: Any) -> tuple[int | None, Any] | None:
        """How a graph call's kernels are timed: (device id of its rows, None) on the
        host clock (CPU kernels run as they are called); (device id, (take, index,
        stream, handle)) by timing events on the device's current stream (the
        tracker's device timer: CUDA, or the clock injected in its place); None: not
        at all (kernels on a device with no device time: their launch is not their
        run, so the compiled call stays whole)."""
        tracker = self._tracker
        timed_type = tracker.timed_device_type
        if sites.device_type != timed_type:
            return (None, None) if sites.device_type == "cpu" else None
        dev = next((t.device for t in inputs if isinstance(t, torch.Tensor) and t.device.type == timed_type), None)
        if dev is None:
            return None
        device_id, timed = tracker.device_of(dev)
        timer = tracker.device_timer
        if not timed or timer is None:
            return (None, None) if sites.device_type == "cpu" else None
        index = dev.index or 0
        stream, handle = timer.clock.current_stream(index)
        return device_id, (timer.take, index, stream, handle)

    def _emit(self, sites: GraphSites, buf: list[tuple[Any, ...]], t0: int, t1: int,
              where: tuple[int | None, Any]) -> None:
        try:
            if buf and self._tracker.emitting:
                self._emit_rows(sites, buf, t0, t1, where)
        except Exception:  # a detail that cannot be placed is dropped; the compiled call stays whole
            log.debug("could not place a compiled graph call's kernels", exc_info=True)
        finally:
            modes = _active.__dict__.pop("modes", None)
            if modes:  # counted kernels not attributed: the compiled module's
                self._recount(modes, {}, [], None)

    def _emit_rows(self, sites: GraphSites, buf: list[tuple[Any, ...]], t0: int, t1: int,
                   where: tuple[int | None, Any]) -> None:
        tracker = self._tracker
        device_id, dev = where
        if dev is not None and any(item[3] is None or item[4] is None for item in buf):
            dev = None  # a kernel the device could not time (a CUDA graph being captured): no detail
            device_id = None
            buf = []
        seen: dict[str, int] = {}
        kernels: list[tuple[int, tuple[str, ...], int, int, int]] = []  # (index in buf, chain, phase, start, end)
        for index, item in enumerate(buf):
            name = item[0]
            k = seen.get(name, 0)
            seen[name] = k + 1
            listed = sites.by_callee.get(name)
            if listed is None or k >= len(listed):
                continue
            chain, phase = listed[k]
            if chain:
                kernels.append((index, chain, phase, item[1], item[2]))
        modes = _active.__dict__.pop("modes", None)
        # Every training forward graph call is paired, kernels attributed or not.
        root = tracker.compiled_root(sites.backward, None if sites.inference else self._roots)
        if root is None or not kernels:
            self._recount(modes, {}, [], None)
            self._queue_events(dev, buf, [], [], None)
            return
        root_id, synthetic, task = root
        root_fqn = tracker.fqn(root_id)
        rows: list[tuple[int, int, int, int]] = []  # (ts, kind, module_id, phase)
        row_events: list[tuple[int, int]] = []  # per row: (kernel index in buf, 0 its start / 1 its end)
        open_: list[tuple[int, int, int]] = []  # (module_id, phase, index of its enter among the enters)
        enters = 0
        span_of: dict[int, tuple[int, int]] = {}  # kernel index -> (enter index of its innermost call, phase)
        last, last_index = t0, -1
        for index, chain, phase, a, b in kernels:
            ids = [i for i in (self._module_id(root_fqn, path) for path in chain) if i is not None]
            keep = 0
            while keep < len(open_) and keep < len(ids) and open_[keep][:2] == (ids[keep], phase):
                keep += 1
            while len(open_) > keep:
                mid, ph, _ = open_.pop()
                rows.append((last, KIND_EXIT, mid, ph))
                row_events.append((last_index, 1))
            for mid in ids[keep:]:
                open_.append((mid, phase, enters))
                enters += 1
                rows.append((a, KIND_ENTER, mid, phase))
                row_events.append((index, 0))
            if open_:
                span_of[index] = (open_[-1][2], phase)
            last, last_index = b, index
        while open_:
            mid, ph, _ = open_.pop()
            rows.append((last, KIND_EXIT, mid, ph))
            row_events.append((last_index, 1))
        stream = dev[3] if dev is not None else None
        written = tracker.append_attributed(root_id, rows, t0, t1, synthetic, task, device_id, stream)
        self._recount(modes, span_of, written.call_ids, written.root_call)
        self._queue_events(dev, buf, row_events, written.seqs, written.root_seqs)

    def _queue_events(self, dev: Any, buf: list[tuple[Any, ...]], row_events: list[tuple[int, int]], seqs: list[int],
                      root_seqs: tuple[int, int] | None) -> None:
        """Hand a device-timed graph call's kernel events to the device timer, each
        with the seqs of the rows it times (an enter: its first kernel's start; an
        exit: its last kernel's end; a synthetic compiled call: the first start and
        the last end), every event in the order it was recorded."""
        timer = self._tracker.device_timer
        if dev is None or not buf or timer is None:
            return
        rows_at: dict[tuple[int, int], list[int]] = {}
        for where, seq in zip(row_events, seqs, strict=True):
            rows_at.setdefault(where, []).append(seq)
        if root_seqs is not None:
            rows_at.setdefault((0, 0), []).insert(0, root_seqs[0])
            rows_at.setdefault((len(buf) - 1, 1), []).append(root_seqs[1])
        entries = []
        for i, item in enumerate(buf):
            entries.append((tuple(rows_at.get((i, 0), ())), item[3]))
            entries.append((tuple(rows_at.get((i, 1), ())), item[4]))
        timer.queue_recorded(dev[1], dev[3], entries)

    def _recount(self, modes: set[Any] | None, span_of: dict[int, tuple[int, int]], call_ids: list[int],
                 root_call: tuple[int, int, int] | None) -> None:
        """Move the counters kept per kernel to the calls the kernels were attributed to
        (a kernel attributed to none: the compiled module's call)."""
        for mode in modes or ():
            for key in [k for k in mode.counts if k[1] == KERNEL_PHASE]:
                acc = mode.counts.pop(key)
                kernel, _, task = key
                span = span_of.get(kernel)
                if span is not None:
                    target = (call_ids[span[0]], span[1], -1 if span[1] == PHASE_FORWARD else task)
                else:
                    target = root_call if root_call is not None else mode.default_key()
                into = mode.counts.setdefault(target, [0, 0, 0, 0])
                for i in range(4):
                    into[i] += acc[i]

    def _module_id(self, root_fqn: str, path: str) -> int | None:
        fqn = f"{root_fqn}.{path}"
        if fqn in self._ids:
            return self._ids[fqn]
        module_id = self._tracker.module_id_of(fqn)
        self._ids[fqn] = module_id
        return module_id


def _positional_fx_kwargs(args: tuple[Any, ...]) -> Any:
    # CompiledFxGraph(current_callable, graph, gm, output_strides, disabled_cudagraphs_reason,
    # metrics_deltas, counter_deltas, cudagraphs, example_inputs, static_input_idxs,
    # compile_region_name, fx_kwargs, ...): fx_kwargs is the 9th after gm.
    return args[8] if len(args) > 8 and isinstance(args[8], dict) else None


def frame_module(depth: int = 2, limit: int = 40) -> torch.nn.Module | None:
    """The module whose compiled code is running: the nearest caller frame of a
    module's ``forward``/``_call_impl`` (or a dynamo resume function) whose
    ``self`` is a module."""
    frame: FrameType | None = sys._getframe(depth)
    n = 0
    while frame is not None and n < limit:
        code = frame.f_code.co_name
        if code in ("forward", "_call_impl", "_wrapped_call_impl") or code.startswith("torch_dynamo_resume_in_"):
            mod = frame.f_locals.get("self")
            if isinstance(mod, torch.nn.Module) and type(mod).__name__ != "OptimizedModule":
                return mod
        frame = frame.f_back
        n += 1
    return None
