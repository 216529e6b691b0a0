"""Where the store and the analysis meet: read a run, analyse it, store or return the result.

``modtrace.store`` reads and writes rows; ``modtrace.analysis`` turns frames
into frames.  Neither imports the other: this module drives both, and is
the one place that decides "stored analysis if present, else computed"
(``load``).  The public API (``modtrace.api``) and the recorder (which
analyses a rank when it finishes) call it; the CLI goes through the API.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl
    from sqlalchemy import Connection

    from modtrace.analysis import Analysis
    from modtrace.analysis.diff import RunCalls
    from modtrace.store.engine import Store

# ``materialize`` analyses a rank in rounds of at most ROUND_ROWS events (read in chunks of
# CHUNK_ROWS), each round's rows written before the next is read
# (``store.analysis_store.write_analysis_rounds``); a rank up to ROUND_ROWS events is held
# whole (its spans returned and its tree computed from them), as the one-piece analysis
# would hold it.  The rounds' results are the one-piece analysis' (``analysis.stream``).
# On PostgreSQL rounds are PART_ROWS events, which bounds what one round holds in memory;
# a rollback-journal SQLite file keeps one round up to ROUND_ROWS, since reading a round's
# events beside an open write transaction may wait on its lock there
# (``store.analysis_store.writes_beside_reads``).
ROUND_ROWS = 2_000_000
CHUNK_ROWS = 200_000
PART_ROWS = 200_000


def _complete(store: Store, run_id: int, rank: int | None, complete: bool | None) -> bool:
    from modtrace.store.reader import read_run_status

    return complete if complete is not None else read_run_status(store, run_id, rank) == "completed"


def compute(store: Store, run_id: int, *, rank: int | None = None, complete: bool | None = None) -> Analysis:
    """Analyse run ``run_id`` (or one rank of it) from its events, without writing.

    ``complete`` says whether the run finished normally (calls left open are
    then errors rather than the trace of a crash); by default it is read from
    the run's (or rank's) status: ``completed`` is complete.
    """
    from modtrace.analysis import analyze_events
    from modtrace.store.reader import read_devices, read_events, read_modules

    ranks = None if rank is None else [rank]
    complete = _complete(store, run_id, rank, complete)
    events = read_events(store, run_id, ranks=ranks)
    result = analyze_events(
        events,
        read_modules(store, run_id, ranks=ranks),
        read_devices(store, run_id, ranks=ranks),
        complete=complete,
    )
    return _with_device_times(store, run_id, ranks, result)


def _with_device_times(store: Store, run_id: int, ranks: list[int] | None, result: Analysis) -> Analysis:
    """The spans with their device columns (``analysis.device``) when the run has device times;
    as they are otherwise (a CPU run pays one indexed probe)."""
    from modtrace.store.device_times import has_device_events, read_device_events

    if not has_device_events(store, run_id):
        return result
    from dataclasses import replace

    from modtrace.analysis.device import device_times

    return replace(result, spans=device_times(result.spans, read_device_events(store, run_id, ranks=ranks)))


def stored(store: Store, run_id: int) -> Analysis | None:
    """The run's stored spans (named) and issues, or None when it was never analysed."""
    from modtrace.analysis import Analysis
    from modtrace.analysis.spans import name_spans
    from modtrace.store.analysis_store import has_analysis, read_issues, read_span_rows
    from modtrace.store.reader import read_devices, read_modules

    if not has_analysis(store, run_id):
        return None
    spans = name_spans(read_span_rows(store, run_id), read_modules(store, run_id), read_devices(store, run_id))
    return Analysis(_stored_device_columns(store, run_id, spans), read_issues(store, run_id))


def _stored_device_columns(store: Store, run_id: int, spans: pl.DataFrame) -> pl.DataFrame:
    """``spans`` with their stored device columns, for a run that has some (computed
    from ``device_events`` when none were stored: a run analysed in rounds)."""
    from modtrace.store.device_times import read_span_device_rows

    rows = read_span_device_rows(store, run_id)
    if rows.height == 0:
        from modtrace.analysis import Analysis

        return _with_device_times(store, run_id, None, Analysis(spans, spans.clear())).spans
    return spans.join(rows.drop("run_id"), on=["rank", "span_id"], how="left", maintain_order="left")


