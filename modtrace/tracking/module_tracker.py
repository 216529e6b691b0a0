"""A drop-in replacement for ``torch.utils.module_tracker.ModuleTracker``.

Same interface (``parents``, ``is_bw``, a context manager), driven by the
same hooks as the recorder, so it stays right where torch's tracker is not:
checkpointing, inputs without grad, exceptions, threads, ``autograd.grad``
inside a forward.  It records nothing.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import torch

from modtrace.core.codes import Kind
from modtrace.core.contracts import EVENT_ROW
from modtrace.tracking.tracker import Tracker

_KIND = EVENT_ROW.index("kind")
_MODULE_ID = EVENT_ROW.index("module_id")


class _Parents:
    """Turns the tracker's events into the set of running module names."""

    __slots__ = ("tracker", "counts", "names")

    def __init__(self) -> None:
        self.tracker: Tracker | None = None
        self.counts: dict[int, int] = {}
        self.names: set[str] = {"Global"}

    def append(self, event: tuple[Any, ...]) -> None:
        kind, module_id = event[_KIND], event[_MODULE_ID]
        counts = self.counts
        assert self.tracker is not None
        if kind == Kind.ENTER:
            n = counts.get(module_id, 0)
            counts[module_id] = n + 1
            if n == 0:
                self.names.add(self.tracker.fqns[module_id])
        else:
            n = counts.get(module_id, 0)
            if n <= 1:
                counts.pop(module_id, None)
                self.names.discard(self.tracker.fqns[module_id])
            else:
                counts[module_id] = n - 1


class ModuleTracker:
    """Track which modules are running, by fully qualified name.

    ``parents`` always holds ``"Global"`` plus the fqn of every module whose
    forward, backward or recompute is in progress; ``is_bw`` says whether a
    backward pass is running on this thread.
    """

    def __init__(self) -> None:
        self._sink = _Parents()
        self._tracker = Tracker(self._sink.append, roots=False)
        self._sink.tracker = self._tracker

    @property
    def parents(self) -> set[str]:
        return self._sink.names

    @property
    def is_bw(self) -> bool:
        return bool(torch._C._current_graph_task_id() != -1)

    def __enter__(self) -> ModuleTracker:
        self._tracker.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self._tracker.stop()
        self._sink.counts.clear()
        self._sink.names = {"Global"}
