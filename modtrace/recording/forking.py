"""Forked children of a recording: their module calls are counted, not recorded.

A process forked while a ``Recorder`` runs (DataLoader workers, a plain
``os.fork``) inherits the recorder: its global hooks, buffers, the pipe to
the writer process, an open database connection.  None of it may be used
there: a child writing into the parent's pipe or connection would corrupt
both, and closing an inherited PostgreSQL connection ends the parent's
session.  So in the child, right after the fork, every running recorder
lets go of all of it without a word to the database, and its hooks are
replaced by one that only counts calls, into memory shared with the parent
(``ForkCounter``).  The parent stores the count with its rank
(``run_ranks.fork_calls``); ``modtrace show`` and the end-of-run line say
how many module calls ran unrecorded in child processes.

Why not record the children: a DataLoader worker's transforms run outside
the training step and on another process's clock; as rows of the parent's
run they would interleave with its steps without nesting in them.  Counted,
the run is honest about what it does not hold.
"""

from __future__ import annotations

import mmap
import os
import struct
import weakref
from collections.abc import Callable
from typing import Any

_SLOTS = 4096  # one 8-byte counter per pid % _SLOTS: a child only adds to its own
_SLOT = struct.Struct("<q")


class ForkCounter:
    """Module calls made in forked children, counted in shared memory."""

    def __init__(self) -> None:
        self._mem = mmap.mmap(-1, _SLOTS * _SLOT.size)  # anonymous and shared: children write, the parent reads
        self._handle: Any = None

    def count_calls_here(self) -> None:
        """In a child: count every module call from now on (a global pre-hook)."""
        if self._handle is not None:
            return  # a grandchild inherited the counting hook already
        from torch.nn.modules.module import register_module_forward_pre_hook

        mem, slot = self._mem, _SLOT

        def count(module: Any, args: Any) -> None:
            offset = (os.getpid() % _SLOTS) * slot.size
            slot.pack_into(mem, offset, slot.unpack_from(mem, offset)[0] + 1)

        self._handle = register_module_forward_pre_hook(count)

    def total(self) -> int:
        return sum(v for (v,) in _SLOT.iter_unpack(self._mem))

    def close(self) -> None:
        self._mem.close()


_live: weakref.WeakSet[Any] = weakref.WeakSet()
_registered = False


def watch(owner: Any, in_child: Callable[[], None]) -> None:
    """Call ``in_child()`` of ``owner`` in every child forked while it is watched."""
    global _registered
    if not _registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _registered = True
    owner._fork_hook = in_child
    _live.add(owner)


def unwatch(owner: Any) -> None:
    _live.discard(owner)


def _after_fork_in_child() -> None:
    for owner in list(_live):
        try:
            owner._fork_hook()
        except Exception:  # never break the child over the recording
            pass
    _live.clear()
