"""Work counters: FLOPs, bytes and aten ops per module call and phase, on chosen steps.

Counting dispatches every aten op through Python, so it runs only on the
steps chosen (``Recorder(counters=...)``): a ``TorchDispatchMode`` is pushed
when a counted step's first root call starts (``Tracker.on_root``, which only
root calls reach) and popped at the step's end.  The module hooks do no more
work on any step.

Each op is charged to the innermost module call open where it runs, as the
tracker's own bookkeeping says: the top of the thread's call stack (forward,
or recompute and ``backward_call`` inside the current graph task), else the
backward span open in the current graph task (``Tracker.innermost_call``).  The mode
sums per (call id, phase, graph task); attribution to spans, inclusive and
self, is done offline (``modtrace.analysis.counters``).

FLOPs are torch's formulas (``torch.utils.flop_counter``'s registry, plus a
few matrix-vector products it lacks).  An op with no formula that is not
known to do no such work (views, pointwise and reduction ops, copies,
normalisation, softmax, losses, indexing, factories) counts as *unknown*:
the FLOPs of a call with unknown ops are a lower bound.  Bytes are the sizes
of an op's tensor inputs and outputs (views move none).

Code compiled by ``torch.compile`` runs compiled on a counted step too (the
mode says it ignores compile internals, so dynamo neither falls back to eager
nor traces the mode): the ops its compiled code dispatches at run time (the
graph's aten ops under the eager backend, inductor's extern kernels such as
matrix products) are counted; with the compiled-module detail
(``modtrace.tracking.compiled``) an extern kernel's ops go to the inner module
the kernel is attributed to, else to the compiled module.  Work fused into
generated C++ kernels dispatches no op and is not seen: a compiled module's
FLOPs are its matrix products' and attention's, its bytes those of its extern
kernels.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from modtrace.tracking.compiled import counting_key
from modtrace.tracking.memory import MemoryLog, start_tensors

if TYPE_CHECKING:
    from modtrace.tracking.tracker import Tracker

COUNTER_POLICIES = ("first", "every-step", "off")

_graph_task_id = torch._C._current_graph_task_id
_aten = torch.ops.aten
_Tensor = torch.Tensor

# Metadata queries: no work, not ops of the program's (FlopCounterMode skips them too).
_SKIP = {
    _aten.sym_is_contiguous.default, _aten.is_contiguous.default, _aten.is_contiguous.memory_format,
    _aten.is_strides_like_format.default, _aten.is_non_overlapping_and_dense.default, _aten.size.default,
    _aten.sym_size.default, _aten.stride.default, _aten.sym_stride.default, _aten.storage_offset.default,
    _aten.sym_storage_offset.default, _aten.numel.default, _aten.sym_numel.default, _aten.dim.default,
    torch.ops.prim.layout.default, torch.ops.prim.device.default,
}

# Ops (overload packets, by name) with no matrix-product work beyond what their
# tags say: 0 FLOPs is their count, not an unknown.
_NO_FLOP_NAMES = frozenset("""
    _to_copy clone copy_ detach lift_fresh alias empty empty_like empty_strided new_empty new_empty_strided
    zeros zeros_like ones ones_like full full_like fill_ zero_ scalar_tensor arange rand rand_like randn
    randn_like randint bernoulli_ uniform_ normal_ native_dropout native_dropout_backward
    native_layer_norm native_layer_norm_backward native_batch_norm native_batch_norm_backward
    _native_batch_norm_legit _native_batch_norm_legit_no_training _native_batch_norm_legit_functional
    native_group_norm native_group_norm_backward _fused_rms_norm _fused_rms_norm_backward
    _softmax _log_softmax _softmax_backward_data _log_softmax_backward_data
    nll_loss_forward nll_loss_backward nll_loss2d_forward nll_loss2d_backward mse_loss mse_loss_backward
    embedding embedding_dense_backward cat stack split split_with_sizes index index_put_ index_put
    index_select gather scatter scatter_add scatter_add_ masked_fill masked_fill_ where constant_pad_nd
    threshold_backward gelu_backward silu_backward sigmoid_backward tanh_backward max_pool2d_with_indices
    max_pool2d_with_indices_backward avg_pool2d avg_pool2d_backward _adaptive_avg_pool2d
    _adaptive_avg_pool2d_backward repeat roll flip tril triu topk sort argmax argmin max min cumsum
    _unsafe_view _reshape_alias set_ resize_ _local_scalar_dense item equal is_nonzero nonzero
    _foreach_add_ _foreach_mul_ _foreach_addcmul_ _foreach_addcdiv_ _foreach_sqrt _foreach_div_ _foreach_lerp_
    _fused_adam_ _fused_adamw_ _fused_sgd_ bitwise_not logical_not
