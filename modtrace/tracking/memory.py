"""Tensor memory per module call on counted steps: storages, allocated and freed.

On a counted region (``modtrace.tracking.counters``) the counters' dispatch mode
also hands each op's tensors here (one mode per region, not two): a storage of
an output not yet known in the region is an *allocation*, noted with its bytes,
its device, its position among the events (the tracker's next event seq: it
happened after event ``seq - 1`` and before event ``seq``) and the innermost
call open (the counters' own key).  A weak reference on the storage notes its
free: torch keeps one Python object per storage for as long as the storage
lives (tests/tracking/test_memory.py checks it), so the reference dies when
the memory is released.  A storage first met as an op's input, and the
parameters, buffers, gradients and optimizer state at the region's start, are
*baseline*: alive before the region.  The hot path appends tuples; levels,
kept and peak memory per span are computed offline
(``modtrace.analysis.memory``).

CUDA sizes are rounded up to 512 bytes, as the caching allocator rounds each
block; CPU sizes are the storages' own.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from modtrace.tracking.module_names import iter_tensors

if TYPE_CHECKING:
    from modtrace.tracking.tracker import Tracker

_Tensor = torch.Tensor
_strided = torch.strided

if sys.version_info < (3, 12):
    def _peek(counter: itertools.count[int]) -> int:
        """The value ``next(counter)`` would give, without taking it."""
        value: int = counter.__reduce__()[1][0]  # type: ignore[assignment]
        return value
else:  # itertools' pickling is deprecated from 3.12: read its repr, ``count(N)``
    def _peek(counter: itertools.count[int]) -> int:
        return int(repr(counter)[6:-1])


class MemoryLog:
    """One counted region's storages (``CounterMode.memory``).

    ``storages``: (sid, device id, nbytes, alloc seq or None, call id, phase, graph task) per
    storage in order of first sight; ``frees``: (sid, free seq, free order); ``returns``:
    (call id, sid) of the storages forward calls returned.  ``order`` is the rank's memory
    counter, shared by its regions: sids and free orders come from it, so the allocations and
    frees at one position keep the order they happened in."""

    def __init__(self, tracker: Tracker, order: itertools.count[int]) -> None:
        self.tracker = tracker
        self.order = order
        # Per storage seen, only what the garbage collector need not follow (ints) beside its weak
        # reference: every object kept per allocation is work for young-generation collections.
        self.known: dict[int, int] = {}  # id(storage) -> sid, while it lives
        self._refs: dict[int, weakref.ref[Any]] = {}  # id(ref) -> ref
        self._sid: dict[int, int] = {}  # id(ref) -> sid
        self._key: dict[int, int] = {}  # id(ref) -> id(storage)
        self._on_free = self._freed  # one bound method for every reference
        self.storages: list[tuple[int, int, int, int | None, int, int, int]] = []
        self.frees: list[tuple[int, int, int]] = []
        self.returns: list[tuple[int, int]] = []
        self.open = True

    def _new(self, t: torch.Tensor, st: Any, alloc: int | None, key: tuple[int, int, int]) -> int:
        sid = next(self.order)
        nbytes = st.nbytes()
        dev = t.device
        tracker = self.tracker
        device_id = tracker._devices.get(dev)
        if device_id is None:
            device_id = tracker._device(dev)
        if dev.type == "cuda":
            nbytes = (nbytes + 511) // 512 * 512
        self.storages.append((sid, device_id, nbytes, alloc, *key))
        skey = id(st)
        self.known[skey] = sid
        ref = weakref.ref(st, self._on_free)
        rkey = id(ref)
        self._refs[rkey] = ref
        self._sid[rkey] = sid
        self._key[rkey] = skey
        return sid

    def _freed(self, ref: weakref.ref[Any]) -> None:
        rkey = id(ref)
        if self._refs.pop(rkey, None) is None:
            return
        self.known.pop(self._key.pop(rkey), None)
        self.frees.append((self._sid.pop(rkey), _peek(self.tracker._seq), next(self.order)))

    def seen(self, inputs: Iterable[Any], outputs: Iterable[Any], key: tuple[int, int, int]) -> None:
        """An op ran with these (flattened) arguments and results, charged to ``key``."""
        if not self.open:
            return
        known = self.known
        for t in inputs:
            if type(t) is _Tensor or isinstance(t, _Tensor):
                if t.layout is not _strided or t.is_meta:
                    continue
                st = t.untyped_storage()
                if id(st) not in known:
                    self._new(t, st, None, (0, 0, -1))
        alloc = None
        for t in outputs:
            if type(t) is _Tensor or isinstance(t, _Tensor):
                if t.layout is not _strided or t.is_meta:
                    continue
                st = t.untyped_storage()
                if id(st) not in known:
                    if alloc is None:
                        alloc = _peek(self.tracker._seq)
                    self._new(t, st, alloc, key)

    def baseline(self, tensors: Iterable[Any]) -> None:
        """Storages alive before the region (parameters, gradients, optimizer state)."""
        known = self.known
        for t in tensors:
            if isinstance(t, _Tensor) and t.layout is _strided and not t.is_meta:
                try:
                    st = t.untyped_storage()
                except (RuntimeError, NotImplementedError):  # a tensor subclass without a storage of its own
                    continue
                if id(st) not in known:
                    self._new(t, st, None, (0, 0, -1))

    def returned(self, call_id: int, output: Any) -> None:
        """A forward call of this region returned ``output``: note its storages."""
        if not self.open:
            return
        known = self.known
        tensors = (output,) if isinstance(output, _Tensor) else iter_tensors(output, _Tensor)
        sids = []
        for t in tensors:
            if t.layout is not _strided or t.is_meta:
                continue
            st = t.untyped_storage()
            sid = known.get(id(st))
            if sid is None:  # made before the region (a cached tensor): baseline
                sid = self._new(t, st, None, (0, 0, -1))
            if sid not in sids:
                sids.append(sid)
        for sid in sids:
            self.returns.append((call_id, sid))

    def close(self) -> None:
        """The region ended: frees from now on are outside it (the weak references are dropped)."""
        self.open = False
        self._refs.clear()
        self._sid.clear()
        self._key.clear()
        self.known.clear()

    def rows(self, run_id: int, rank: int, first_seq: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
        """``mem_storages`` and ``mem_returns`` rows (store.memory's column order)."""
        freed = {sid: (seq, order) for sid, seq, order in self.frees}
        storages = []
        for sid, device_id, nbytes, alloc, call_id, phase, task in self.storages:
            free = freed.get(sid)
            storages.append((run_id, rank, first_seq, sid, device_id, nbytes, alloc,
                             None if free is None else free[0], None if free is None else free[1], call_id, phase, task))
        returns = sorted({(run_id, rank, call_id, sid) for call_id, sid in self.returns})
        return storages, returns


def start_tensors(tracker: Tracker) -> Iterable[Any]:
    """The tensors alive at a region's start that it counts from its start: the parameters,
    buffers and gradients of the modules the tracker named, and the optimizers' state."""
    for mod in tracker.live_modules():
        for p in mod._parameters.values():
            if p is not None:
                yield p
                if p.grad is not None:
                    yield p.grad
        for b in mod._buffers.values():
            if b is not None:
                yield b
    for opt in list(tracker.optimizers):
        for state in list(opt.state.values()):
            if isinstance(state, dict):
                yield from state.values()
