"""Process-level safety nets of a recording: SIGTERM raises ``Terminated``
inside the program (unless it handles SIGTERM itself), ``atexit`` finishes a
recording the program never left, and a child forked while recording lets go
of the parent's hooks, pipes and connection (see ``modtrace.recording.forking``)."""

from __future__ import annotations

import atexit
import signal
import threading
from types import FrameType
from typing import TYPE_CHECKING, Any

from modtrace.core.errors import Terminated
from modtrace.recording import forking
from modtrace.recording.writer_process import WriterProcess
from modtrace.store.engine import Store
from modtrace.store.retry import ResumingWriter
from modtrace.store.writer import forget_connection
from modtrace.tracking.tracker import Tracker

if TYPE_CHECKING:
    from sqlalchemy import Connection


class SafetyNets:
    """Signal handlers, the atexit hook and the forked child's letting go: a
    mixin over the attributes ``Recorder.__init__`` sets, listed below."""

    status: str | None
    handle_sigterm: bool
    _tracker: Tracker | None
    _proc: WriterProcess | None
    _writer: ResumingWriter | None
    _store: Store | None
    _forks: forking.ForkCounter | None
    _forked_child: bool
    _prev_sigterm: Any
    _atexit_registered: bool
    _keeper: Connection | None

    def finish(self, status: str = "completed", error: str | None = None) -> None:
        raise NotImplementedError

    def _in_forked_child(self) -> None:
        """In a child forked while recording, right after the fork: let go of
        the parent's hooks, pipes and connection without a word to them;
        count the child's module calls instead (see modtrace.recording.forking)."""
        self._forked_child = True
        if self._tracker is not None:
            self._tracker.stop()
        if self._forks is not None:
            self._forks.count_calls_here()
        proc, self._proc = self._proc, None
        if proc is not None:
            proc.forget()
        if self._writer is not None:
            self._writer.forget()
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            forget_connection(keeper)
        if self._store is not None:
            self._store.engine.dispose(close=False)
        if self._atexit_registered:
            atexit.unregister(self._atexit)
            self._atexit_registered = False
        if self._prev_sigterm is not None:
            try:
                signal.signal(signal.SIGTERM, self._prev_sigterm)
            except ValueError:  # forked from a thread other than the main one
                pass

    def _install_signal_handlers(self) -> None:
        if not self._atexit_registered:
            atexit.register(self._atexit)
            self._atexit_registered = True
        if not self.handle_sigterm or threading.current_thread() is not threading.main_thread():
            return
        prev = signal.getsignal(signal.SIGTERM)
        if prev not in (signal.SIG_DFL, None):
            return  # the program handles SIGTERM itself; atexit still flushes

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            raise Terminated()

        self._prev_sigterm = prev
        signal.signal(signal.SIGTERM, on_sigterm)

    def _restore_signal_handlers(self) -> None:
        if self._prev_sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._prev_sigterm)
            self._prev_sigterm = None
        if self._atexit_registered:
            atexit.unregister(self._atexit)
            self._atexit_registered = False

    def _atexit(self) -> None:
        if self.status is None and self._tracker is not None:
            self.finish("interrupted", "process exited inside the recording")

