"""The public Python API: a recording database as polars frames.

For notebooks and scripts, and the only thing the CLI calls::

    import modtrace

    with modtrace.open("modtrace.db") as db:
        print(db.runs())                       # one row per run, newest first
        spans = db.spans("@")                  # the newest run's spans frame
        issues = db.issues("@")                # its nesting issues
        tree = db.tree("@", phase="forward")   # per-module timings
        result = db.diff("base", "@")          # a typed DiffResult

A run is named as on the command line: a name, an id, ``@`` (the newest),
``@~N``, ``id:N``, ``name:X``; or a ``Run`` returned by ``run()``.  Spans and
issues are the stored analysis when the run has one, otherwise computed
from its events (nothing is written); ``analyze`` stores them.  Frames
follow the contracts in ``modtrace.core.contracts``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from modtrace.api._admin import (
    check_schema,
    current_revision,
    query,
    query_library,
    resolve_query,
    upgrade,
)
from modtrace.api._functions import (
    diff_calls,
    is_database_file,
    like_with_like,
    like_with_like_calls,
    no_common_step,
    preload_diff,
    preload_store,
    step_table,
)
from modtrace.api._steps import Stepped
from modtrace.core.errors import UsageError

if TYPE_CHECKING:
    import polars as pl

    from modtrace.analysis import Analysis
    from modtrace.analysis.diff import DiffOptions, DiffResult, RunCalls
    from modtrace.store.engine import Store

__all__ = [
    "AnalyzeSummary", "Database", "DiffOptions", "DiffResult", "Run", "RunCalls", "Stepped", "check_schema",
    "current_revision", "diff_calls", "is_database_file", "like_with_like", "like_with_like_calls", "no_common_step", "open", "preload_diff",
    "preload_store", "query", "query_library", "resolve_query", "step_table", "upgrade",
]


def __getattr__(name: str) -> Any:
    # The diff's option and result types, without importing polars with this module.
    if name in ("DiffOptions", "DiffResult", "RunCalls"):
        import modtrace.analysis.diff

        return getattr(modtrace.analysis.diff, name)
    raise AttributeError(f"module 'modtrace.api' has no attribute {name!r}")


@dataclass(frozen=True)
class Run:
    """A resolved run reference."""

    id: int
    name: str


@dataclass(frozen=True)
class AnalyzeSummary:
    """What ``Database.analyze`` stored."""

    run: Run
    spans: int
    issues: pl.DataFrame


RunLike = str | int | Run


def open(db: str | None = None) -> Database:  # noqa: A001 -- modtrace.open(db), like sqlite3.connect
    """Open a recording database for reading: a file path or SQLAlchemy URL;
    default ``$MODTRACE_DB``, else ``./modtrace.db``.  Nothing is created."""
    from modtrace.store.engine import open_store

    return Database(open_store(db))


class Database:
    """An open recording database.  Close it (or use ``with``) when done."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._analyses: dict[int, Analysis] = {}

    @property
    def label(self) -> str:
        """The database as messages name it (a path, or a URL without password)."""
        return self._store.label

    def close(self) -> None:
        self._store.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- runs ----------------------------------------------------------------------

    def run(self, ref: RunLike) -> Run:
        """Resolve a run reference (raises ``RunNotFound``)."""
        from modtrace.store.runs import resolve_run

        if isinstance(ref, Run):
            return ref
        found = resolve_run(self._store, str(ref) if isinstance(ref, str) else f"id:{int(ref)}")
        return Run(found.id, found.name)

    def run_list(self, limit: int | None = None) -> list[dict[str, Any]]:
        """Runs newest first, as dicts (id, name, status, started_at, ended_at, duration_s, events, steps,
        step_on, step_rule, ranks...): ``steps`` counts the steps under the run's own rule (``step_rule``,
        resolved from ``step_on``, the rule it was recorded with)."""
        from modtrace.api._steps import with_steps
        from modtrace.store.runs import list_runs

        return with_steps(self._store, list_runs(self._store, limit))

    def runs(self, limit: int | None = None) -> pl.DataFrame:
        """``run_list`` as a frame."""
        import polars as pl

        columns = ["id", "name", "status", "started_at", "ended_at", "duration_s", "events", "steps", "step_on",
                   "step_rule", "ranks"]
        rows = self.run_list(limit)
        return pl.DataFrame([[r[c] for c in columns] for r in rows], schema=columns, orient="row")

    def details(self, run: RunLike) -> dict[str, Any]:
        """The run's metadata, status and counts (what ``modtrace show`` prints); steps under its own rule."""
        from modtrace.api._steps import details_with_steps
        from modtrace.store.runs import run_details

        ref = self.run(run)
        return details_with_steps(self._store, ref.id, run_details(self._store, ref.id))

    def ranks(self, run: RunLike) -> list[int]:
        """The ranks that wrote events or lookups for the run, ascending."""
        from modtrace.store.reader import read_ranks

        return read_ranks(self._store, self.run(run).id)

    def anchors(self, run: RunLike) -> dict[int, int]:
        """rank -> wall-clock nanoseconds at that rank's ``ts_ns = 0``."""
        from modtrace.store.runs import read_anchors

        return read_anchors(self._store, self.run(run).id)

    def thread_names(self, run: RunLike) -> dict[tuple[int, int], str | None]:
        """(rank, thread_id) -> thread name."""
        from modtrace.store.runs import read_thread_names

        return read_thread_names(self._store, self.run(run).id)

    # -- frames --------------------------------------------------------------------

    def events(self, run: RunLike, *, rank: int | None = None) -> pl.DataFrame:
        """The run's events (``contracts.EVENT_FRAME``: codes), sorted by (rank, seq)."""
        from modtrace.store.reader import read_events

        return read_events(self._store, self.run(run).id, ranks=None if rank is None else [rank])

    def event_log(self, run: RunLike) -> Iterator[pl.DataFrame]:
        """The run's events with names instead of codes (as the ``event_log`` view) and
        ``wall_ns``, in chunks, rank by rank in seq order."""
        from modtrace.api._tables import event_log

        ref = self.run(run)
        return event_log(self._store, ref.id, self.anchors(ref))

    def analysis(self, run: RunLike) -> Analysis:
        """The run's spans and issues: stored when analysed, else computed (and kept for this object)."""
        from modtrace.results.materialize import load

        ref = self.run(run)
        if ref.id not in self._analyses:
            self._analyses[ref.id] = load(self._store, ref.id)
        return self._analyses[ref.id]

    def has_analysis(self, run: RunLike) -> bool:
        """Whether the run's spans and issues are stored (``analyze``, or the recorder, wrote them)."""
        from modtrace.store.analysis_store import has_analysis

        return has_analysis(self._store, self.run(run).id)

    def spans(self, run: RunLike) -> pl.DataFrame:
        """The run's spans frame (``contracts.SPAN_FRAME``; with ``contracts.DEVICE_SPAN_COLUMNS``
        when the run has device times)."""
        return self.analysis(run).spans

    def spans_with(self, run: RunLike, columns: tuple[str, ...]) -> pl.DataFrame:
        """The run's spans frame with at least ``columns`` filled, the others null when only those
        were read (a cheaper read of a stored analysis); without the device columns."""
        return self.start_spans_with(run, columns)()

    def start_spans_with(self, run: RunLike, columns: tuple[str, ...]) -> Callable[[], pl.DataFrame]:
        """``spans_with`` begun: a stored analysis is read in threads from now on, while the caller
        does other work; calling the result gives the frame."""
        from modtrace.results.materialize import start_spans

        ref = self.run(run)
        if ref.id in self._analyses:
            held = self._analyses[ref.id].spans
            return lambda: held
        return start_spans(self._store, ref.id, columns)

    def clock(self, run: RunLike, clock: str | None = None) -> str:
        """The clock RUN's times are read on: ``clock`` (host | device, checked: a usage error for
        device on a run without device times); None: device when the run has device times."""
        from modtrace.api._clock import resolve_clock

        ref = self.run(run)
        return resolve_clock(self._store, ref.id, ref.name, clock)

    def spans_on(self, run: RunLike, clock: str | None = None) -> tuple[pl.DataFrame, str]:
        """(the run's spans with start, end, duration and self time on the clock, that clock):
        ``analysis.device.on_clock`` of ``spans`` under ``clock(run, clock)``."""
        from modtrace.analysis.device import on_clock

        chosen = self.clock(run, clock)
        return on_clock(self.spans(run), chosen), chosen

    def issues(self, run: RunLike) -> pl.DataFrame:
        """The run's nesting issues frame (``contracts.ISSUE_FRAME``), ``step`` under the run's own step
        rule as ``runs`` counts its steps (an issue's event belongs to the step of the span it is in);
        stored ones are read without the spans."""
        from modtrace.results.materialize import load_issues

        ref = self.run(run)
        issues = self._analyses[ref.id].issues if ref.id in self._analyses else load_issues(self._store, ref.id)
        if issues.height == 0:
            return issues
        try:
            stepped = self.steps(ref, issues.rename({"seq": "span_id"}))
        except UsageError:  # a rule its recording cannot follow: the recorded steps
            return issues
        return stepped.frame.rename({"span_id": "seq"})

    def issue_summary(self, run: RunLike) -> pl.DataFrame:
        """The run's issues as ``modtrace check`` lists them: every error and warning, and one row per
        (kind, module, phase) of the info issues with ``count`` (``analysis.nesting.summarize_issues``)."""
        from modtrace.analysis.nesting import summarize_issues

        return summarize_issues(self.issues(run))

    def spans_table(self, run: RunLike, clock: str = "host") -> pl.DataFrame:
        """Spans with names as plain strings, ``unclosed`` for a span never exited, and ``wall_start_ns``;
        times on ``clock`` (see ``spans_on``)."""
        from modtrace.api._tables import spans_table

        return spans_table(self.spans_on(run, clock)[0], self.anchors(run))

    def analyze(self, run: RunLike) -> AnalyzeSummary:
        """Rebuild and store the run's spans and nesting issues (idempotent)."""
        from modtrace.results.materialize import materialize
        from modtrace.store.analysis_store import count_span_rows

        ref = self.run(run)
        self._analyses.pop(ref.id, None)
        result = materialize(self._store, ref.id)
        return AnalyzeSummary(ref, count_span_rows(self._store, ref.id), result.issues)

    def steps(
        self, run: RunLike, frame: pl.DataFrame | None = None, *, step_on: str | None = None,
        ranks: Sequence[int] | None = None,
    ) -> Stepped:
        """``frame`` (default: the run's spans; or any frame of its rows with ``rank``, ``span_id``
        and ``step``) with its steps under ``step_on`` (auto | optimizer | root | manual; None: the
        rule the run was recorded with), and each step's kind.  ``ranks``: the ranks ``frame`` holds."""
        from modtrace.api._steps import restep

        ref = self.run(run)
        return restep(self._store, ref.id, ref.name, self.spans(ref) if frame is None else frame, step_on, ranks)

    def root_call_counts(self, runs: Sequence[RunLike] | None = None) -> dict[tuple[int, int], int]:
        """Root calls recorded per (run id, rank), of ``runs`` (default: every run)."""
        from modtrace.store.roots import root_call_counts

        return root_call_counts(self._store, None if runs is None else [self.run(r).id for r in runs])

    # -- derived views -------------------------------------------------------------

    def tree(
        self, run: RunLike, *, phase: str | None = None, step: int | None = None, rank: int | None = None,
        max_depth: int | None = None, min_percent: float | None = None, step_on: str | None = None,
        step_kind: str | None = None, clock: str | None = None,
    ) -> pl.DataFrame:
        """The module call tree with per-step median and total times and % of step, on ``clock``
        (see ``clock``: by default device time when the run has it), as a nodes frame
        (``contracts.TREE_NODE_FRAME``) in pre-order.

        Steps follow ``step_on`` (see ``steps``); ``step_kind`` keeps the steps
        of one kind (``-``: steps without a root call; None or ``all``: every
        step).  ``phase`` (forward | backward | recompute | backward_call), ``step`` and
        ``rank`` select spans; ``max_depth`` and ``min_percent`` hide nodes.
        The whole run's tree (no ``step``, ``rank`` or ``step_kind``) is read
        from the stored one when the run has it (``api._tree``)."""
        from modtrace.api._tree import TreeOptions, nodes_from_spans, stored_nodes
        from modtrace.results.tree import nodes_frame

        opts = TreeOptions(phase, step, rank, max_depth, min_percent, step_on, step_kind)
        opts.check()
        ref = self.run(run)
        chosen = self.clock(ref, clock)
        stored = stored_nodes(self, ref, chosen, opts)
        return nodes_frame(stored) if stored is not None else nodes_from_spans(self, ref, chosen, opts)

    def tree_rows(
        self, run: RunLike, *, phase: str | None = None, step: int | None = None, rank: int | None = None,
        max_depth: int | None = None, min_percent: float | None = None, step_on: str | None = None,
        step_kind: str | None = None, clock: str | None = None,
    ) -> list[dict[str, Any]]:
        """``tree`` as plain dicts, one per node in pre-order (what the tree renderers take); a
        stored tree is read and filtered without polars."""
        from modtrace.api._tree import TreeOptions, nodes_from_spans, stored_nodes

        opts = TreeOptions(phase, step, rank, max_depth, min_percent, step_on, step_kind)
        opts.check()
        ref = self.run(run)
        chosen = self.clock(ref, clock)
        stored = stored_nodes(self, ref, chosen, opts)
        return stored if stored is not None else nodes_from_spans(self, ref, chosen, opts).to_dicts()

    def diff(
        self, base: RunLike, cand: RunLike, options: DiffOptions | None = None, *,
        cand_db: Database | None = None, rank: int | None = None, step_on: str | None = None,
        step_kind: str | None = None, clock: str | None = None,
    ) -> DiffResult:
        """Compare run ``cand`` (in ``cand_db``, default this database) against ``base``: steps under
        ``step_on``, of ``step_kind`` (None: the kind most steps of both share; ``all``: every step),
        both on one clock (``diff_clock``)."""
        from modtrace.analysis.diff import diff_runs

        chosen = self.diff_clock(base, cand, cand_db=cand_db, clock=clock)
        base_side = self.diff_side(base, rank, step_on, clock=chosen)
        cand_side = (cand_db or self).diff_side(cand, rank, step_on, clock=chosen)
        return diff_runs(*like_with_like_calls(base_side, cand_side, step_kind), options)

    def diff_spans(
        self, base_spans: pl.DataFrame, cand_spans: pl.DataFrame, options: DiffOptions | None = None
    ) -> DiffResult:
        """Compare two spans frames (e.g. of two runs in different databases, or filtered)."""
        from modtrace.analysis.diff import diff_spans

        return diff_spans(base_spans, cand_spans, options)

    def diff_clock(self, base: RunLike, cand: RunLike, *, cand_db: Database | None = None,
                   clock: str | None = None) -> str:
        """The one clock both sides of a diff are read on: ``clock`` (checked against both runs);
        None: device when both runs have device times, else host."""
        from modtrace.api._clock import common_clock
        from modtrace.api._diff import split_ref

        other = cand_db or self
        b, c = split_ref(self, base)[0], split_ref(other, cand)[0]
        return common_clock([(self._store, b.id, b.name), (other._store, c.id, c.name)], clock)

    def diff_side(
        self, ref: RunLike, rank: int | None = None, step_on: str | None = None, *, clock: str = "host"
    ) -> tuple[RunCalls, dict[str, Any]]:
        """One side of a diff: (``RunCalls``, description), steps under ``step_on``, times on
        ``clock`` (pick it for both sides with ``diff_clock``).  ``ref`` may be ``RUN:RANK``.  Pass
        two sides through ``like_with_like_calls`` before ``diff_calls``."""
        from modtrace.api._diff import load_side

        return load_side(self, self._store, ref, rank, step_on, clock)
