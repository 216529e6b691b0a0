"""One rank's batches written by a separate process: the program's side.

A recording's hot path only appends tuples; writing them (binding every
value, the database's own work) costs CPU for every event (less in the
writer process, which binds None faster, ``writer_child``;
docs/performance.md, "Writer process and event writes").  Done by a thread of the recorded program, that work
holds the interpreter lock while the program runs: a flush after every step then slowed a CPU-bound
step by more than the write itself, and the time landed in whichever module
was running.  A writer process (``modtrace.recording.writer_child``) has its
own interpreter: the program packs each batch (a pickle without memo, a
fraction of the write's cost, ``writer_messages``; the event tuples are freed then,
``config.PendingBatch``) and writes the bytes to a pipe, between steps; the rest
runs beside it.

``WriterProcess`` is the program's side.  Batches go as frames (``pack``)
either without waiting (``send_nowait``: only when the pipe has room, so the
caller never blocks) or waiting for room (``send``); the child answers each
batch, in order, once it is committed (``ok``) or refused (``error``; after
one, it writes nothing more and answers ``skipped``).  ``replies`` collects
the answers that have arrived, waiting for them or not; before waiting it
tells the child not to hold batches back (``now``).  ``close`` waits until
the child has committed everything (``closed``), not for it to exit: asked
to (``analyze_after``), the child then analyses the rank while the program
goes on, and ``wait_analyzed`` waits for that; asked at the start (``follow``),
it analyses the rank's steps while the program runs, so that only the tail
is left then.  The database's address goes
through the pipe, not argv: a URL may carry a password.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from modtrace.core.contracts import Batch
from modtrace.recording.writer_messages import PIPE_BYTES, Inbox, frame, pack_batch
from modtrace.store.engine import Store

try:
    import fcntl
    import termios
except ImportError:  # not POSIX: pipes keep their size and send_nowait always declines
    fcntl = None  # type: ignore[assignment]
    termios = None  # type: ignore[assignment]

_CHILD = "import sys; sys.path.insert(0, sys.argv[1]); from modtrace.recording.writer_child import main; main()"
_F_SETPIPE_SZ = 1031  # Linux
_F_GETPIPE_SZ = 1032


class WriterProcessError(Exception):
    """The writer process could not start, or is gone."""


class WriterProcess:
    """Spawns the writer process for (run, rank) of ``store``; does not wait for it."""

    def __init__(self, store: Store, run_id: int, rank: int, retry_s: float = 0.0, *, follow: bool = False) -> None:
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
        self._inbox = Inbox(self._in)
        self._closed = False  # the child said everything is committed
        self._analysis: tuple[bool, str | None] | None = None  # its answer on the analysis asked for
        self._analyzing = False
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
        try:
            self._write_all(frame(("open", target, run_id, rank, retry_s)))
            if follow:  # analyse the rank as its batches are committed (``results.incremental``)
                self._write_all(frame(("follow",)))
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
    def pack(batch: Batch) -> bytes:
        """A batch as a frame (the program's only per-event cost)."""
        return pack_batch(batch)

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
                self._write_all(frame(("now",)))
            except OSError:
                self._gone()
        while True:
            reply = self._next(None if len(got) < count else 0.0)
            if reply is None:
                if self._dead:
                    raise WriterProcessError(f"the writer process exited unexpectedly (status {self.proc.returncode})")
                return got
            got.append(reply)

    def analyze_after(self, complete: bool, run_name: str) -> bool:
        """Ask the child to analyse the rank once it has committed the last
        batch (see ``close``); False when it cannot (not ready, or gone)."""
        if not self.is_ready:
            return False
        try:
            self._write_all(frame(("analyze", complete, run_name)))
        except OSError:
            self._gone()
            return False
        self._analyzing = True
        return True

    def close(self, timeout: float = 30.0) -> None:
        """Tell the child to finish and wait until it has committed every
        batch (its ``closed``); a child asked to analyse goes on with that
        (``wait_analyzed``), one that was not is waited for (it exits at once).  A child still
        starting was never sent a batch: it is killed rather than waited for."""
        if self.proc.returncode is not None:
            return
        try:
            starting = not self._dead and not self.ready()
        except WriterProcessError:
            starting = False  # it answered with an error and is gone
        if starting:
            self._dead = True
            self.proc.kill()
            self._stop(timeout)
            return
        if not self._dead:
            try:
                self._write_all(frame(("close",)))
            except OSError:
                pass
        while not self._closed and not self._dead:
            reply = self._next(timeout)
            if reply is None:
                break
            self._note(reply)
        if not self._analyzing or self._dead:
            self._analyzing = False
            self._dead = True
            self._stop(timeout)  # everything is committed; it exits at once

    def wait_analyzed(self, timeout: float | None = None) -> tuple[bool, str | None] | None:
        """After ``close``: wait up to ``timeout`` seconds (None: for ever) for
        the analysis asked for; (stored, why not), or None on timeout."""
        while self._analyzing and self._analysis is None and not self._dead:
            reply = self._next(timeout)
            if reply is None:
                if not self._dead:
                    return None
                break
            self._note(reply)
        if self._analysis is None and self._analyzing:
            self._analysis = (False, f"the writer process exited (status {self.proc.poll()}) before the analysis")
        if self._analyzing:
            self._analyzing = False
            self._release()
        return self._analysis

    def _note(self, reply: tuple[Any, ...]) -> None:
        if reply[0] == "closed":
            self._closed = True
        elif reply[0] == "analyzed":
            self._analysis = (bool(reply[1]), reply[2])

    def _release(self) -> None:
        """Close the pipes; the child exits on its own (reaped by the subprocess module later)."""
        self._dead = True
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                if stream is not None:
                    stream.close()
            except OSError:
                pass

    def forget(self) -> None:
        """In a process forked from the program: close this process's copies
        of the pipes, sending nothing (they are the program's)."""
        self._release()
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
