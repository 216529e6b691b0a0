"""A live one-line status on a terminal while a run records.

A daemon thread redraws the line every ``interval`` seconds from two plain
counters it reads off the recorder (events, steps); the recording hot path
never calls into this module.  Nothing is drawn unless the stream is a
terminal, and the line is cleared when recording ends, so the target's
own output and a log file stay clean.

The target runs in this process and writes to the same terminal, so the line
must never share a row with the target's text.  ``guard()`` puts a thin proxy
in front of ``sys.stdout`` and ``sys.stderr`` (those that are terminals): a
write first erases the status line, so every byte the target writes lands
where it would have without modtrace.  The line is drawn only when the
target's last write ended a line (the cursor is at the start of an empty row:
never over a tqdm or rich bar, which leave the cursor at the bar's end) and
the target has written nothing for ``quiet_period`` seconds (a busy log or a
progress bar is left alone, not flickered).  It is cut to the terminal's width
so it never wraps onto a second row.

What the proxy cannot see: bytes written straight to the file descriptors
(a C extension's ``fprintf(stderr)``, a child process sharing the terminal,
``sys.stdout.buffer``) can still start after a drawn status line; the quiet
period makes that rare, and ``-q`` turns the line off.
"""

from __future__ import annotations

import io
import math
import os
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TextIO

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
        quiet_period: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.label = mask(label)
        self.read = read
        self.interval = interval
        self.quiet_period = quiet_period
        self.clock = clock
        self._start = 0.0  # set by start()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Reentrant: a signal handler may write (through the proxy) while this thread holds it.
        self._lock = threading.RLock()
        self._drawn = False
        self._at_line_start = True  # whether the target's last write ended a line
        self._last_write = -math.inf  # when the target last wrote, on ``clock``
        self._guarded: list[tuple[str, _Guarded]] = []
        _LIVE.add(self)

    def draw(self) -> None:
        events, steps = self.read()
        now = self.clock()
        line = format_status(self.label, events, steps, now - self._start)
        with self._lock:
            if self._stop.is_set() or not self._at_line_start or now - self._last_write < self.quiet_period:
                return
            try:
                self.stream.write(CLEAR_LINE + line[: self._width() - 1])
                self.stream.flush()
                self._drawn = True
            except (OSError, ValueError):  # the terminal went away
                self._stop.set()

    def _width(self) -> int:
        # One column short of the width: a line that fills the row moves the cursor to the next.
        try:
            return os.get_terminal_size(self.stream.fileno()).columns or 80
        except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
            return 1 << 16

    def _erase(self) -> None:
        if self._drawn:
            try:
                self.stream.write(CLEAR_LINE)
                self.stream.flush()
            except (OSError, ValueError):
                pass
            self._drawn = False

    def write_through(self, stream: TextIO, text: str) -> int:
        """Write the target's ``text`` to ``stream`` with the status line out of its way."""
        with self._lock:
            self._erase()
            n = stream.write(text)
            if text:
                self._at_line_start = text.endswith("\n")
                self._last_write = self.clock()
            return n

    def guard(self) -> ProgressLine:
        """Route the target's ``sys.stdout`` and ``sys.stderr`` writes through ``write_through``
        (only the streams that are terminals: a file or a pipe never shows the line); ``stop``
        puts them back."""
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if stream is not None and wanted(stream, quiet=False):
                proxy = _Guarded(stream, self)
                setattr(sys, name, proxy)
                self._guarded.append((name, proxy))
        return self

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
            self._erase()
        for name, proxy in self._guarded:
            if getattr(sys, name) is proxy:  # the target may have put its own stream there since
                setattr(sys, name, proxy._stream)
        self._guarded = []
        if self._thread is not None:
            self._thread.join(timeout=2 * self.interval + 1)
            self._thread = None


class _Guarded:
    """``sys.stdout``/``sys.stderr`` while the status line is up: writes go through the line's
    ``write_through``; everything else (``isatty``, ``fileno``, ``encoding``, ``flush``) is the
    stream's own.  A logging handler that kept a reference to it keeps working after ``stop``."""

    def __init__(self, stream: TextIO, line: ProgressLine) -> None:
        self._stream = stream
        self._line = line

    def write(self, text: str) -> int:
        return self._line.write_through(self._stream, text)

    def writelines(self, lines: Iterable[str]) -> None:
        for text in lines:
            self.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


# Lines alive in this process, so a forked child (a DataLoader worker) can drop them: it has no
# drawing thread, and a lock held by the parent's thread at the fork would block its writes.
_LIVE: weakref.WeakSet[ProgressLine] = weakref.WeakSet()


def _forget_in_child() -> None:
    for line in list(_LIVE):
        line._lock = threading.RLock()
        line._stop.set()
        line._drawn = False
        line._thread = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def wanted(stream: TextIO, quiet: bool) -> bool:
    """Draw progress only on a terminal and when not --quiet."""
    if quiet:
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