def load_spans(store: Store, run_id: int, columns: tuple[str, ...]) -> pl.DataFrame:
    """The run's spans frame with at least ``columns`` filled (the others null when stored,
    for a cheaper read): the stored spans when it was analysed, else computed."""
    return start_spans(store, run_id, columns)()


def start_spans(store: Store, run_id: int, columns: tuple[str, ...]) -> Callable[[], pl.DataFrame]:
    """``load_spans`` begun: a stored analysis is read in threads from now on while the caller
    does other work (an export reads the run's metadata); calling the result finishes it."""
    from modtrace.store.analysis_store import has_analysis
    from modtrace.store.span_columns import start_span_columns

    wanted = tuple(dict.fromkeys(("rank", "span_id", "module_id", "device_id", *columns)))
    read = start_span_columns(store, run_id, wanted) if has_analysis(store, run_id) else None

    def finish() -> pl.DataFrame:
        from modtrace.analysis.spans import name_spans
        from modtrace.store.analysis_store import read_span_rows
        from modtrace.store.reader import read_devices, read_modules

        if read is None:
            return compute(store, run_id).spans
        rows = read.result()
        if rows is None:  # a rank the run does not list, a value past 64 bits: the ordinary read
            rows = read_span_rows(store, run_id, columns=wanted)
        return name_spans(rows, read_modules(store, run_id), read_devices(store, run_id))

    return finish


def _tree_spans(store: Store, run_id: int) -> pl.DataFrame:
    """The run's stored spans as ``tree`` reads them: the columns ``module_tree`` needs, and
    the device columns too when the run has device times."""
    from modtrace.analysis.aggregate import TREE_SPAN_COLUMNS
    from modtrace.store.device_times import has_device_events

    found = stored(store, run_id) if has_device_events(store, run_id) else None
    return found.spans if found is not None else load_spans(store, run_id, TREE_SPAN_COLUMNS)


def load_issues(store: Store, run_id: int) -> pl.DataFrame:
    """The run's nesting issues: the stored ones when it was analysed (no span is read), else computed."""
    from modtrace.store.analysis_store import has_analysis, read_issues

    if has_analysis(store, run_id):
        return read_issues(store, run_id)
    return compute(store, run_id).issues


def load_calls(store: Store, run_id: int, rank: int | None = None) -> RunCalls:
    """The run's closed calls (only ``rank``'s when given), as a diff compares them: read from
    the stored spans as text when the run was analysed, else computed from its events."""
    import polars as pl

    from modtrace.analysis.diff import RunCalls, calls_of_spans
    from modtrace.store.analysis_store import has_analysis
    from modtrace.store.reader import read_devices, read_modules
    from modtrace.store.samples import fetch_closed_calls, parse_closed_calls

    if has_analysis(store, run_id):
        ranks = None if rank is None else [rank]
        return RunCalls(
            parse_closed_calls(fetch_closed_calls(store, run_id, rank=rank)),
            read_modules(store, run_id, ranks=ranks),
            read_devices(store, run_id, ranks=ranks),
        )
    spans = compute(store, run_id, rank=rank).spans
    return calls_of_spans(spans if rank is None else spans.filter(pl.col("rank") == rank))


def load(store: Store, run_id: int) -> Analysis:
    """The run's analysis: the stored one when there is one, else computed (nothing written)."""
    found = stored(store, run_id)
    return found if found is not None else compute(store, run_id)


def _round_chunks(store: Store, run_id: int, rank: int, round_rows: int, chunk_rows: int) -> Iterator[pl.DataFrame]:
    """The rank's events by seq in frames of about ``round_rows`` rows, read ``chunk_rows`` at a time."""
    import polars as pl

    from modtrace.store.reader import iter_event_chunks

    held: list[pl.DataFrame] = []
    size = 0
    for chunk in iter_event_chunks(store, run_id, rank, chunk_rows=min(chunk_rows, round_rows)):
        held.append(chunk)
        size += chunk.height
        if size >= round_rows:
            yield pl.concat(held, rechunk=True)
            held, size = [], 0
    if held:
        yield pl.concat(held, rechunk=True)


