"""One rank's batches written by a separate process.

A recording's hot path only appends tuples; writing them (binding every
value, the database's own work) costs about 1.5 us per event of CPU.  Done
by a thread of the recorded program, that work holds the interpreter lock
while the program runs: a flush after every step then slowed a CPU-bound
step by more than the write itself, and the time landed in whichever module
was running.  A writer process has its own interpreter: the program packs
each batch (a pickle, about 0.15 us per event) and writes the bytes to a
pipe, between steps; the rest runs beside it.

``WriterProcess`` is the program's side.  Batches go as frames (``pack``)
either without waiting (``send_nowait``: only when the pipe has room, so the
caller never blocks) or waiting for room (``send``); the child answers each
batch, in order, once it is committed (``ok``) or refused (``error``; after
one, it writes nothing more and answers ``skipped``).  ``replies`` collects
the answers that have arrived, waiting for them or not; before waiting it
tells the child not to hold batches back (``now``, see ``main``).

The child (``main``, run as ``python -c``) opens the store, says ``ready``
and writes each batch with a ``ResumingWriter`` (a transient fault is
retried there, beside the program, until the recorder's deadline).  Frames on its stdin/stdout
pipes are an 8-byte little-endian length and a pickle.  It ignores SIGINT
and SIGTERM (the program decides when recording ends) and exits when told to
or when its stdin closes -- the program died: what it had been sent is
written first.
"""

from __future__ import annotations

import os
import pickle
import random
import select
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from modtrace.errors import one_line
from modtrace.store.engine import Store

try:
    import fcntl
    import termios
except ImportError:  # not POSIX: pipes keep their size and send_nowait always declines
    fcntl = None  # type: ignore[assignment]
    termios = None  # type: ignore[assignment]

_HEADER = struct.Struct("<Q")
_CHILD = "import sys; sys.path.insert(0, sys.argv[1]); from modtrace.store.writer_process import main; main()"
_F_SETPIPE_SZ = 1031  # Linux
_F_GETPIPE_SZ = 1032
PIPE_BYTES = 1 << 20  # room for a few steps' batches, so handing one over never waits
_MAX_DITHER_S = 0.5  # a batch waits at most this long before it is written


class WriterProcessError(Exception):
    """The writer process could not start, or is gone."""


