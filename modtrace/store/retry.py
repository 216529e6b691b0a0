"""Reconnect and resume: a write that failed on a transient fault is retried.

Hours of recording over a network meet idle-connection killers, server
restarts and failovers; a SQLite file can be locked by another process for
longer than the busy timeout.  ``ResumingWriter`` wraps a ``RankWriter``:
when a batch fails with a fault ``is_transient`` recognises, the connection
is dropped and a new one opened, with backoff, until ``retry_s`` has passed
since the fault began.  Before writing the batch again it asks the database
what it committed -- the rank's ``event_count``, updated in the same
transaction as every batch -- so a batch whose commit succeeded but whose
answer was lost is not written twice, and one that was rolled back is
written again: nothing lost, nothing twice.  The same question the recorder
asks when its writer process dies.

Faults are told apart by exception type and SQLSTATE, never by message
text.  A non-transient fault (disk full, permission, a schema mismatch) or
one that outlives the deadline is raised as it is.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from modtrace.core.contracts import Batch
from modtrace.core.errors import UsageError
from modtrace.store.engine import Store
from modtrace.store.writer import RankWriter

DEFAULT_RETRY_S = 120.0
_FIRST_DELAY_S = 0.05
_MAX_DELAY_S = 2.0

# SQLite primary result codes (extended codes carry them in the low byte).
_SQLITE_BUSY = 5
_SQLITE_LOCKED = 6
# SQLSTATEs of faults that a new connection (or the same statement again) gets past:
# class 08 connection exceptions, 57P01 admin_shutdown, 57P02 crash_shutdown,
# 57P03 cannot_connect_now (starting up, in recovery), 40001 serialization_failure,
# 40P01 deadlock_detected, 53300 too_many_connections.
_PG_TRANSIENT = frozenset({"57P01", "57P02", "57P03", "40001", "40P01", "53300"})


def retry_seconds(value: float | None = None) -> float:
    """The retry deadline: ``value``, else ``MODTRACE_RETRY_S``, else 120 s."""
    if value is not None:
        if value < 0:
            raise ValueError(f"retry_s must be >= 0, not {value!r}")
        return float(value)
    raw = os.environ.get("MODTRACE_RETRY_S")
    if not raw:
        return DEFAULT_RETRY_S
    try:
        seconds = float(raw)
    except ValueError:
        raise UsageError(f"MODTRACE_RETRY_S must be a number of seconds, not {raw!r}") from None
    if seconds < 0:
        raise UsageError(f"MODTRACE_RETRY_S must be >= 0, not {raw!r}")
    return seconds


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a fault a new connection may get past: a lost or
    refused PostgreSQL connection, a server shutting down or starting up, a
    SQLite database busy or locked past the busy timeout."""
    if getattr(exc, "connection_invalidated", False):  # SQLAlchemy saw the connection drop
        return True
    orig = getattr(exc, "orig", None) or exc
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return (int(code) & 0xFF) in (_SQLITE_BUSY, _SQLITE_LOCKED)
    try:
        import psycopg
    except ImportError:  # pragma: no cover - no PostgreSQL driver, no PostgreSQL faults
        return False
    if not isinstance(orig, psycopg.Error):
        return False
    sqlstate = orig.sqlstate
    if sqlstate is None:
        # Raised by the client, not sent by the server: the connection broke
        # or could not be made (closed, refused, reset).
        return isinstance(orig, psycopg.OperationalError)
    return sqlstate.startswith("08") or sqlstate in _PG_TRANSIENT


class ResumingWriter:
    """A ``RankWriter`` that survives transient faults (see the module
    docstring).  ``reconnects`` counts the faults it got past; the count
    goes to ``run_ranks.reconnects`` with the next batch written."""

    def __init__(
        self, store: Store, run_id: int, rank: int, retry_s: float = DEFAULT_RETRY_S, *,
        sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.writer = RankWriter(store, run_id, rank)
        self.store = store
        self.retry_s = retry_s
        self.reconnects = 0
        self._unsaved = 0  # reconnects not yet added to run_ranks
        self._deadline: float | None = None  # set while a transient fault lasts
        self._fault = False  # a try failed and no new connection has worked yet
        self._sleep = sleep
        self._clock = clock

    @property
    def expired(self) -> bool:
        """A transient fault began and the deadline has passed since."""
        return self._deadline is not None and self._clock() >= self._deadline

    def write(self, batch: Batch, *, retry: bool = True) -> bool:
        """Write one batch, retrying transient faults until the deadline.

        With ``retry=False`` a transient fault is raised after one try; the
        next ``write`` of the same batch resumes it (same deadline, and the
        database asked first whether that try was committed).  Returns False
        when an earlier try of this batch turned out committed."""
        deadline = self._deadline
        delay = _FIRST_DELAY_S
        while True:
            try:
                if deadline is not None:  # an earlier try failed: did it commit after all?
                    if batch.progress is not None and self.committed() >= batch.progress[0]:
                        self._got_past_fault()
                        self._deadline = None
                        if self._unsaved:
                            self.writer.write(Batch(), reconnects=self._unsaved)
                            self._unsaved = 0
                        return False
                # A fault counts as got past once a write on a new connection commits.
                self.writer.write(batch, reconnects=self._unsaved + int(self._fault))
                if self._fault:
                    self._got_past_fault()
                self._unsaved = 0
                self._deadline = None
                return True
            except Exception as exc:
                if not is_transient(exc):
                    self._deadline = None
                    raise
                now = self._clock()
                if deadline is None:
                    deadline = self._deadline = now + self.retry_s
                self._fault = True
                self.writer.close()
                if not retry or now >= deadline:
                    raise
                self._sleep(min(delay, deadline - now))
                delay = min(delay * 2, _MAX_DELAY_S)

    def _got_past_fault(self) -> None:
        if self._fault:
            self._fault = False
            self.reconnects += 1
            self._unsaved += 1

    def committed(self) -> int:
        """The rank's event count as committed in the database."""
        return self.writer.committed()

    def close(self) -> None:
        self.writer.close()

    def forget(self) -> None:
        self.writer.forget()


def call_retrying(fn: Callable[[], Any], retry_s: float, *, sleep: Callable[[float], None] = time.sleep,
                  clock: Callable[[], float] = time.monotonic) -> Any:
    """``fn()``, called again on a transient fault until ``retry_s`` has
    passed; ``fn`` must be one transaction (all or nothing) that may be repeated."""
    deadline = clock() + retry_s
    delay = _FIRST_DELAY_S
    while True:
        try:
            return fn()
        except Exception as exc:
            now = clock()
            if not is_transient(exc) or now >= deadline:
                raise
            sleep(min(delay, deadline - now))
            delay = min(delay * 2, _MAX_DELAY_S)