@dataclass
class _Found:
    """What ``materialize`` returns of the rounds: every issue, and the spans while each rank
    was at most ``round_rows`` events (``spans`` is None once one was more: those went to the
    store only)."""

    issues: list[pl.DataFrame] = field(default_factory=list)
    spans: list[pl.DataFrame] | None = field(default_factory=list)


def _rounds(
    store: Store, run_id: int, ranks: list[int], complete: bool, round_rows: int, chunk_rows: int, found: _Found,
    part_rows: int | None = None,
) -> Iterator[tuple[pl.DataFrame, pl.DataFrame, int | None]]:
    """(spans, issues, rank whose rows they replace or None) per round of each rank, rounds of
    ``min(round_rows, part_rows)`` events (None: PART_ROWS on PostgreSQL, ``round_rows`` on
    SQLite); of ``round_rows`` where the store cannot read a round's events beside the open
    write transaction (``store.analysis_store.writes_beside_reads``)."""
    from modtrace.analysis.stream import analyze_rank
    from modtrace.store.analysis_store import writes_beside_reads
    from modtrace.store.reader import read_modules

    if part_rows is None:
        part_rows = PART_ROWS if store.dialect == "postgresql" else round_rows
    size = min(round_rows, part_rows) if writes_beside_reads(store) else round_rows
    for r in ranks:
        modules = read_modules(store, run_id, ranks=[r])
        parts: list[tuple[pl.DataFrame, pl.DataFrame]] = []
        seen = [0]  # events read of the rank, its last reading (a restart reads it again)

        def chunks(r: int = r, seen: list[int] = seen) -> Iterator[pl.DataFrame]:
            seen[0] = 0
            for chunk in _round_chunks(store, run_id, r, size, chunk_rows):
                seen[0] += chunk.height
                yield chunk

        for part in analyze_rank(chunks, modules, complete=complete):
            if part.restart:
                parts.clear()
            parts.append((part.spans, part.issues))
            yield part.spans, part.issues, r if part.restart else None
        found.issues.extend(issues for _, issues in parts)
        if found.spans is not None:
            found.spans = None if seen[0] > round_rows else [*found.spans, *(spans for spans, _ in parts)]


def analysed_rounds(store: Store, run_id: int) -> Iterator[tuple[pl.DataFrame, pl.DataFrame]]:
    """(spans, issues) of each round ``materialize`` would write for the whole run, read and
    analysed as it does, with nothing written: the floor a benchmark sets beside
    ``modtrace analyze`` (``benchmarks/bench_analysis.py``).  A rank analysed again in one
    piece yields its rounds and then the whole."""
    from modtrace.store.reader import read_ranks

    found = _Found()
    complete = _complete(store, run_id, None, None)
    for spans, issues, _ in _rounds(store, run_id, read_ranks(store, run_id), complete, ROUND_ROWS, CHUNK_ROWS, found):
        yield spans, issues


def _store_device_times(store: Store, run_id: int, ranks: list[int]) -> None:
    """The span device rows of a run with device times, rank by rank, from its stored spans
    (only the columns ``device_times`` reads) and device events, once the rounds are stored
    (device and self times need a rank's whole call tree)."""
    from modtrace.store.device_times import (
        has_device_events,
        read_device_events,
        write_span_device_rows,
    )

    if not has_device_events(store, run_id):
        return
    from modtrace.analysis.device import device_times
    from modtrace.store.analysis_store import read_span_rows

    needed = ("run_id", "rank", "span_id", "parent_span_id", "depth", "device_id", "stream", "exit_seq")
    for r in ranks:
        spans = read_span_rows(store, run_id, columns=needed, rank=r)
        write_span_device_rows(store, run_id, r, device_times(spans, read_device_events(store, run_id, ranks=[r])))