class WriterProcess:
    """Spawns the writer process for (run, rank) of ``store``; does not wait for it."""

    def __init__(self, store: Store, run_id: int, rank: int, retry_s: float = 0.0) -> None:
        if os.name != "posix" or not sys.executable:
            raise OSError("a writer process needs a POSIX system and a known interpreter")
        self.store = store
        self._ready = False
        self._dead = False
        target = str(store.path) if store.path is not None else store.engine.url.render_as_string(hide_password=False)
        package_root = str(Path(__file__).resolve().parent.parent.parent)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, package_root],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True, bufsize=0,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._out = self.proc.stdin.fileno()
        self._in = self.proc.stdout.fileno()
        self._inbox = _Inbox(self._in)
        self._pipe_bytes = 0
        if fcntl is not None:
            try:
                fcntl.fcntl(self._out, _F_SETPIPE_SZ, PIPE_BYTES)
            except OSError:  # a smaller pipe only means send_nowait declines more often
                pass
            try:
                self._pipe_bytes = fcntl.fcntl(self._out, _F_GETPIPE_SZ)
            except OSError:
                self._pipe_bytes = 0
        # The database's address goes through the pipe, not argv: a URL may carry a password.
        try:
            self._write_all(_frame(("open", target, run_id, rank, retry_s)))
        except OSError:
            self._dead = True

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return not self._dead

    @property
    def is_ready(self) -> bool:
        """Ready as last seen, without looking at the pipe."""
        return self._ready and not self._dead

    def ready(self, timeout: float | None = 0.0) -> bool:
        """Whether the child has opened the store, waiting up to ``timeout``
        seconds (None: until it answers).  Raises WriterProcessError when it
        could not."""
        if self._ready or self._dead:
            return self._ready
        reply = self._next(timeout)
        if reply is None:
            if self._dead:
                raise WriterProcessError(f"the writer process exited (status {self.proc.returncode})")
            return False
        if reply[0] != "ready":
            self._gone()
            raise WriterProcessError(str(reply[1]) if len(reply) > 1 else "the writer process could not start")
        self._ready = True
        return True

    @staticmethod
    def pack(
        events: Sequence[tuple[Any, ...]],
        modules: Sequence[tuple[Any, ...]] = (),
        threads: Sequence[tuple[Any, ...]] = (),
        devices: Sequence[tuple[Any, ...]] = (),
        progress: tuple[int, int] | None = None,
        roots: Sequence[tuple[Any, ...]] = (),
        device_rows: Sequence[tuple[Any, ...]] = (),
    ) -> bytes:
        """A batch as a frame (the program's only per-event cost)."""
        return _frame(("write", list(events), list(modules), list(threads), list(devices), progress, list(roots),
                       list(device_rows)))

    def send_nowait(self, frame: bytes) -> bool:
        """Hand a frame over if the pipe has room for all of it now; False
        (nothing sent) when it has not or the child is not ready."""
        if not self._ready or self._dead or not self._pipe_bytes:
            return False
        try:
            queued = _FIONREAD.unpack(fcntl.ioctl(self._out, termios.FIONREAD, b"\0" * _FIONREAD.size))[0]
        except OSError:
            return False
        if self._pipe_bytes - queued < len(frame):
            return False
        self.send(frame)  # fits: the write returns at once
        return True

    def send(self, frame: bytes) -> None:
        """Hand a frame over, waiting for the child to be ready and for room in the pipe."""
        if not self._ready:
            self.ready(timeout=None)
        if self._dead:
            raise WriterProcessError("the writer process is gone")
        try:
            self._write_all(frame)
        except OSError as exc:
            self._gone()
            raise WriterProcessError(f"the writer process is gone ({exc.strerror or exc})") from None

    def replies(self, count: int = 0) -> list[tuple[Any, ...]]:
        """The answers that have arrived, waiting until there are at least
        ``count``.  Raises WriterProcessError when the child is gone first."""
        got: list[tuple[Any, ...]] = []
        if count and not self._dead:
            try:  # the child may be holding a batch back (see main): not now
                self._write_all(_frame(("now",)))
            except OSError:
                self._gone()
        while True:
            reply = self._next(None if len(got) < count else 0.0)
            if reply is None:
                if self._dead:
                    raise WriterProcessError(f"the writer process exited unexpectedly (status {self.proc.returncode})")
                return got
            got.append(reply)

    def close(self, timeout: float = 30.0) -> None:
        """Tell the child to finish and wait for it.  A child still starting
        was never sent a batch: it is killed rather than waited for."""
        if self.proc.returncode is not None:
            return
        try:
            starting = not self._dead and not self.ready()
        except WriterProcessError:
            starting = False  # it answered with an error and is gone
        if starting:
            self._dead = True
            self.proc.kill()
        elif not self._dead:
            try:
                self._write_all(_frame(("close",)))
            except OSError:
                pass
        self._stop(timeout)

    def forget(self) -> None:
        """In a process forked from the program: close this process's copies
        of the pipes, sending nothing (they are the program's)."""
        self._dead = True
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        self.proc.returncode = 0  # not this process's child: never wait for it

    # -- pipes -------------------------------------------------------------------

    def _write_all(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self._out, view)
            view = view[n:]

    def _next(self, timeout: float | None) -> tuple[Any, ...] | None:
        """The next whole reply, waiting up to ``timeout`` (None: for ever);
        None when none came (or the child is gone: then ``_dead``)."""
        if self._dead and not self._inbox.has_frame():
            return None
        if not self._inbox.wait(timeout):
            return None
        reply = self._inbox.next()
        if reply is None:
            self._gone()
        return reply

    def _gone(self) -> None:
        self._dead = True
        self._stop(5.0)

    def _stop(self, timeout: float = 5.0) -> None:
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


