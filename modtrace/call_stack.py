"""A module call's record, and each thread's stack of open calls.

``Call`` is what the tracker's hooks share about one module call: open on its
thread's stack during the forward (or recompute), then, when it built
autograd graph, the backward bookkeeping that node hooks refer to.  It is the
only object made per call (beside the node hook of the call's output node and
the event tuples), so it carries every field the backward needs instead of
hanging more objects off it.
"""

from __future__ import annotations

import threading
from typing import Any

from torch import nn

from modtrace.codes import Kind, Phase, Status
from modtrace.module_names import ModuleInfo

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


class Call:
    """One module call (see the module docstring)."""

    __slots__ = ("module", "module_id", "depth", "parent", "call_id", "device_id", "phase", "task",
                 "exit_nodes", "bw_task", "exits_seen", "n_exit", "closed", "failed", "__weakref__")

    def __init__(self, module: nn.Module, info: ModuleInfo, parent: Call | None, call_id: int,
                 device_id: int | None, phase: int, task: int | None) -> None:
        self.module: nn.Module | None = module  # dropped once the forward returns
        self.module_id = info.module_id
        self.depth = info.depth
        self.parent = parent  # the call open on this thread when this one started

        self.call_id = call_id
        self.device_id = device_id
        self.phase = phase
        self.task = task  # graph task of a recompute, None in forward: the rows' task column
        # inputs needing grad, until the forward returns: one tensor, or a list of them
        self.exit_nodes: Any = None
        self.bw_task = -1  # graph task in which the backward was entered
        self.exits_seen = 0
        self.n_exit = 0  # input nodes whose gradient must be ready before the exit
        self.closed = True
        self.failed = False  # the forward raised: the backward of calls inside it never runs

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


class ThreadState:
    __slots__ = ("tid", "stack", "main")

    def __init__(self, tid: int) -> None:
        self.tid = tid
        self.stack: list[Call] = []
        self.main = threading.current_thread() is threading.main_thread()