def _store_counters(store: Store, run_id: int, ranks: list[int]) -> None:
    """The span counter rows of a run that counted work, rank by rank, from its stored spans
    and the recorder's counters, once the rounds are stored (inclusive counts need a
    rank's whole call tree)."""
    from modtrace.store.counters import (
        has_counters,
        range_bounds,
        read_counters,
        write_span_counters,
    )

    if not has_counters(store, run_id):
        return
    from modtrace.analysis.counters import span_counters
    from modtrace.store.analysis_store import read_span_rows

    needed = ("rank", "span_id", "parent_span_id", "depth", "call_id", "phase", "graph_task")
    for r in ranks:
        calls, ranges = read_counters(store, run_id, r)
        # only the spans entered in counted ranges count (a few steps of a long run, read by key)
        spans = read_span_rows(store, run_id, columns=needed, rank=r, within=range_bounds(ranges))
        write_span_counters(store, run_id, r, span_counters(spans, calls, ranges))


def materialize(
    store: Store, run_id: int, *, rank: int | None = None, complete: bool | None = None,
    round_rows: int = ROUND_ROWS, chunk_rows: int = CHUNK_ROWS, part_rows: int | None = None,
) -> Analysis:
    """Rebuild and store run ``run_id``'s spans and nesting issues (only ``rank``'s when given).

    Idempotent: the run's (rank's) stored rows are replaced in one transaction.
    Each rank is analysed in rounds of about ``min(round_rows, part_rows)``
    events (``part_rows`` None: ``PART_ROWS`` on PostgreSQL, one round up to
    ``round_rows`` on SQLite; ``analysis.stream.analyze_rank``), whose results
    are those of the one-piece analysis whatever the size; each round is
    written before the next is read and analysed.  The run's default module call tree
    is stored after them (``results.tree.store_tree``); its steps under its own rule with them, in
    their transaction (``results.steps``).  The returned spans are named when
    every rank was at most ``round_rows`` events; a run with a larger rank comes back
    with its issues and an empty spans frame (its spans are in the store).
    """
    import polars as pl

    from modtrace.analysis import Analysis
    from modtrace.analysis.nesting import ISSUE_SCHEMA, empty_issues
    from modtrace.analysis.spans import empty_spans, name_spans
    from modtrace.results.steps import step_rows
    from modtrace.results.tree import store_tree
    from modtrace.store.analysis_store import read_step_spans, write_analysis_rounds
    from modtrace.store.reader import read_devices, read_modules, read_ranks
    from modtrace.store.roots import read_step_basis

    ranks = read_ranks(store, run_id) if rank is None else [rank]
    found = _Found()
    parts = _rounds(store, run_id, ranks, _complete(store, run_id, rank, complete), round_rows, chunk_rows, found,
                    part_rows)
    selected = None if rank is None else [rank]

    def named(held: list[pl.DataFrame]) -> pl.DataFrame:
        spans = name_spans(pl.concat(held, rechunk=True), read_modules(store, run_id, ranks=selected),
                           read_devices(store, run_id, ranks=selected)).sort("rank", "span_id")
        return _with_device_times(store, run_id, selected, Analysis(spans, spans.clear())).spans

    basis = read_step_basis(store, run_id)  # before the write transaction, which other connections may wait on

    def steps(conn: Connection) -> tuple[pl.DataFrame, pl.DataFrame] | None:
        """The run's (rank's) steps under its own rule, from the spans held, else from those the
        transaction wrote (read on its connection)."""
        if found.spans is None:
            return step_rows(run_id, basis, read_step_spans(conn, run_id, rank))
        return step_rows(run_id, basis, pl.concat(found.spans)) if found.spans else None

    write_analysis_rounds(store, run_id, parts, rank=rank, from_events=True, steps=steps)
    _store_device_times(store, run_id, ranks)
    _store_counters(store, run_id, ranks)
    from modtrace.results.span_memory import store_memory  # kept and peak memory
    store_memory(store, run_id, ranks)
    some = [f for f in found.issues if f.height]
    issues = pl.concat(some).cast(ISSUE_SCHEMA).sort("rank", "seq", "kind") if some else empty_issues()  # type: ignore[arg-type]
    if not found.spans:
        if found.spans is None:  # a rank of several rounds: its spans are in the store only
            store_tree(store, run_id, lambda: _tree_spans(store, run_id), rank=rank)
        return Analysis(empty_spans(), issues)
    result = Analysis(named(found.spans), issues)
    store_tree(store, run_id, result.spans, rank=rank)
    return result
