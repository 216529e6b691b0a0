"""Test helpers: record real models with the real tracker and check the rows.

``record`` runs a callable under a ``Tracker`` whose sink is a plain list and
whose clock is a counter, and returns readable events.  ``problems`` is an
independent, deliberately simple checker of what a faithful record means:
one enter and one exit per (call, phase, graph task), properly nested per
thread (forward) and per graph task (backward).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from modtrace.core.codes import Kind, Phase, Status
from modtrace.core.contracts import MODULE_FRAME
from modtrace.tracking.tracker import Tracker


@dataclass(frozen=True)
class Ev:
    seq: int
    ts: int
    kind: str  # enter | exit
    fqn: str
    phase: str  # forward | backward | recompute
    call_id: int
    step: int
    thread: int
    device: str | None
    stream: int | None
    status: str
    task: int | None
    tie: int

    def short(self) -> tuple[str, str, str]:
        return (self.kind, self.phase, self.fqn)


class FakeClock:
    """Nanoseconds that advance by ``tick`` on each read."""

    def __init__(self, tick: int = 1000) -> None:
        self._it = itertools.count(0, tick)

    def __call__(self) -> int:
        return next(self._it)


def decode(tracker: Tracker, rows: list[tuple[Any, ...]], devices: dict[int, str] | None = None) -> list[Ev]:
    names = {d: n for d, n in tracker.new_devices} if devices is None else devices
    out = []
    for seq, ts, kind, mid, phase, call_id, step, tid, dev, stream, status, task, tie in rows:
        out.append(Ev(seq, ts, Kind(kind).name.lower(), tracker.fqns[mid], Phase(phase).name.lower(), call_id, step,
                      tid, names.get(dev) if dev is not None else None, stream, Status(status).name.lower(), task, tie))
    return out


def record_rows(fn: Callable[[], Any]) -> tuple[list[tuple[Any, ...]], Tracker]:
    """The tracker's raw event tuples for what ``fn`` runs."""
    rows: list[tuple[Any, ...]] = []
    tracker = Tracker(rows.append, clock=FakeClock())
    tracker.start()
    try:
        fn()
    finally:
        tracker.stop()
    return rows, tracker


def record(fn: Callable[[], Any], *, optimizer_steps: bool = False) -> tuple[list[Ev], Tracker]:
    rows, tracker = record_rows(fn)
    return decode(tracker, rows), tracker


def analysis_moves_rows(tracker: Tracker, rows: list[tuple[Any, ...]]) -> list[int]:
    """The seqs of rows the analysis' tie normalisation puts elsewhere than
    the tracker wrote them (empty when it keeps the written order)."""
    import polars as pl

    from modtrace.analysis.events import normalize_events
    from modtrace.store.writer import EVENT_COLUMNS

    ev = pl.DataFrame(rows, schema=list(EVENT_COLUMNS), orient="row").with_columns(
        pl.lit(1).alias("run_id"), pl.lit(0).alias("rank")
    )
    mods = pl.DataFrame(
        [(0, *m) for m in tracker.new_modules],
        schema=list(MODULE_FRAME.names),
        orient="row",
    )
    out = normalize_events(ev, mods)
    return [s for s, o in zip(out["seq"].to_list(), [r[0] for r in rows], strict=True) if s != o]


def problems(events: list[Ev]) -> list[str]:
    """Everything unfaithful about a record; empty for a healthy one."""
    found: list[str] = []
    seqs = [e.seq for e in events]
    if seqs != sorted(seqs) or len(set(seqs)) != len(seqs):
        found.append("seq not strictly increasing")
    stacks: dict[tuple[Any, ...], list[Ev]] = {}
    seen_enter: set[tuple[int, str, Any]] = set()
    seen_exit: set[tuple[int, str, Any]] = set()
    for e in events:
        # recompute nests inside the backward of its graph task on that thread
        group = (e.thread, None) if e.phase == "forward" else (e.thread, e.task)
        stack = stacks.setdefault(group, [])
        key = (e.call_id, e.phase, e.task)
        if e.kind == "enter":
            if key in seen_enter:
                found.append(f"{e.fqn} {e.phase} entered twice (call {e.call_id})")
            seen_enter.add(key)
            stack.append(e)
        else:
            if key in seen_exit:
                found.append(f"{e.fqn} {e.phase} exited twice (call {e.call_id})")
            seen_exit.add(key)
            if not stack:
                found.append(f"{e.fqn} {e.phase} exit with nothing open (seq {e.seq})")
                continue
            top = stack.pop()
            if (top.call_id, top.phase) != (e.call_id, e.phase):
                found.append(f"{e.fqn} {e.phase} exit (seq {e.seq}) crosses open {top.fqn} {top.phase} (seq {top.seq})")
    for stack in stacks.values():
        for e in stack:
            found.append(f"{e.fqn} {e.phase} never exited (seq {e.seq})")
    return found


def spans(events: list[Ev], phase: str) -> list[tuple[str, int]]:
    """(fqn, depth) of each enter of ``phase``, in order, depth counted within that phase's stack."""
    out = []
    depth: dict[tuple[Any, ...], int] = {}
    for e in events:
        if e.phase != phase:
            continue
        group = (e.thread, e.task)
        if e.kind == "enter":
            d = depth.get(group, 0)
            out.append((e.fqn, d))
            depth[group] = d + 1
        else:
            depth[group] = depth.get(group, 0) - 1
    return out