_FIONREAD = struct.Struct("i")


def _frame(message: tuple[Any, ...]) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def _send(stream: IO[bytes], message: tuple[Any, ...]) -> None:
    stream.write(_frame(message))
    stream.flush()


class _Inbox:
    """Frames arriving on a pipe (the child's stdin, the program's end of the
    child's stdout): whole frames, with or without waiting."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.closed = False

    def has_frame(self) -> bool:
        if len(self.buf) < _HEADER.size:
            return False
        size: int = _HEADER.unpack_from(self.buf)[0]
        return len(self.buf) >= _HEADER.size + size

    def wait(self, timeout: float | None) -> bool:
        """Wait until a whole frame (or the end) is here; False on timeout."""
        while not self.has_frame() and not self.closed:
            if timeout is not None and not select.select([self.fd], [], [], timeout)[0]:
                return False
            try:
                chunk = os.read(self.fd, 1 << 20)
            except OSError:
                chunk = b""
            if not chunk:
                self.closed = True
            self.buf += chunk
        return True

    def next(self) -> tuple[Any, ...] | None:
        self.wait(None)
        if not self.has_frame():
            return None
        size = _HEADER.unpack_from(self.buf)[0]
        message: tuple[Any, ...] = pickle.loads(bytes(self.buf[_HEADER.size:_HEADER.size + size]))
        del self.buf[:_HEADER.size + size]
        return message


def main() -> None:
    """The child: open the store, then write batches until told to stop or stdin closes.

    Batches handed over at step boundaries arrive once a step; written at
    once, this process's work (on a core that may share caches or a physical
    core with the program's) would always overlap the same first modules of
    the next step and bias their times.  So each batch waits a random part of
    the typical interval between batches before it is written: the overlap
    falls on every part of the step alike.  Any further message (the next
    batch, the program flushing and waiting) ends the wait at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inbox, out = _Inbox(sys.stdin.fileno()), sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the protocol pipe
    first = inbox.next()
    if first is None or first[0] != "open":
        return
    _, target, run_id, rank, retry_s = first
    try:
        from modtrace.store.engine import open_store
        from modtrace.store.retry import ResumingWriter

        store = open_store(target, create=False, check=False)
        writer = ResumingWriter(store, run_id, rank, retry_s)
    except Exception as exc:  # the program writes in-process instead
        _send(out, ("error", one_line(exc)))
        return
    _send(out, ("ready",))
    rng = random.Random()
    interval = 0.0  # typical time between batches (moving average), seconds
    last_arrival = 0.0
    failed = False
    try:
        while True:
            message = inbox.next()
            if message is None or message[0] == "close":
                break
            if message[0] == "now":  # the program waits: nothing to delay
                continue
            now = time.monotonic()
            if last_arrival:
                gap = min(now - last_arrival, _MAX_DITHER_S)
                interval = gap if not interval else 0.8 * interval + 0.2 * gap
            last_arrival = now
            if interval and not inbox.has_frame():
                inbox.wait(rng.uniform(0.0, interval))
            _, events, modules, threads, devices, progress, roots, device_rows = message
            if failed:  # batches after a refused one would leave a gap
                reply: tuple[Any, ...] = ("skipped",)
            else:
                try:
                    writer.write(events, modules, threads, devices, progress, roots, device_rows=device_rows)
                except Exception as exc:
                    failed = True
                    reply = ("error", one_line(exc))
                else:
                    reply = ("ok",)
            try:
                _send(out, reply)
            except OSError:  # the program is gone; keep writing what arrives until stdin closes
                pass
    finally:
        writer.close()
        store.dispose()