""".split())


def _mv_flop(a: torch.Tensor, b: torch.Tensor, **kwargs: Any) -> int:
    return 2 * a.shape[0] * a.shape[1]


def _addmv_flop(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, **kwargs: Any) -> int:
    return 2 * a.shape[0] * a.shape[1]


def _dot_flop(a: torch.Tensor, b: torch.Tensor, **kwargs: Any) -> int:
    return 2 * a.shape[0]


def _addbmm_flop(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, **kwargs: Any) -> int:
    n, m, k = a.shape
    return 2 * n * m * k * b.shape[-1]


def _addr_flop(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor, **kwargs: Any) -> int:
    return 2 * a.shape[0] * b.shape[0]


def _registry() -> dict[Any, Callable[..., int]]:
    """torch's FLOP formulas by overload packet, with the matrix-vector products it counts 0 for."""
    from torch.utils.flop_counter import flop_registry

    formulas: dict[Any, Callable[..., int]] = dict(flop_registry)
    for packet, formula in ((_aten.mv, _mv_flop), (_aten.addmv, _addmv_flop), (_aten.dot, _dot_flop),
                            (_aten.vdot, _dot_flop), (_aten.addbmm, _addbmm_flop), (_aten.addr, _addr_flop)):
        formulas.setdefault(packet, formula)
    return formulas


def _no_flops(func: Any) -> bool:
    """Whether an op with no formula is known to do no matrix-product work (else it is unknown)."""
    if func.is_view:
        return True
    tags = func.tags
    if torch.Tag.pointwise in tags or torch.Tag.reduction in tags or torch.Tag.view_copy in tags:
        return True
    name = func._overloadpacket.__name__
    return name in _NO_FLOP_NAMES or name.rstrip("_") in _NO_FLOP_NAMES


def _nbytes(values: Any) -> int:
    return _flat_nbytes(tree_flatten(values)[0])


def _flat_nbytes(flat: list[Any]) -> int:
    total = 0
    for v in flat:
        if isinstance(v, _Tensor):
            total += v.numel() * v.element_size()
    return total


