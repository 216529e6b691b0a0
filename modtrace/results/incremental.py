"""A rank analysed while it is recorded: the writer process's share of ``materialize``.

``materialize`` analyses a rank in rounds (``analysis.stream.analyze_rank``) whose results are
the one-piece analysis'.  Run at the end of a recording, it kept ``modtrace record``'s user
waiting for the whole rank (docs/performance.md, "Analysis as the run goes").  ``Follower`` runs
the same rounds in a thread of the writer process while the program runs, over the events
committed so far, as the writer hands them over (``committed``; read back from the store
where they were not, or were dropped: ``MAX_HANDED``): each round's spans and issues are
committed as it closes them (``store.analysis_store.append_analysis_round``), its spans kept
in memory and folded into the step table (``analysis.step_fold``) and the module tree
(``analysis.tree_fold``), with the root calls read as the rounds go.  At the end (``finish``)
only the open tail is analysed; then, as ``materialize`` does, the rank's folded steps are
stored with the run's analysis state (``write_analysis_rounds(..., appended=True)``), and its
device times, counters and memory from the spans kept, not read back, and the folded tree
(steps and tree computed from the spans where a fold could not stand for them).

Exactness rests on ``analyze_rank``'s: rounds fed consecutive chunks in seq order give the
one-piece result, and a stream where a cut could matter is analysed again whole at the end.
Two things make the chunks right while batches still arrive:

- batches commit in order, but a thread may take a seq and append its event a moment later, so
  an event can land one batch after events with larger seqs.  A chunk therefore ends at the
  largest seq committed one batch before the latest (``_chunks``), and ``finish`` checks that
  every committed event was taken (the rank's ``event_count``); if not, it says so and the
  caller analyses the rank from scratch;
- modules are registered as the program goes, each committed before its first event: each
  round reads the rank's modules as they are then.

The thread runs at a lower priority (``NICE``): when the program needs both cores, the
analysis waits rather than the program (docs/performance.md, "Analysis as the run goes").
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import polars as pl
    from sqlalchemy import Connection

    from modtrace.store.engine import Store
    from modtrace.store.roots import StepBasis

# A round waits for this many events committed since the last (the end excepted): rounds of a
# few events would each pay the rounds' fixed cost (tens of ms). A busy program commits more
# than this between two looks (POLL_S), so the looks pace the rounds and the tail left at the
# end is about what two looks see (docs/performance.md, "Analysis as the run goes").
# MODTRACE_FOLLOW_ROWS overrides it (tests cut small runs into many rounds).
MIN_ROUND_ROWS = 5_000
# Rounds' span frames merged into one at a time (``Follower._keep``).
MERGE = 8
# Events read at a time (a round is at most this many).
CHUNK_ROWS = 200_000
# Events handed over (``Follower.committed``) and not yet taken by the thread beyond which they
# are dropped and the rounds read the events back instead: a follow that falls behind (a busy
# machine) holds at most this many rows (~300 bytes each) for it.  A follow that keeps up takes
# them every look (POLL_S: 10k events at 36k a second).  MODTRACE_FOLLOW_HANDED overrides it (a
# test drops them early).
MAX_HANDED = 50_000
# How often, at most, the thread looks at what was committed (it is woken at each batch).
POLL_S = 0.25
# PostgreSQL: the spans the rounds have written at which the follow first refreshes the planner's
# statistics of span_rows, and again each time they double, so that the end needs not (0.27 s
# at 1M spans: store.analysis_store.refresh_statistics).
STATISTICS_SPANS = 10_000
# How long a round's write waits out a transient fault (a lock, a lost connection) before the
# follow gives up and the rank is analysed at the end instead.
RETRY_S = 60.0
# The analysis thread's niceness while the program runs (MODTRACE_ANALYSIS_NICE overrides; 0:
# the writer's priority): the lowest, so that it takes only CPU time nothing else wants.
NICE = 19


def _restore_priority(nice: int) -> None:
    """The analysis thread and polars' workers back at this thread's priority, where the process
    may raise a priority (root, or ``RLIMIT_NICE``); else they stay niced."""
    if not nice or not hasattr(os, "setpriority"):
        return
    try:
        base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return
    for task in tasks:
        try:
            if os.getpriority(os.PRIO_PROCESS, int(task)) == min(base + nice, 19):
                os.setpriority(os.PRIO_PROCESS, int(task), base)
        except (OSError, ValueError):
            pass


def _import_the_end() -> None:
    """Import now, while the program runs, what ``Follower.finish`` needs at the end (tens of ms
    there otherwise, on the user's wait)."""
    import importlib

    # numpy.ma: numpy imports it at the first np.unique (analysis.memory), 30 ms
    for name in ("numpy.ma", "modtrace.analysis.counters", "modtrace.analysis.memory", "modtrace.analysis.step_time",
                 "modtrace.results.materialize", "modtrace.results.span_memory", "modtrace.results.steps",
                 "modtrace.results.tree", "modtrace.store.counters", "modtrace.store.device_times",
                 "modtrace.store.memory", "modtrace.store.roots", "modtrace.store.tree_table"):
        importlib.import_module(name)


class IncompleteFollow(Exception):
    """The analysis that followed the recording did not see every committed event."""


class _Completion:
    """Whether the run completed, known only at its end.  Only the last round reads it (as a
    truth value: ``analysis.nesting.collect_issues``), and that round runs after ``finish`` set it."""

    def __init__(self) -> None:
        self.value = True

    def __bool__(self) -> bool:
        return self.value


class Follower:
    """Analyses rank ``rank`` of run ``run_id`` in ``store`` as its events are committed."""

    def __init__(self, store: Store, run_id: int, rank: int, *, min_rows: int = MIN_ROUND_ROWS,
                 chunk_rows: int = CHUNK_ROWS, nice: int | None = None) -> None:
        from modtrace.store.engine import kept_open

        self.store = kept_open(store)  # its own connections, kept between rounds; disposed by finish
        self.run_id = run_id
        self.rank = rank
        self.min_rows = int(os.environ.get("MODTRACE_FOLLOW_ROWS", min_rows))
        self.chunk_rows = chunk_rows
        self.max_handed = int(os.environ.get("MODTRACE_FOLLOW_HANDED", MAX_HANDED))
        self.nice = int(os.environ.get("MODTRACE_ANALYSIS_NICE", NICE)) if nice is None else nice
        self._cond = threading.Condition()
        self._ended = False
        self._completion = _Completion()
        self._spans: list[pl.DataFrame] = []  # the rounds' spans, merged as they come (``_keep``)
        self._levels: list[int] = []  # how many merges made each of them
        self._read = 0  # events read by the current pass over the rank
        self.rounds = 0
        self.timings: dict[str, float] = {}  # seconds of each part of ``finish``
        self._error: BaseException | None = None
        self._followed: _Followed | None = None
        self._thread = threading.Thread(target=self._run, name="modtrace-analysis", daemon=True)
        # The first pass takes the events of the batches handed to ``committed`` (every batch from
        # the rank's first: ``start`` checks the rank had none committed before); a second pass
        # (``analyze_rank``'s whole look) reads them back.
        self._batches: list[Sequence[tuple[Any, ...]]] = []
        self._handed = 0  # rows in ``_batches``
        self._in_memory = False
        self._passes = 0
        self._spans_written = 0  # by the rounds of the current pass
        self._statistics_at = 0  # spans written when span_rows was last analysed (PostgreSQL)

    def start(self) -> Follower:
        """Start following; call it before the rank's first batch is committed, then ``committed``
        with each batch's events (else each round reads the events back)."""
        from modtrace.store.event_range import committed_head

        self._in_memory = committed_head(self.store, self.run_id, self.rank)[0] == 0
        self._thread.start()
        return self

    def committed(self, events: Sequence[tuple[Any, ...]]) -> None:
        """A batch was committed (``events``: its event rows, ``EVENT_ROW``): there may be a round
        to analyse."""
        with self._cond:
            if self._in_memory and events:
                self._batches.append(events)
                self._handed += len(events)
                if self._handed > self.max_handed:  # the thread is far behind: it reads them back
                    self._batches, self._handed, self._in_memory = [], 0, False
            self._cond.notify()

    def finish(self, complete: bool) -> None:
        """Every event is committed: analyse the tail and store the rank's whole analysis.
        Raises what the thread met, or ``IncompleteFollow``; the caller then analyses the rank
        from its events (``materialize``), which replaces whatever was written here."""
        try:
            self._finish(complete)
        finally:
            self.store.dispose()  # the connections kept for the rounds (``kept_open``)

    def _finish(self, complete: bool) -> None:
        marks = [time.perf_counter()]
        behind = self._read  # events the rounds had read when the program ended
        self._completion.value = complete
        _restore_priority(self.nice)  # nothing runs beside it now: the tail at full speed, where allowed
        with self._cond:
            self._ended = True
            self._cond.notify()
        self._thread.join()
        marks.append(time.perf_counter())
        if self._error is not None:
            raise self._error
        from modtrace.store.event_range import committed_head

        count, _ = committed_head(self.store, self.run_id, self.rank)
        if count != self._read:
            raise IncompleteFollow(f"read {self._read:,} of {count:,} events")
        self._finalize(marks)
        marks.append(time.perf_counter())
        names = ("tail", "spans", "basis", "steps", "counters", "tree")
        self.timings = {n: round(b - a, 4) for n, a, b in zip(names, marks, marks[1:], strict=False)}
        if os.environ.get("MODTRACE_FOLLOW_TIMES"):  # benchmarks/bench_record_return.py reads it
            import sys

            followed = self._followed
            tree = "none" if followed is None or followed.fold is None else followed.fold.broken or "folded"
            steps = "none" if followed is None else followed.broken or "folded"
            events = "handed" if self._in_memory else "read"
            print(f"modtrace: follow: {self.rounds} rounds; events {events}; tail {count - behind:,} events; "
                  f"steps {steps}; tree {tree}; "
                  f"end {self.timings}", file=sys.stderr)

    # -- the thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            if self.nice:
                try:  # this thread only (a Linux thread has a priority of its own)
                    me = threading.get_native_id()
                    os.setpriority(os.PRIO_PROCESS, me, os.getpriority(os.PRIO_PROCESS, me) + self.nice)
                except (OSError, AttributeError):
                    pass
            import polars as pl

            from modtrace.analysis.stream import analyze_rank
            from modtrace.store.analysis_store import append_analysis_round, refresh_statistics
            from modtrace.store.reader import read_modules
            from modtrace.store.retry import call_retrying

            pl.thread_pool_size()  # polars' workers start here, so they run at this thread's priority
            _import_the_end()

            read: list[pl.DataFrame] = []  # the modules as the latest round read them

            def modules() -> pl.DataFrame:
                read[:] = [read_modules(self.store, self.run_id, ranks=[self.rank])]
                return read[0]

            from modtrace.store.tree_table import single_rank_run

            # the tree is stored at a rank's end only for a run of one rank (results.tree)
            self._followed = _Followed(self.store, self.run_id, self.rank,
                                       tree=single_rank_run(self.store, self.run_id, self.rank))
            first = True
            complete = cast(bool, self._completion)
            for part in analyze_rank(self._chunks, modules, complete=complete):
                if part.restart:
                    self._spans.clear()
                    self._levels.clear()
                    self._spans_written = self._statistics_at = 0
                clear = first or part.restart
                # a lock or a lost connection is waited out, as the writer waits out its batches
                call_retrying(partial(append_analysis_round, self.store, self.run_id, self.rank, part.spans,
                                      part.issues, clear=clear), RETRY_S)
                first = False
                self._spans_written += part.spans.height
                if self.store.dialect == "postgresql" and self._spans_written >= max(
                        STATISTICS_SPANS, 2 * self._statistics_at):
                    call_retrying(partial(refresh_statistics, self.store, ("span_rows",)), RETRY_S)
                    self._statistics_at = self._spans_written
                self._keep(part.spans)
                self._followed.add(part.spans, read[0], restart=part.restart)
                self.rounds += 1
        except BaseException as exc:  # reported by finish; the end-of-run analysis takes over
            self._error = exc

    def _keep(self, spans: pl.DataFrame) -> None:
        """Keep a round's spans.  Every ``MERGE`` frames of one level are copied into one of the
        next while the program runs, so the end holds a few frames, not a frame per round (a
        10M-event run has ~700 rounds; copying them into one at the end took 0.3 to 0.5 s)."""
        import polars as pl

        self._spans.append(spans)
        self._levels.append(0)
        while len(self._levels) >= MERGE and len(set(self._levels[-MERGE:])) == 1:
            merged = pl.concat(self._spans[-MERGE:], rechunk=True)
            level = self._levels[-1] + 1
            del self._spans[-MERGE:], self._levels[-MERGE:]
            self._spans.append(merged)
            self._levels.append(level)

    def _chunks(self) -> Iterator[pl.DataFrame]:
        """The rank's committed events from its first, in chunks, waiting for more until the end
        (one pass of ``analyze_rank``; called again for a second pass)."""
        self._passes += 1
        with self._cond:
            handed = self._in_memory and self._passes == 1
            self._in_memory = handed
        return self._handed_chunks() if handed else self._read_chunks()

    def _handed_chunks(self) -> Iterator[pl.DataFrame]:
        """``_chunks`` from the batches' rows handed to ``committed``, as ``_read_chunks`` cuts them
        from the database: a chunk ends at the largest seq of the batches before the latest (a
        seq is taken before its event is appended to a batch, so an event lands at most one batch
        late)."""
        import polars as pl

        from modtrace.store.event_range import events_frame

        self._read = 0
        after: int | None = None  # the last seq yielded
        held: pl.DataFrame | None = None  # rows handed over, not yielded yet
        latest: int | None = None  # largest seq of the batches so far
        settled: int | None = None  # largest seq of the batches before the latest: every smaller seq is in
        last_look = 0.0
        while True:
            ending = self._look_due(last_look)
            if ending is None:
                continue
            with self._cond:
                batches, self._batches, self._handed = self._batches, [], 0
                dropped = not self._in_memory
            if dropped:  # (``MAX_HANDED``) on from the last seq taken, read back
                yield from self._read_chunks(after)
                return
            last_look = time.monotonic()
            for rows in batches:
                top = max(row[0] for row in rows)
                settled, latest = latest, top if latest is None else max(latest, top)
            if batches:
                frame = events_frame([row for rows in batches for row in rows], self.run_id, self.rank)
                held = frame if held is None else pl.concat([held, frame])
            upto = latest if ending else settled
            if self._nothing_due(upto, after, ending):
                if ending:
                    return
                continue
            assert held is not None and upto is not None  # rows came with every seq seen
            ready = held.filter(pl.col("seq") <= upto).sort("seq")
            held = held.filter(pl.col("seq") > upto)
            for start in range(0, ready.height, self.chunk_rows):
                frame = ready.slice(start, self.chunk_rows)
                self._read += frame.height
                after = int(frame["seq"][-1])
                yield frame
            if ending:
                return

    def _look_due(self, last_look: float) -> bool | None:
        """Wait for the next look at what was committed (``POLL_S`` after ``last_look``, or at once
        at the end): whether the run has ended then; None when woken before it (a batch came)."""
        with self._cond:
            if not self._ended:
                self._cond.wait(max(0.0, POLL_S - (time.monotonic() - last_look)))
            ending = self._ended
        return None if not ending and time.monotonic() - last_look < POLL_S else ending

    def _nothing_due(self, upto: int | None, after: int | None, ending: bool) -> bool:
        """Whether a look that may take every seq up to ``upto`` finds no round to make: none past
        ``after`` (the last seq taken), or, before the end, fewer than ``min_rows`` of them."""
        return upto is None or (after is not None and upto <= after) or (
            not ending and upto - (-1 if after is None else after) < self.min_rows)

    def _read_chunks(self, after: int | None = None) -> Iterator[pl.DataFrame]:
        """``_chunks`` read from the database, a look at what was committed at most every ``POLL_S``
        (from the first event, or on after ``after``: the pass goes on from the rows handed over)."""
        from modtrace.store.event_range import committed_head, iter_events_between
        from modtrace.store.retry import call_retrying

        if after is None:
            self._read = 0
        last_count = -1
        latest: int | None = None  # largest seq as last seen
        settled: int | None = None  # largest seq as seen one batch before: every smaller seq is in
        last_look = 0.0
        while True:
            ending = self._look_due(last_look)
            if ending is None:
                continue
            last_look = time.monotonic()
            count, head = call_retrying(lambda: committed_head(self.store, self.run_id, self.rank), RETRY_S)
            if count != last_count:
                settled, latest, last_count = latest, head, count
            upto = head if ending else settled
            if self._nothing_due(upto, after, ending):
                if ending:
                    return
                continue
            assert upto is not None
            for frame in iter_events_between(self.store, self.run_id, self.rank, after, upto, self.chunk_rows):
                self._read += frame.height
                after = int(frame["seq"][-1])
                yield frame
            if ending:
                return

    # -- the end --------------------------------------------------------------------

    def _finalize(self, marks: list[float]) -> None:
        """What ``materialize`` stores after the rounds, from the spans kept: steps (with the
        analysis state, one transaction), device times, counters, the tree."""
        import polars as pl

        from modtrace.analysis import Analysis
        from modtrace.analysis.spans import name_spans
        from modtrace.results.materialize import _store_device_times, _with_device_times
        from modtrace.results.steps import step_rows
        from modtrace.results.tree import store_tree, write_tree
        from modtrace.store.analysis_store import write_analysis_rounds
        from modtrace.store.counters import read_counters
        from modtrace.store.device_times import has_device_events
        from modtrace.store.reader import read_devices, read_modules
        from modtrace.store.roots import read_step_basis

        store, run_id, rank = self.store, self.run_id, self.rank
        # no copy at the end: a few frames (``_keep``), as chunks of one
        spans = pl.concat(self._spans, rechunk=False) if self._spans else None
        marks.append(time.perf_counter())
        followed = self._followed
        if followed is not None:
            followed.start_tree()
        single = followed is not None and followed.fold is not None
        basis = (followed.basis() if single else None) or read_step_basis(store, run_id)  # type: ignore[union-attr]
        folded_steps = followed.step_rows(basis) if followed is not None else None

        def steps(conn: Connection) -> tuple[pl.DataFrame, pl.DataFrame] | None:
            if spans is None or spans.height == 0:
                return None
            return folded_steps or step_rows(run_id, basis, spans)

        marks.append(time.perf_counter())
        write_analysis_rounds(store, run_id, [], rank=rank, from_events=True, steps=steps, appended=True,
                              span_statistics=2 * self._statistics_at < self._spans_written)
        marks.append(time.perf_counter())
        _store_device_times(store, run_id, [rank])
        calls, ranges = read_counters(store, run_id, rank)
        counted = _entered_in_ranges(ranges, spans)  # all counters and memory look at
        _store_counters_of(store, run_id, rank, counted, calls, ranges)
        # every relation materialize derives after the rounds is derived here too (the tests
        # compare each table keyed by run with a fresh analysis: tests/recording/test_follow.py)
        from modtrace.results.span_memory import SPAN_COLUMNS as SPAN_MEMORY_COLUMNS
        from modtrace.results.span_memory import store_memory

        if counted is not None:  # the ranges' steps are read by key from the step starts just stored
            store_memory(store, run_id, [rank], counted.select(SPAN_MEMORY_COLUMNS))
        marks.append(time.perf_counter())
        if spans is None or spans.height == 0:
            return
        folded = followed.tree(basis) if followed is not None else None
        if folded is not None and not has_device_events(store, run_id):
            write_tree(store, run_id, folded, rank=rank)
            return
        named = name_spans(spans, read_modules(store, run_id, ranks=[rank]),
                           read_devices(store, run_id, ranks=[rank])).sort("rank", "span_id")
        named = _with_device_times(store, run_id, [rank], Analysis(named, named.clear())).spans
        store_tree(store, run_id, named, rank=rank)


class _Followed:
    """The rank's steps (``analysis.step_fold.StepFold``) and, for a run of one rank, its default
    tree (``analysis.tree_fold.TreeFold``) folded round by round, each round's spans keyed by
    step under the step rule and root calls as they stand then; at the end they stand only if
    the run's rule and root calls turned out the same (else they are computed from all the
    spans, as ``materialize`` does)."""

    def __init__(self, store: Store, run_id: int, rank: int, *, tree: bool) -> None:
        from modtrace.analysis.step_fold import StepFold
        from modtrace.analysis.tree_fold import TreeFold

        self.store, self.run_id, self.rank = store, run_id, rank
        self.fold = TreeFold() if tree else None
        self.steps = StepFold()
        self.broken: str | None = None  # why the keys could not be made, if so
        self.rule: str | None = None
        self.roots: list[tuple[int, int, int | None, str | None]] = []
        self.upto: int | None = None  # roots are read up to this seq
        self._merging: threading.Thread | None = None  # ``start_tree``'s
        self._nodes: pl.DataFrame | None = None

    def give_up(self, why: str) -> None:
        if self.broken is None:
            self.broken = why
        if self.fold is not None:
            self.fold.give_up(why)

    def add(self, spans: pl.DataFrame, modules: pl.DataFrame, *, restart: bool) -> None:
        """Fold in a round's spans; ``modules``: the rank's modules as the round read them."""
        if restart:
            self.give_up("the rank was analysed again in one piece")
        if self.broken is not None or spans.height == 0:
            return
        import polars as pl

        from modtrace.analysis.spans import name_spans
        from modtrace.analysis.step_fold import FOLD_COLUMNS
        from modtrace.analysis.steps import ROOT_SCHEMA, step_keys
        from modtrace.core.step_rules import resolve_rule
        from modtrace.store.reader import read_devices
        from modtrace.store.roots import read_roots_between, step_rule_so_far

        try:
            rule = resolve_rule(None, *step_rule_so_far(self.store, self.run_id, self.rank))
            if self.rule is not None and rule != self.rule:
                self.give_up(f"the step rule went from {self.rule} to {rule}")
                return
            self.rule = rule
            # every root call up to the round's last span is committed (with its enter event)
            bound = int(spans.get_column("span_id").max())  # type: ignore[arg-type]
            if self.upto is None or bound > self.upto:
                self.roots += read_roots_between(self.store, self.run_id, self.rank, self.upto, bound)
                self.upto = bound
            roots = pl.DataFrame(self.roots, schema=ROOT_SCHEMA, orient="row")
            key = step_keys(spans, roots, rule).alias("_key")
            self.steps.add(spans.with_columns(key).select(FOLD_COLUMNS))
            if self.fold is not None and self.fold.broken is None:
                named = name_spans(spans, modules, read_devices(self.store, self.run_id, ranks=[self.rank]))
                self.fold.add(named.with_columns(key))
        except Exception as exc:  # steps and tree are then computed at the end, from all the spans
            self.give_up(f"{type(exc).__name__}: {exc}")

    def basis(self) -> StepBasis | None:
        """The run's ``StepBasis`` (it has this rank only) from the root calls the rounds read and
        those after them: what ``read_step_basis`` reads, without reading every root call again
        (a long run's thousands, each with its enter event); None where the rounds read none."""
        from modtrace.store.roots import StepBasis, read_roots_between, step_rule_so_far

        if self.upto is None:
            return None
        step_on, made = step_rule_so_far(self.store, self.run_id, self.rank)
        return StepBasis(step_on, made, self.roots + read_roots_between(self.store, self.run_id, self.rank,
                                                                          self.upto, 1 << 62))

    def _stands(self, basis: StepBasis) -> str | None:
        """The run's rule, where the rounds keyed their spans under it and under its root calls."""
        from modtrace.core.step_rules import StepRuleError, resolve_rule

        if self.broken is not None:
            return None
        try:
            rule = resolve_rule(None, basis.step_on, basis.made_steps)
        except StepRuleError:
            return None
        roots = [r for r in basis.roots if r[0] == self.rank]
        if rule != self.rule or roots != self.roots or (rule == "root" and not roots):
            return None
        return rule

    def step_rows(self, basis: StepBasis) -> tuple[pl.DataFrame, pl.DataFrame] | None:
        """(step_rows, step_starts) as ``results.steps.step_rows`` gives them, or None where the
        fold does not stand for them."""
        from modtrace.results.steps import stored_step_rows

        rule = self._stands(basis)
        folded = None if rule is None else self.steps.table(rule)
        return None if rule is None or folded is None else stored_step_rows(self.run_id, rule, *folded)

    def start_tree(self) -> None:
        """Merge the folded tree (``TreeFold.tree``) in a thread of its own, beside the rest of the
        end: its medians over every (call path, step) sum are the end's largest part on a long run
        (0.3-0.4 s at 10M events), polars work outside Python's lock, and the program has ended:
        a core is free."""
        fold = self.fold
        if fold is None or fold.broken is not None:
            return

        def merge() -> None:
            try:
                self._nodes = fold.tree()
            except Exception as exc:  # the tree is then computed from all the spans
                fold.give_up(f"{type(exc).__name__}: {exc}")

        self._merging = threading.Thread(target=merge, name="modtrace-tree", daemon=True)
        self._merging.start()

    def tree(self, basis: StepBasis) -> tuple[str, dict[str, list[tuple[Any, ...]]]] | None:
        """(the run's rule, {"host": node rows}) as ``results.tree.tree_rows`` gives it, or None
        where the fold does not stand for it."""
        from modtrace.results.tree import _node_rows

        if self._merging is not None:
            self._merging.join()
        rule = self._stands(basis)
        if rule is None or self.fold is None:
            return None
        nodes = self._nodes if self._merging is not None else self.fold.tree()
        return None if nodes is None else (rule, {"host": _node_rows(nodes)})


def _entered_in_ranges(ranges: pl.DataFrame, spans: pl.DataFrame | None) -> pl.DataFrame | None:
    """The spans entered in the rank's counted ``ranges``: the only ones ``analysis.counters.span_counters``
    and ``analysis.memory.span_memory`` keep, picked before they do (a counted step is a
    small part of a long run)."""
    if spans is None:
        return None
    import polars as pl

    from modtrace.store.counters import range_bounds

    if ranges.height == 0:
        return spans.clear()
    inside = [pl.col("span_id").is_between(first, last) for first, last in range_bounds(ranges)]
    return spans.filter(pl.any_horizontal(inside))


def _store_counters_of(store: Store, run_id: int, rank: int, spans: pl.DataFrame | None, calls: pl.DataFrame,
                       ranges: pl.DataFrame) -> None:
    """``materialize``'s span counter rows of the rank, from ``spans`` (its span rows) rather
    than read back; ``calls`` and ``ranges``: its counters (``store.counters.read_counters``)."""
    from modtrace.store.counters import has_counters, write_span_counters

    if spans is None or not has_counters(store, run_id):
        return
    from modtrace.analysis.counters import span_counters

    needed = ("rank", "span_id", "parent_span_id", "depth", "call_id", "phase", "graph_task")
    write_span_counters(store, run_id, rank, span_counters(spans.select(needed), calls, ranges))
