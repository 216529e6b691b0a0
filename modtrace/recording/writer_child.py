"""The writer process itself (``main``, run as ``python -c``): one rank's
batches written beside the program, then, when asked, the rank analysed.

It opens the store, says ``ready`` and writes each batch with a
``ResumingWriter`` (a transient fault is retried here, beside the program,
until the recorder's deadline), answering each in order: ``ok``, ``error``
(after which it writes nothing more and answers ``skipped``).  It ignores
SIGINT and SIGTERM (the program decides when recording ends) and stops when
told to (``close``) or when its stdin closes -- the program died: what it
had been sent is written first.

On ``close`` it answers ``closed`` once everything is committed: the
program goes on from there.  When the program asked for it (``analyze``,
before ``close``), it then analyses the rank (``modtrace.results.materialize``: the
run's spans and nesting issues, stored) and answers ``analyzed``; the
program may have exited by then, and a failure is reported on stderr.
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from typing import Any, NoReturn

from modtrace.core.errors import one_line
from modtrace.recording.writer_messages import PIPE_BYTES, Inbox, batch_of, send

_MAX_DITHER_S = 0.5  # a batch waits at most this long before it is written


def main() -> None:
    """The child: open the store, then write batches until told to stop or stdin closes.

    Batches handed over at step boundaries arrive once a step; written at
    once, this process's work (on a core that may share caches or a physical
    core with the program's) would always overlap the same first modules of
    the next step and bias their times.  So each batch waits a random part of
    the typical interval between batches before it is written: the overlap
    falls on every part of the step alike.  Any further message (the next
    batch, the program flushing and waiting) ends the wait at once.

    It keeps the program's scheduling priority: niced (tried at 5 and 15 on
    a loaded 2-core machine) it fell behind the program, the flush the
    program waits for at the end took several times as long (docs/performance.md, "Writer
    process and event writes"), and a writer
    that falls behind for good ends in dropped steps (``max_buffered``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    inbox, out = Inbox(sys.stdin.fileno(), chunk=PIPE_BYTES), sys.stdout.buffer
    sys.stdout = sys.stderr  # nothing but frames on the protocol pipe
    first = inbox.next()
    if first is None or first[0] != "open":
        return
    _, target, run_id, rank, retry_s = first
    _bind_none_fast()
    try:
        from modtrace.store.engine import open_store
        from modtrace.store.retry import ResumingWriter

        store = open_store(target, create=False, check=False)
        writer = ResumingWriter(store, run_id, rank, retry_s)
    except Exception as exc:  # the program writes in-process instead
        send(out, ("error", one_line(exc)))
        return
    send(out, ("ready",))
    analysis: tuple[Any, ...] | None = None
    follow = _Follow(store, run_id, rank)
    try:
        analysis = _write(inbox, out, writer, follow)
    finally:
        writer.close()
    if analysis is None:
        _reply(out, ("closed",))
        if follow.follower is not None and not follow.failed:
            # The program died without finishing (stdin closed): what was committed is the
            # rank's record, analysed as a run that did not complete, as `modtrace analyze` would.
            _analyze(store, run_id, rank, False, f"id:{run_id}", follow)
        store.dispose()
        _exit()
    _reply(out, ("closed",))
    try:
        complete, run_name = analysis
        _reply(out, ("analyzed", *_analyze(store, run_id, rank, complete, run_name, follow)))
    finally:
        store.dispose()
    _exit()


class _Follow:
    """The analysis that follows the recording (``results.incremental``), once the program asks
    for it (``follow``); ``failed`` once a batch was refused (its rank's record has a gap)."""

    def __init__(self, store: Any, run_id: int, rank: int) -> None:
        self.store, self.run_id, self.rank = store, run_id, rank
        self.follower: Any = None
        self.failed = False

    def start(self) -> None:
        try:
            from modtrace.results.incremental import Follower
        except ImportError:  # analysis layer not installed: the end-of-run analysis says so
            return
        try:
            self.follower = Follower(self.store, self.run_id, self.rank).start()
        except Exception as exc:  # e.g. a MODTRACE_FOLLOW_* setting that is no number: analysed at the end
            print(f"modtrace: note: the analysis cannot follow the recording ({one_line(exc)}); "
                  "it runs at the end", file=sys.stderr)

    def committed(self, events: Any) -> None:
        if self.follower is not None:
            self.follower.committed(events)


def _bind_none_fast() -> None:
    """Bind None as SQLite's NULL without the adaptation protocol's search.

    The sqlite3 module binds int, float and str directly but sends every
    other value, None included, through its adapter lookup first: a key tuple,
    a registry miss and two attribute searches per None, which made the
    NULLs of an average event (stream, graph_task) a large part of binding
    it (docs/performance.md, "Writer process and event writes").  An adapter registered for None is found at the first lookup
    and returns None itself, which binds as NULL as before: the same rows.
    The registry is the process's; this process is the writer's alone."""
    import sqlite3

    none: dict[None, None] = {}
    sqlite3.register_adapter(type(None), none.get)  # a C method: no Python frame per None


def _exit() -> NoReturn:
    """Everything is committed and closed: exit without the interpreter's
    teardown (tens of milliseconds the program would wait for)."""
    sys.stderr.flush()
    os._exit(0)


def _write(inbox: Inbox, out: Any, writer: Any, follow: _Follow) -> tuple[Any, ...] | None:
    """Write batches until ``close`` or the end of stdin; the analysis asked for, if any."""
    rng = random.Random()
    interval = 0.0  # typical time between batches (moving average), seconds
    last_arrival = 0.0
    failed = False
    analysis: tuple[Any, ...] | None = None
    while True:
        message = inbox.next()
        if message is None or message[0] == "close":
            return analysis
        if message[0] == "now":  # the program waits: nothing to delay
            continue
        if message[0] == "analyze":  # (complete, run name): after the last batch
            analysis = message[1:] if not failed else None
            continue
        if message[0] == "follow":  # analyse the rank as its batches are committed
            follow.start()
            continue
        now = time.monotonic()
        if last_arrival:
            gap = min(now - last_arrival, _MAX_DITHER_S)
            interval = gap if not interval else 0.8 * interval + 0.2 * gap
        last_arrival = now
        if interval and not inbox.has_frame():
            inbox.wait(rng.uniform(0.0, interval))
        if failed:  # batches after a refused one would leave a gap
            reply: tuple[Any, ...] = ("skipped",)
        else:
            batch = batch_of(message)
            try:
                writer.write(batch)
            except Exception as exc:
                failed = follow.failed = True
                reply = ("error", one_line(exc))
            else:
                reply = ("ok",)
        _reply(out, reply)
        if reply[0] == "ok":
            follow.committed(batch.events)


def _analyze(store: Any, run_id: int, rank: int, complete: bool, run_name: str,
             follow: _Follow | None = None) -> tuple[bool, str | None]:
    """Analyse and store the rank's spans and issues (the tail, when its analysis followed the
    recording; all of it when there was none, or it could not finish); (done, why not)."""
    if follow is not None and follow.follower is not None:
        try:
            follow.follower.finish(complete)
        except Exception as exc:  # the events are safe: analysed again from the start below
            print(f"modtrace: note: the analysis that followed run {run_name!r} stopped ({one_line(exc)}); "
                  "analysing it again", file=sys.stderr)
        else:
            return True, None
    try:
        from modtrace.results.materialize import materialize

        materialize(store, run_id, rank=rank, complete=complete)
    except ImportError:  # analysis layer not installed in this build
        return False, "the analysis is not installed"
    except Exception as exc:  # the events are safe; analysis can be rerun with `modtrace analyze`
        why = one_line(exc)
        print(f"modtrace: warning: analysing run {run_name!r} failed: {why}; "
              f"rerun `modtrace analyze {run_name}`", file=sys.stderr)
        return False, why
    return True, None


def _reply(out: Any, message: tuple[Any, ...]) -> None:
    try:
        send(out, message)
    except OSError:  # the program is gone; keep going until stdin closes
        pass
