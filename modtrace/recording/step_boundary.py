"""The recorder acting on its schedule (``modtrace.recording.schedule``) at each step boundary.

Off steps: the tracker's module hooks are removed (``Tracker.pause``); the
optimizer step hook stays, so steps still advance.  Warm-up steps: the hooks
run, but their events go to a list that is emptied when the step ends, and
the tracker numbers events again from where the warm-up began, so the stored
``seq`` has no gap; the root calls it noted go too.  Recorded steps: events go
to the recorder's buffer as without a schedule.  A step's action is decided
when it begins, so a step is recorded whole or not at all.
"""

from __future__ import annotations

import threading
from typing import Any

from modtrace.core.errors import StoreError
from modtrace.recording.config import ranges
from modtrace.recording.schedule import Schedule, StepAction
from modtrace.tracking.tracker import Tracker


class Scheduling:
    """A mixin over the attributes ``Recorder.__init__`` sets, listed below."""

    schedule: Schedule | None
    _tracker: Tracker | None
    _buf: list[tuple[Any, ...]]
    _take_lock: threading.Lock
    _flush_error: StoreError | None
    _action: StepAction
    _warm: list[tuple[Any, ...]]
    _warm_seq: int
    _recorded_steps: list[int]

    def _drop(self, event: tuple[Any, ...]) -> None:
        raise NotImplementedError

    def _begin_step(self, tracker: Tracker, step: int) -> None:
        """Step ``step`` begins (the previous one has ended): act on the schedule."""
        schedule = self.schedule
        if schedule is None:
            return
        if self._action is StepAction.WARMUP:
            with self._take_lock:  # the warm-up step's events and root calls go
                self._warm.clear()
                tracker.rewind(self._warm_seq)
                roots = tracker.new_roots
                roots[:] = [r for r in roots if r[0] < self._warm_seq]
        action = self._action = schedule.action(step)
        if action is StepAction.OFF:
            tracker.pause()
            return
        tracker.resume()
        # A warm-up step's events are thrown away and their seqs used again: no device timing for them.
        tracker.device_marks = action is not StepAction.WARMUP
        if action is StepAction.WARMUP:
            self._warm_seq = tracker.next_seq
            tracker._append = self._warm.append
        else:
            self._recorded_steps.append(step)
            tracker._append = self._drop if self._flush_error is not None else self._buf.append

    def _recorded_steps_text(self) -> str | None:
        """run_ranks.recorded_steps: the recorded steps as ranges ('' when none); None without a schedule."""
        if self.schedule is None:
            return None
        return ranges(self._recorded_steps) or ""
