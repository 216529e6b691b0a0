"""The public Python API: a recording database as polars frames.

For notebooks, scripts and CI jobs::

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

``Database`` is the product: fourteen members, each documented with an
example.  Module-level functions cover the database itself (``upgrade``,
``current_revision``, ``check_schema``) and read-only SQL (``query``,
``query_library``, ``resolve_query``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
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
from modtrace.api._runs import Run, RunLike

if TYPE_CHECKING:
    import polars as pl

    from modtrace.analysis import Analysis
    from modtrace.analysis.diff import (
        Check,
        DiffOptions,
        DiffResult,
        DiffSummary,
        ModuleVerdict,
        RunCalls,
        StepVerdict,
    )
    from modtrace.analysis.memory_plan import MemoryReport
    from modtrace.analysis.stragglers import Stragglers
    from modtrace.api._steps import Stepped
    from modtrace.api._tree import TreeOptions
    from modtrace.store.deletion import DeletedRun
    from modtrace.store.engine import Store
    from modtrace.store.runs import RunFilter

__all__ = [
    "AnalyzeSummary", "BudgetPlan", "Check", "Database", "DiffOptions", "DiffResult", "DiffSummary", "MemoryReport",
    "ModuleMemory", "ModuleVerdict", "Run", "RunLike", "StepPeak", "StepVerdict", "WhatIf", "check_schema",
    "current_revision", "open", "query", "query_library", "resolve_query", "upgrade",
]


_DIFF_TYPES = ("Check", "DiffOptions", "DiffResult", "DiffSummary", "ModuleVerdict", "StepVerdict")
_MEMORY_TYPES = ("BudgetPlan", "MemoryReport", "ModuleMemory", "StepPeak", "WhatIf")


def __getattr__(name: str) -> Any:
    # The diff's and memory's result types, without importing polars with this module.
    if name in _DIFF_TYPES:
        import modtrace.analysis.diff

        return getattr(modtrace.analysis.diff, name)
    if name in _MEMORY_TYPES:
        import modtrace.analysis.memory_plan

        return getattr(modtrace.analysis.memory_plan, name)
    raise AttributeError(f"module 'modtrace.api' has no attribute {name!r}")


@dataclass(frozen=True)
class AnalyzeSummary:
    """What ``Database.analyze`` stored."""

    run: Run
    spans: int
    issues: pl.DataFrame




def open(db: str | None = None) -> Database:  # noqa: A001 -- modtrace.open(db), like sqlite3.connect
    """Open a recording database for reading.

    Parameters
    ----------
    db
        A file path or SQLAlchemy URL; default ``$MODTRACE_DB``, else ``./modtrace.db``.
        Nothing is created: a missing file is an error.

    Examples
    --------
    >>> import modtrace
    >>> with modtrace.open("modtrace.db") as db:  # doctest: +SKIP
    ...     db.runs().select("name", "status", "steps")
    """
    from modtrace.store.engine import open_store

    return Database(open_store(db))


class Database:
    """An open recording database: runs, their events, spans, issues, steps and trees as polars
    frames, and comparisons of runs.  Close it (or use ``with``) when done.

    Examples
    --------
    >>> with modtrace.open("modtrace.db") as db:  # doctest: +SKIP
    ...     db.tree("@", phase="forward", max_depth=2)
    """

    def __init__(self, store: Store) -> None:
        self._store = store
        self._analyses: dict[int, Analysis] = {}

    @property
    def label(self) -> str:
        """The database as messages name it: a path, or a URL without its password."""
        return self._store.label

    def close(self) -> None:
        """Release the database's connections."""
        self._store.dispose()

    def __enter__(self) -> Database:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    # -- runs ----------------------------------------------------------------------

    def runs(self, *, limit: int | None = None, tags: Mapping[str, str] | None = None, status: str | None = None,
             older_than: timedelta | str | None = None) -> pl.DataFrame:
        """The runs, newest first: one row each.

        Parameters
        ----------
        limit
            At most this many runs (the newest that match).
        tags
            Only runs with every one of these tags (key and value, as text).
        status
            Only runs of this status as shown: ``running``, ``completed``, ``failed``,
            ``interrupted`` or ``incomplete`` (left running by a process that is gone).
        older_than
            Only runs started longer ago than this: a ``timedelta`` or text such as ``30d``,
            ``12h``, ``2w``.

        Returns
        -------
        polars.DataFrame
            ``id, name, status, started_at, ended_at, duration_s, events, steps, step_on, step_rule,
            ranks, analysis, tags``: ``steps`` counts the steps under the run's own rule
            (``step_rule``, resolved from ``step_on``, the rule it was recorded with); ``analysis``
            says whether its spans and issues are stored (``none``, ``partial``, ``stale``,
            ``stored``); ``tags`` is a list of ``{key, value}``, sorted by key.

        Examples
        --------
        >>> db.runs(limit=5).select("name", "status", "steps")  # doctest: +SKIP
        >>> db.runs(tags={"branch": "main"}, status="completed")  # doctest: +SKIP
        """
        import polars as pl

        from modtrace.api._runs import run_filter

        columns = ["id", "name", "status", "started_at", "ended_at", "duration_s", "events", "steps", "step_on",
                   "step_rule", "ranks", "analysis"]
        rows = self._run_rows(limit, run_filter(tags, status, older_than))
        frame = pl.DataFrame([[r.get(c) for c in columns] for r in rows], schema=columns, orient="row")
        tag_type = pl.List(pl.Struct({"key": pl.String, "value": pl.String}))
        tags_column = [[{"key": k, "value": str(v)} for k, v in sorted(r["tags"].items())] for r in rows]
        return frame.with_columns(pl.Series("tags", tags_column, dtype=tag_type))

    def run(self, ref: RunLike) -> Run:
        """A run by reference, with its details.

        Parameters
        ----------
        ref
            A name, an id, ``@`` (the newest run), ``@~N``, ``id:N``, ``name:X``, or a ``Run``.

        Returns
        -------
        Run
            ``id``, ``name`` and ``details`` (what ``modtrace show`` prints: status, times,
            counts, steps under the run's own rule, tags, ranks).  Raises ``RunNotFound`` for an
            unknown reference (with the close names it knows).

        Examples
        --------
        >>> db.run("@").details["status"]  # doctest: +SKIP
        'completed'
        """
        from modtrace.api._steps import details_with_steps
        from modtrace.store.runs import run_details

        found = self._ref(ref)
        return Run(found.id, found.name, details_with_steps(self._store, found.id, run_details(self._store, found.id)))

    # -- frames --------------------------------------------------------------------

    def events(self, run: RunLike, *, rank: int | None = None, named: bool = False) -> pl.DataFrame:
        """The run's enter and exit rows, sorted by (rank, seq).

        Parameters
        ----------
        run
            The run (see ``run``).
        rank
            Only this rank's rows.
        named
            Names instead of codes, as the ``event_log`` SQL view has them (``fqn``, ``kind``,
            ``phase``, ``status``, ``device`` as text) with ``wall_ns``, the wall-clock time.

        Returns
        -------
        polars.DataFrame
            ``contracts.EVENT_FRAME`` (codes), or the ``event_log`` columns when ``named``.

        Examples
        --------
        >>> db.events("@", named=True).filter(pl.col("phase") == "backward")  # doctest: +SKIP
        """
        if named:
            import polars as pl

            frame = pl.concat(list(self._event_log(self._ref(run))), how="vertical")
            return frame if rank is None else frame.filter(pl.col("rank") == rank)
        from modtrace.store.reader import read_events

        return read_events(self._store, self._ref(run).id, ranks=None if rank is None else [rank])

    def spans(self, run: RunLike, *, clock: str | None = "host", named: bool = False) -> pl.DataFrame:
        """The run's spans: one per module call and phase, with parent, depth, inclusive and self
        time; stored when the run was analysed, else computed from its events (nothing written).

        Parameters
        ----------
        run
            The run (see ``run``).
        clock
            ``host`` (when Python ran the hooks), ``device`` (when the GPU ran the module's work:
            a usage error on a run without device times), or None: device when the run has it.
        named
            Names as plain strings, ``unclosed`` for a span never exited, and ``wall_start_ns``
            (as the ``spans`` SQL view and the spans export give them).

        Returns
        -------
        polars.DataFrame
            ``contracts.SPAN_FRAME`` (with ``contracts.DEVICE_SPAN_COLUMNS`` when the run has device
            times), then the work counters (Int64, as the ``spans`` SQL view has them; null where
            the span's step was not counted, docs/schema.md "Work counters"): ``flops``,
            ``flops_self``, ``bytes``, ``bytes_self``, ``ops``, ``ops_self``, ``unknown_ops``,
            ``unknown_ops_self``; then memory (Int64, null likewise; docs/memory.md):
            ``kept_mem_bytes``, ``kept_mem_bytes_self``, ``peak_mem_bytes``,
            ``peak_mem_bytes_self``; times on ``clock``.

        Examples
        --------
        >>> db.spans("@").sort("self_ns", descending=True).head(10)  # doctest: +SKIP
        >>> db.spans("@").filter(pl.col("flops").is_not_null())  # the counted steps' spans  # doctest: +SKIP
        """
        import polars as pl

        from modtrace.analysis.counters import SPAN_COUNTER_COLUMNS
        from modtrace.results.counters import span_counts

        ref = self._ref(run)
        spans = self._spans_on(ref, clock)
        counts = span_counts(self._store, ref.id, spans)
        if counts is None:
            spans = spans.with_columns(pl.lit(None, dtype=pl.Int64).alias(c) for c in SPAN_COUNTER_COLUMNS)
        else:
            spans = spans.join(counts, on=["rank", "span_id"], how="left", maintain_order="left")
        from modtrace.core.contracts import SPAN_MEMORY
        from modtrace.results.span_memory import span_memory

        memory = span_memory(self._store, ref.id, spans)
        if memory is None:
            spans = spans.with_columns(pl.lit(None, dtype=pl.Int64).alias(c) for c in SPAN_MEMORY.names)
        else:
            spans = spans.join(memory.select("rank", "span_id", *SPAN_MEMORY.names), on=["rank", "span_id"],
                               how="left", maintain_order="left")
        if not named:
            return spans
        from modtrace.api._tables import spans_table

        return spans_table(spans, self._anchors(ref))

    def issues(self, run: RunLike, *, summary: bool = False) -> pl.DataFrame:
        """The run's nesting issues: events that do not nest (lost, repeated or crossed events,
        calls never exited) and what else ``modtrace check`` reports.

        Parameters
        ----------
        run
            The run (see ``run``).
        summary
            As ``modtrace check`` lists them: every error and warning, and one row per (kind,
            module, phase) of the info issues with ``count``.

        Returns
        -------
        polars.DataFrame
            ``contracts.ISSUE_FRAME``; ``step`` under the run's own step rule, as ``runs`` counts
            its steps.

        Examples
        --------
        >>> db.issues("@").filter(pl.col("severity") == "error")  # doctest: +SKIP
        """
        from modtrace.core.errors import UsageError
        from modtrace.results.materialize import load_issues

        ref = self._ref(run)
        issues = self._analyses[ref.id].issues if ref.id in self._analyses else load_issues(self._store, ref.id)
        if issues.height:
            try:
                issues = self._restep(ref, issues.rename({"seq": "span_id"})).frame.rename({"span_id": "seq"})
            except UsageError:  # a rule its recording cannot follow: the recorded steps
                pass
        if not summary:
            return issues
        from modtrace.analysis.nesting import summarize_issues

        return summarize_issues(issues)

    def steps(self, run: RunLike, *, step_on: str | None = None, step_kind: str | None = None,
              clock: str | None = "host") -> pl.DataFrame:
        """The run's steps: one row per (rank, step), with its kind, step time and its split by
        phase, wall time, spans entered and spans never exited (docs/schema.md, "Step time").

        Parameters
        ----------
        run
            The run (see ``run``).
        step_on
            What makes a step: ``optimizer``, ``root`` (each outermost module call of any
            thread), ``manual`` or ``auto``; None: the rule the run was recorded with.
        step_kind
            Only the steps of this kind (a root call's input shape, e.g. ``tokens=1x1`` for a
            generate() loop's decode steps; ``-`` for steps without a root call).
        clock
            As for ``spans``.

        Returns
        -------
        polars.DataFrame
            ``rank, step, kind`` and ``analysis.step_time.STEP_COLUMNS``.

        Examples
        --------
        >>> db.steps("serve", step_on="root").select("step", "kind", "step_ns")  # doctest: +SKIP
        """
        from modtrace.analysis.step_time import step_table
        from modtrace.api._steps import of_kind

        ref = self._ref(run)
        stepped = self._restep(ref, self._spans_on(ref, clock), step_on)
        frame = stepped.frame if step_kind in (None, "all") else of_kind(ref.name, stepped, step_kind)
        table = step_table(frame)
        return table.join(stepped.kinds, on=["rank", "step"], how="left").select(
            "rank", "step", "kind", *[c for c in table.columns if c not in ("rank", "step")])

    def tree(
        self, run: RunLike, *, phase: str | None = None, step: int | None = None, rank: int | None = None,
        max_depth: int | None = None, min_percent: float | None = None, step_on: str | None = None,
        step_kind: str | None = None, clock: str | None = None, peak_tflops: float | None = None,
    ) -> pl.DataFrame:
        """The module call tree with calls, per-step median and total inclusive and self time,
        percent of step and, for a run with work counters, each node's work per step and
        achieved throughput, in pre-order.

        Parameters
        ----------
        run
            The run (see ``run``).
        phase
            ``forward``, ``backward``, ``recompute`` or ``backward_call``; None: all.
        step, rank
            Only this step (under ``step_on``) or rank.
        max_depth, min_percent
            Hide nodes deeper than this, or under this percent of the step time.
        step_on, step_kind
            As for ``steps``.
        clock
            As for ``spans``; by default device time when the run has it.
        peak_tflops
            The device's peak throughput in TFLOP/s: fills ``peak_percent`` (a usage error unless
            above 0).

        Returns
        -------
        polars.DataFrame
            ``contracts.TREE_FRAME``: ``contracts.TREE_NODE_FRAME``'s timings, then the node's work
            (``core.work``; null where it ran in no counted step): ``counted_steps``,
            ``flops_per_step``, ``bytes_per_step``, ``unknown_ops_per_step`` (medians over its
            counted steps of its inclusive counts summed over its calls in the step),
            ``gflop_per_s`` (``flops_per_step`` / ``inclusive_median_ns``), ``flop_per_byte`` and
            ``peak_percent``.  The whole run's tree (no ``step``, ``rank`` or ``step_kind``) is
            read from the tree stored with the analysis when the run has one.

        Examples
        --------
        >>> db.tree("@", phase="forward", max_depth=2)  # doctest: +SKIP
        """
        from modtrace.api._tree import TreeOptions
        from modtrace.results.tree import nodes_frame

        opts = TreeOptions(phase, step, rank, max_depth, min_percent, step_on, step_kind, peak_tflops)
        return nodes_frame(self._tree_rows(run, opts, clock))

    # -- writes and comparisons ------------------------------------------------------

    def analyze(self, run: RunLike) -> AnalyzeSummary:
        """Rebuild and store the run's spans, nesting issues and tree (idempotent); what a
        recording does when it ends.

        Examples
        --------
        >>> db.analyze("@").spans  # doctest: +SKIP
        """
        from modtrace.results.materialize import materialize
        from modtrace.store.analysis_store import count_span_rows

        ref = self._ref(run)
        self._analyses.pop(ref.id, None)
        result = materialize(self._store, ref.id)
        return AnalyzeSummary(ref, count_span_rows(self._store, ref.id), result.issues)

    def diff(
        self, base: RunLike | Sequence[RunLike], cand: RunLike, options: DiffOptions | None = None, *,
        cand_db: Database | None = None, rank: int | None = None, step_on: str | None = None,
        step_kind: str | None = None, clock: str | None = None, window: int = 10,
    ) -> DiffResult:
        """Compare run ``cand`` against run ``base``, or against a history of base runs: structure
        changes, and per module and phase whether its self time per step changed beyond noise
        (``modtrace diff``).

        Parameters
        ----------
        base
            A run (see ``run``; ``RUN:RANK`` picks one rank of a run); a list of runs, a history
            (newest first); or ``tag:KEY=VALUE`` selectors (a string, or a list of them, AND-ed):
            the newest ``window`` completed runs with those tags, ``cand`` left out.  Against a
            history of two or more runs, what varies between them is the noise
            (``analysis.diff.history``), and a step time beyond it is a regression.
        cand
            The candidate run.
        options
            Thresholds, significance level, warm-up steps, phases (``DiffOptions``).
        cand_db
            The database ``cand`` is in, when it is not this one.
        rank
            Every run restricted to this rank.
        step_on, step_kind
            As for ``steps``; by default the kind most steps of the runs share.
        clock
            Every run on this clock; None: device when all have device times, else host.
        window
            How many of the newest runs a selector takes.

        Returns
        -------
        DiffResult
            ``timing`` (a row per module and phase with its ``checks``) and ``structure`` frames,
            the ``step`` verdict with its checks, a ``summary`` of counts, the first
            ``divergence``, the data-dependent ``calls`` per step, the sides' descriptions
            (``sides``; the base's ``history`` lists the runs used) and ``notes``;
            ``module(fqn)`` gives one module's verdicts and checks; ``exit_code(fail_on)`` is what
            ``modtrace diff`` exits with.

        Examples
        --------
        >>> result = db.diff("baseline", "@")  # doctest: +SKIP
        >>> result.timing.filter(pl.col("verdict") == "regression")  # doctest: +SKIP
        >>> db.diff("tag:branch=main", "@", window=5).exit_code("regression")  # doctest: +SKIP
        """
        from modtrace.api._diff import diff

        other = cand_db or self
        return diff((self, self._store), (other, other._store), base, cand, options, rank=rank, step_on=step_on,
                    step_kind=step_kind, clock=clock, window=window)

    def stragglers(self, run: RunLike, *, step_kind: str | None = None, skip_steps: int = 0) -> Stragglers:
        """Which rank and module held each step of a multi-rank run back, by how much, where the
        other ranks waited, and the step without it (``modtrace stragglers``; the rule is in
        docs/ranks.md, "Stragglers").  The reduction over ranks runs as SQL in the database.

        Parameters
        ----------
        run
            The run (see ``run``); its analysis must be stored, and it must have two ranks or more
            (else ``UsageError``).
        step_kind
            Only the steps whose root call has this kind on every rank.
        skip_steps
            Leave out steps before this one (warm-up).

        Returns
        -------
        Stragglers
            ``steps`` (per step its time, straggler, where others waited, what-if step time),
            ``persistent`` (named in at least half the steps), ``left_out`` (steps not every rank
            recorded); ``to_dict()`` is the JSON.

        Examples
        --------
        >>> db.stragglers("job", skip_steps=2).persistent  # doctest: +SKIP
        """
        from modtrace.api._stragglers import stragglers

        ref = self._ref(run)
        return stragglers(self._store, ref.id, ref.name, step_kind=step_kind, skip_steps=skip_steps,
                          stored=self._has_analysis(ref))

    def memory(self, run: RunLike, *, checkpoint: str | Sequence[str] = (), budget: int | str | None = None,
               device: str | None = None) -> MemoryReport:
        """Where a run's memory goes and what activation checkpointing would buy (``modtrace
        memory``; the model is in docs/memory.md): the peak live tensor memory of each counted
        step, each module's forward by what it keeps beside its forward time, and optionally a
        what-if and a budget search.

        Parameters
        ----------
        run
            The run (see ``run``); recorded with work counters on (``Recorder(counters=...)``), else
            a ``UsageError`` saying so.
        checkpoint
            Globs on module names (``blocks.*``, ``*.mlp``; matched against the full name and the
            name under the root module); the outermost matching forward calls are the ones
            checkpointed (non-reentrant) in the what-if.
        budget
            Bytes (an int, or text such as ``2GiB``, ``500MB``): find the cheapest set of modules,
            by measured recompute time, whose checkpointing brings the predicted peak within it.
        device
            The device the modules, what-if and budget are for; default the device of the largest
            peak.

        Returns
        -------
        MemoryReport
            ``steps`` (``StepPeak`` per counted step and device), ``modules`` (``ModuleMemory``,
            most kept first), ``what_if`` (``WhatIf``: predicted ``peak_bytes``, ``step_ns``,
            ``added_ns``) and ``budget`` (``BudgetPlan``); ``to_dict()`` is the JSON.

        Examples
        --------
        >>> db.memory("@").steps[0].peak_bytes  # doctest: +SKIP
        >>> db.memory("@", checkpoint=["blocks.*"]).what_if.peak_bytes  # doctest: +SKIP
        >>> db.memory("@", budget="2GiB").budget.modules  # doctest: +SKIP
        """
        from modtrace.api._memory import memory

        ref = self._ref(run)
        return memory(self._store, ref, lambda: self._spans_on(ref, "host"), lambda: self.steps(ref),
                      checkpoint=checkpoint, budget=budget, device=device)

    def delete(self, runs: RunLike | Sequence[RunLike], *, force: bool = False) -> list[DeletedRun]:
        """Delete runs with every row that belongs to them (events, spans, issues, trees, device
        times, names, threads, ranks, tags), all in one transaction: every run or none.

        Parameters
        ----------
        runs
            A run or a list of runs (see ``run``); ``runs(...)["id"]`` selects by tag, status
            or age.
        force
            Also delete a run that is still recording (status running, its process alive),
            which is refused otherwise (``RunInUse``, a usage error).

        Returns
        -------
        list[DeletedRun]
            Per run: ``id``, ``name``, ``status`` and ``rows`` (table -> rows deleted).

        Examples
        --------
        >>> old = db.runs(tags={"branch": "main"}, older_than="30d")  # doctest: +SKIP
        >>> db.delete(old["id"].to_list())  # doctest: +SKIP
        """
        from modtrace.store.deletion import delete_runs

        chosen = [runs] if isinstance(runs, (str, int, Run)) else list(runs)
        ids = [self._ref(r).id for r in chosen]
        self._analyses = {k: v for k, v in self._analyses.items() if k not in ids}
        return delete_runs(self._store, ids, force=force)

    # -- for this package's own modules (api._tree, api._diff, api._cli) --------------
    # Other modules ask through these methods rather than reading ``_store``; functions that
    # read the store take it as an argument (api._tree, api._steps, api._clock, api._tables).

    def _ref(self, ref: RunLike) -> Run:
        """Resolve a run reference (raises ``RunNotFound``), without reading its details."""
        from modtrace.store.runs import resolve_run

        if isinstance(ref, Run):
            return ref
        found = resolve_run(self._store, str(ref) if isinstance(ref, str) else f"id:{int(ref)}")
        return Run(found.id, found.name)

    def _analysis(self, run: Run) -> Analysis:
        """The run's spans and issues: stored when analysed, else computed (and kept for this object)."""
        from modtrace.results.materialize import load

        if run.id not in self._analyses:
            self._analyses[run.id] = load(self._store, run.id)
        return self._analyses[run.id]

    def _clock(self, run: Run, clock: str | None) -> str:
        from modtrace.api._clock import resolve_clock

        return resolve_clock(self._store, run.id, run.name, clock)

    def _spans_on(self, run: Run, clock: str | None) -> pl.DataFrame:
        from modtrace.analysis.device import on_clock

        return on_clock(self._analysis(run).spans, self._clock(run, clock))

    def _restep(self, run: Run, frame: pl.DataFrame, step_on: str | None = None,
                ranks: Sequence[int] | None = None) -> Stepped:
        from modtrace.api._steps import restep

        return restep(self._store, run.id, run.name, frame, step_on, ranks)

    def _run_rows(self, limit: int | None, which: RunFilter | None) -> list[dict[str, Any]]:
        """Runs newest first as dicts (``store.runs.list_runs``), steps under each run's own rule."""
        from modtrace.api._steps import with_steps
        from modtrace.store.runs import list_runs

        return with_steps(self._store, list_runs(self._store, limit, which))

    def _anchors(self, run: Run) -> dict[int, int]:
        """rank -> wall-clock nanoseconds at that rank's ``ts_ns = 0``."""
        from modtrace.store.runs import read_anchors

        return read_anchors(self._store, run.id)

    def _thread_names(self, run: Run) -> dict[tuple[int, int], str | None]:
        """(rank, thread_id) -> thread name."""
        from modtrace.store.runs import read_thread_names

        return read_thread_names(self._store, run.id)

    def _event_log(self, run: Run) -> Iterator[pl.DataFrame]:
        """The run's events with names and ``wall_ns``, in chunks, rank by rank (``api._tables``)."""
        from modtrace.api._tables import event_log

        return event_log(self._store, run.id, self._anchors(run))

    def _has_analysis(self, run: Run) -> bool:
        """Whether the run's spans and issues are stored."""
        from modtrace.store.analysis_store import has_analysis

        return has_analysis(self._store, run.id)

    def _start_spans(self, run: Run, columns: tuple[str, ...]) -> Callable[[], pl.DataFrame]:
        """The run's spans with at least ``columns`` filled, begun now (the spans held, else
        ``results.materialize.start_spans``); calling the result gives the frame."""
        from modtrace.results.materialize import start_spans

        if run.id in self._analyses:
            held = self._analyses[run.id].spans
            return lambda: held
        return start_spans(self._store, run.id, columns)

    def _tree_rows(self, run: RunLike, opts: TreeOptions, clock: str | None) -> list[dict[str, Any]]:
        """``tree``'s nodes as plain dicts in pre-order (``api._tree.tree_nodes``), on ``clock``
        resolved; the spans, when the stored tree cannot answer, are the device clock's (the whole
        analysis) or the host's (held, else only the columns the tree reads)."""
        from modtrace.api._tree import tree_nodes

        opts.check()
        ref = self._ref(run)
        chosen = self._clock(ref, clock)

        def spans(columns: tuple[str, ...]) -> pl.DataFrame:
            return self._spans_on(ref, chosen) if chosen != "host" else self._start_spans(ref, columns)()

        return tree_nodes(self._store, ref.id, ref.name, chosen, opts, spans)

    def _diff_clock(self, base: RunLike, cand: RunLike, other: Database, clock: str | None) -> str:
        from modtrace.api._clock import common_clock
        from modtrace.api._diff import split_ref

        b, c = split_ref(self, base)[0], split_ref(other, cand)[0]
        return common_clock([(self._store, b.id, b.name), (other._store, c.id, c.name)], clock)

    def _side(self, ref: RunLike, rank: int | None, step_on: str | None, clock: str) -> tuple[RunCalls, dict[str, Any]]:
        from modtrace.api._diff import load_side

        return load_side(self, self._store, ref, rank, step_on, clock)
