"""One rank's batches written by a separate process.

A recording's hot path only appends tuples; writing them (binding every
value, the database's own work) costs about 1.5 us per event of CPU.  Done
by a thread of the recorded program, that work holds the interpreter lock
while the program runs: a flush after every step then slowed a CPU-bound
step by more than the write itself (the training thread waits for the lock
each time its backward pass re-enters Python).  A writer process has its own
interpreter: the program pays for pickling the batch (about 0.15 us per
event) and the rest runs beside it.

``WriterProcess`` is the program's side, with ``RankWriter``'s interface
(``write``, ``close``).  The child (``main``, run as ``python -c``) opens the
store, says it is ready and then writes each batch it is sent with a
``RankWriter`` and answers ``ok`` or the error.  Frames on its stdin/stdout
pipes are an 8-byte little-endian length and a pickle.  The child ignores
SIGINT and SIGTERM (the program decides when recording ends) and exits when
told to or when its stdin closes -- the program died: what it had been sent
is written first.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import struct
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from modtrace.store.engine import Store

_HEADER = struct.Struct("<Q")
_CHILD = "import sys; sys.path.insert(0, sys.argv[1]); from modtrace.store.writer_process import main; main()"


class WriterProcessError(Exception):
    """The writer process failed to write a batch (its message) or is gone."""


class WriterProcess:
    """Spawns the writer process for (run, rank) of ``store``; does not wait for it."""

    def __init__(self, store: Store, run_id: int, rank: int) -> None:
        if os.name != "posix" or not sys.executable:
            raise OSError("a writer process needs a POSIX system and a known interpreter")
        self.store = store
        self._ready = False
        self._dead = False
        target = str(store.path) if store.path is not None else store.engine.url.render_as_string(hide_password=False)
        package_root = str(Path(__file__).resolve().parent.parent.parent)
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, package_root],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._out: IO[bytes] = self.proc.stdin
        self._in: IO[bytes] = self.proc.stdout
        # The database's address goes through the pipe, not argv: a URL may carry a password.
        try:
            _send(self._out, ("open", target, run_id, rank))
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
        seconds (None: until it answers)."""
        if self._ready or self._dead:
            return self._ready
        if not select.select([self._in], [], [], timeout)[0]:
            return False
        reply = self._reply()
        if reply[0] != "ready":
            self._dead = True
            self._stop()
            raise WriterProcessError(str(reply[1]) if len(reply) > 1 else "the writer process could not start")
        self._ready = True
        return True

    def write(
        self,
        events: Sequence[tuple[Any, ...]],
        modules: Sequence[tuple[Any, ...]] = (),
        threads: Sequence[tuple[Any, ...]] = (),
        devices: Sequence[tuple[Any, ...]] = (),
        progress: tuple[int, int] | None = None,
    ) -> None:
        """Write one batch in one transaction, in the child; returns once it is committed."""
        self.send(self.pack(events, modules, threads, devices, progress))

    @staticmethod
    def pack(
        events: Sequence[tuple[Any, ...]],
        modules: Sequence[tuple[Any, ...]] = (),
        threads: Sequence[tuple[Any, ...]] = (),
        devices: Sequence[tuple[Any, ...]] = (),
        progress: tuple[int, int] | None = None,
    ) -> bytes:
        """A batch as the frame ``send`` takes (the program's only per-event cost)."""
        return _frame(("write", list(events), list(modules), list(threads), list(devices), progress))

    def send(self, frame: bytes) -> None:
        """Write a packed batch, in the child; returns once it is committed."""
        if self._dead:
            raise WriterProcessError("the writer process is gone")
        if not self._ready:
            self.ready(timeout=None)
        try:
            self._out.write(frame)
            self._out.flush()
        except OSError as exc:
            self._gone()
            raise WriterProcessError(f"the writer process is gone ({exc.strerror or exc})") from None
        reply = self._reply()
        if reply[0] != "ok":
            raise WriterProcessError(str(reply[1]))

    def close(self, timeout: float = 30.0) -> None:
        """Tell the child to finish and wait for it (it has nothing pending:
        writes are acknowledged).  A child still starting was never sent a
        batch: it is killed rather than waited for."""
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
                _send(self._out, ("close",))
            except OSError:
                pass
        self._stop(timeout)

    def _reply(self) -> tuple[Any, ...]:
        try:
            reply = _recv(self._in)
        except (OSError, EOFError, pickle.UnpicklingError):
            reply = None
        if reply is None:
            self._gone()
            raise WriterProcessError(f"the writer process exited unexpectedly (exit status {self.proc.returncode})")
        return reply

    def _gone(self) -> None:
        self._dead = True
        self._stop(5.0)

    def _stop(self, timeout: float = 5.0) -> None:
        for stream in (self._out, self._in):
            try:
                stream.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _frame(message: tuple[Any, ...]) -> bytes:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def _send(stream: IO[bytes], message: tuple[Any, ...]) -> None:
    stream.write(_frame(message))
    stream.flush()


def _recv(stream: IO[bytes]) -> tuple[Any, ...] | None:
    head = stream.read(_HEADER.size)
    if len(head) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack(head)
    data = stream.read(size)
    if len(data) < size:
        return None
    message: tuple[Any, ...] = pickle.loads(data)
    return message


def main() -> None:
    """The child: open the store, then write batches until told to stop or stdin closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inp, out = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the protocol pipe
    first = _recv(inp)
    if first is None or first[0] != "open":
        return
    _, target, run_id, rank = first
    try:
        from modtrace.store.engine import open_store
        from modtrace.store.writer import RankWriter

        store = open_store(target, create=False, check=False)
        writer = RankWriter(store, run_id, rank)
    except Exception as exc:  # the program writes in-process instead
        _send(out, ("error", _one_line(exc)))
        return
    _send(out, ("ready",))
    try:
        while True:
            message = _recv(inp)
            if message is None or message[0] == "close":
                break
            _, events, modules, threads, devices, progress = message
            try:
                writer.write(events, modules, threads, devices, progress)
            except Exception as exc:
                reply: tuple[Any, ...] = ("error", _one_line(exc))
            else:
                reply = ("ok",)
            try:
                _send(out, reply)
            except OSError:  # the program is gone; keep writing what arrives until stdin closes
                pass
    finally:
        writer.close()
        store.dispose()


def _one_line(exc: BaseException) -> str:
    text = str(getattr(exc, "orig", None) or exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