class CounterMode(TorchDispatchMode):  # type: ignore[no-untyped-call]
    """Sums each op's FLOPs, bytes and count per (call id, phase, graph task) of the
    innermost module call open where it runs; call id 0 is no module call.  One per
    counted region of one thread: ``counts`` maps the key to [flops, bytes, ops, unknown].
    ``memory`` (when given) sees each op's tensors under the same key (``modtrace.tracking.memory``)."""

    def __init__(self, tracker: Tracker, formulas: dict[Any, Callable[..., int]], known: dict[Any, bool],
                 first_seq: int, memory: MemoryLog | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.tracker = tracker
        self.formulas = formulas
        self.known = known  # op -> True (a formula or no work) | False (unknown); shared by the regions
        self.first_seq = first_seq
        self.last_seq: int | None = None
        self.thread = threading.get_ident()
        self.counts: dict[tuple[int, int, int], list[int]] = {}
        self.enabled = True
        self.memory = memory

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # torch.compile compiles as it would without the mode (else dynamo runs the region
        # eagerly on a counted step); the compiled code's ops reach the mode at run time.
        return True

    def _key(self) -> tuple[int, int, int]:
        task = _graph_task_id()
        inside = counting_key(self, task)  # an op of a compiled graph's kernel: charged once the graph returns
        if inside is not None:
            return inside
        return self.default_key(task)

    def default_key(self, task: int | None = None) -> tuple[int, int, int]:
        """The innermost module call open here, as the hooks know it."""
        if task is None:
            task = _graph_task_id()
        call_id, phase = self.tracker.innermost_call(task)
        return call_id, phase, task

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if isinstance(func, torch._ops.HigherOrderOperator) or func in _SKIP or not self.enabled \
                or func.namespace == "profiler":  # record_function's marks: no work
            return func(*args, **kwargs)
        packet = func._overloadpacket
        formula = self.formulas.get(packet)
        if formula is None:
            # As FlopCounterMode does: an op that decomposes is counted as its parts.
            with self:
                out = func.decompose(*args, **kwargs)
            if out is not NotImplemented:
                return out
        out = func(*args, **kwargs)
        unknown = 0
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
        else:
            flops = 0
            known = self.known.get(func)
            if known is None:
                known = self.known[func] = _no_flops(func)
            unknown = 0 if known else 1
        # A view allocates nothing: its storage is its input's, noted when an op that is not a
        # view first reads it (as baseline) or made it.
        memory = None if func.is_view else self.memory
        if memory is None:
            nbytes = 0 if func.is_view else _nbytes((args, kwargs)) + _nbytes(out)
        else:  # both need the tensors: flattened once
            flat_in = tree_flatten((args, kwargs))[0]
            flat_out = tree_flatten(out)[0]
            nbytes = _flat_nbytes(flat_in) + _flat_nbytes(flat_out)
        key = self._key()
        if memory is not None:
            memory.seen(flat_in, flat_out, key)
        acc = self.counts.get(key)
        if acc is None:
            self.counts[key] = [flops, nbytes, 1, unknown]
        else:
            acc[0] += flops
            acc[1] += nbytes
            acc[2] += 1
            acc[3] += unknown
        return out


class Counting:
    """Which steps are counted, and their counter modes (``Recorder(counters=...)``).

    ``policy``: ``first`` counts the first recorded step of each step kind (the
    input shape of the step's first root call, ``root_calls.kind``), ``every-step``
    every recorded step.  A step's counting starts at its first root call and ends
    at the step boundary (``end_step``); under root-call steps (``root_steps()``
    true) a root call is a boundary too.  ``may_count()`` false (a schedule's
    warm-up step) counts nothing."""

    def __init__(self, tracker: Tracker, policy: str, root_steps: Callable[[], bool],
                 may_count: Callable[[], bool]) -> None:
        if policy not in COUNTER_POLICIES or policy == "off":
            raise ValueError(f"counters must be one of first, every-step, not {policy!r}")
        self.tracker = tracker
        self.policy = policy
        self._root_steps = root_steps
        self._may_count = may_count
        self._formulas = _registry()
        self._known: dict[Any, bool] = {}
        self._kinds: set[str | None] = set()
        self._lock = threading.Lock()
        self._local = threading.local()
        self.regions: list[CounterMode] = []
        self._order = itertools.count()  # the rank's memory counter (storage ids, free order)
        self.memory = True  # follow storages too (modtrace.tracking.memory); benchmarks turn it off to compare
        self._step_open = False  # a root call of this step was seen (under optimizer or manual steps)

    def on_root(self, seq: int, kind: str | None) -> None:
        """A root call on this thread, before its enter row (seq ``seq``)."""
        if self._root_steps():
            self._stop_here(seq - 1)
        elif self._step_open:
            return  # the step's counting was decided at its first root call
        self._step_open = True
        if not self._may_count():
            return
        with self._lock:
            if self.policy == "first" and kind in self._kinds:
                return
            self._kinds.add(kind)
        memory = MemoryLog(self.tracker, self._order) if self.memory else None
        if memory is not None:
            memory.baseline(start_tensors(self.tracker))
        mode = CounterMode(self.tracker, self._formulas, self._known, seq, memory)
        mode.__enter__()  # type: ignore[no-untyped-call]
        self.tracker.set_memory(memory)
        self._local.mode = mode
        with self._lock:
            self.regions.append(mode)

    def _stop_here(self, last_seq: int) -> None:
        mode: CounterMode | None = getattr(self._local, "mode", None)
        if mode is None:
            return
        self._local.mode = None
        self.tracker.set_memory(None)
        if mode.enabled:
            mode.enabled = False
            mode.last_seq = last_seq
            if mode.memory is not None:
                mode.memory.close()
        mode.__exit__(None, None, None)  # type: ignore[no-untyped-call]

    def end_step(self) -> None:
        """The step ended (an optimizer step, ``Recorder.step()``): stop counting.  A region
        on another thread stops counting now and leaves torch's mode stack at that
        thread's next root call."""
        self._step_open = False
        last = self.tracker.next_seq - 1
        here = threading.get_ident()
        with self._lock:
            regions = [m for m in self.regions if m.enabled]
        for mode in regions:
            if mode.thread == here:
                self._stop_here(last)
            else:
                mode.enabled = False
                mode.last_seq = last
                if mode.memory is not None:
                    mode.memory.close()

    def rows(self, run_id: int, rank: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """The ``call_counters`` and ``counted_ranges`` rows of every region so far (call id 0:
        ops outside module calls, which go to the range's own counts)."""
        last = self.tracker.next_seq - 1
        calls: dict[tuple[int, int, int], list[int]] = {}
        ranges = []
        for mode in self.regions:
            if mode.enabled:
                mode.enabled = False
                mode.last_seq = last
                if mode.memory is not None:
                    mode.memory.close()
            outside = [0, 0, 0, 0]
            for key, acc in mode.counts.items():
                if key[0] == 0:
                    target = outside
                else:
                    target = calls.setdefault(key, [0, 0, 0, 0])
                for i in range(4):
                    target[i] += acc[i]
            ranges.append((run_id, rank, mode.first_seq, mode.last_seq, *outside))
        call_rows = [(run_id, rank, call_id, phase, None if task == -1 else task, *acc)
                     for (call_id, phase, task), acc in sorted(calls.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2]))]
        return call_rows, ranges

    def memory_rows(self, run_id: int, rank: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """The ``mem_storages`` and ``mem_returns`` rows of every region (call after ``rows``,
        which ends the regions still counting)."""
        storages: list[tuple[Any, ...]] = []
        returns: list[tuple[Any, ...]] = []
        for mode in self.regions:
            if mode.memory is None:
                continue
            mode.memory.close()
            s, r = mode.memory.rows(run_id, rank, mode.first_seq)
            storages += s
            returns += r
        return storages, returns

