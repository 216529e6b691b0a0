"""A live one-line status on a terminal while a run records.

A daemon thread redraws the line every ``interval`` seconds from two plain
counters it reads off the recorder (events, steps); the recording hot path
never calls into this module.  Nothing is drawn unless the stream is a
terminal, and the line is cleared when recording ends, so the target's
own output and a log file stay clean.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TextIO

from modtrace.core.secrets import mask

CLEAR_LINE = "\r\x1b[K"


def format_status(label: str, events: int, steps: int, elapsed_s: float) -> str:
    return f"modtrace: {label}  {events:,} events  {steps:,} steps  {elapsed_s:.1f}s"


class ProgressLine:
    """Redraws ``format_status`` on ``stream`` until ``stop()``.

    ``read`` returns (events, steps); it runs on the progress thread and must
    only read attributes.  ``clock`` is injectable for tests.
    """

    def __init__(
        self,
        stream: TextIO,
        label: str,
        read: Callable[[], tuple[int, int]],
        *,
        interval: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.label = mask(label)
        self.read = read
        self.interval = interval
        self.clock = clock
        self._start = 0.0  # set by start()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._drawn = False

    def draw(self) -> None:
        events, steps = self.read()
        line = format_status(self.label, events, steps, self.clock() - self._start)
        with self._lock:
            if self._stop.is_set():
                return
            try:
                self.stream.write(CLEAR_LINE + line)
                self.stream.flush()
                self._drawn = True
            except (OSError, ValueError):  # the terminal went away
                self._stop.set()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.draw()

    def start(self) -> ProgressLine:
        self._start = self.clock()
        self.draw()  # the first line is drawn at once, not one interval later
        self._thread = threading.Thread(target=self._loop, name="modtrace-progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._stop.set()
            if self._drawn:
                try:
                    self.stream.write(CLEAR_LINE)
                    self.stream.flush()
                except (OSError, ValueError):
                    pass
                self._drawn = False
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval + 1)
            self._thread = None


def wanted(stream: TextIO, quiet: bool) -> bool:
    """Draw progress only on a terminal and when not --quiet."""
    if quiet:
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
