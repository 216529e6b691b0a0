"""Where the store and the analysis meet: read a run, analyse it, store or return the result.

``modtrace.store`` reads and writes rows; ``modtrace.analysis`` turns frames
into frames.  Neither imports the other: this module drives both, and is
the one place that decides "stored analysis if present, else computed"
(``load``).  The public API (``modtrace.api``) and the recorder (which
analyses a rank when it finishes) call it; the CLI goes through the API.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

    from modtrace.analysis import Analysis
    from modtrace.store.engine import Store

# A rank with more events than this is analysed in rounds by ``materialize``.
STREAM_ABOVE = 2_000_000
CHUNK_ROWS = 200_000


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
    return analyze_events(
        events,
        read_modules(store, run_id, ranks=ranks),
        read_devices(store, run_id, ranks=ranks),
        complete=complete,
    )


def stored(store: Store, run_id: int) -> Analysis | None:
    """The run's stored spans (named) and issues, or None when it was never analysed."""
    from modtrace.analysis import Analysis
    from modtrace.analysis.spans import name_spans
    from modtrace.store.analysis_store import has_analysis, read_issues, read_span_rows
    from modtrace.store.reader import read_devices, read_modules

    if not has_analysis(store, run_id):
        return None
    spans = name_spans(read_span_rows(store, run_id), read_modules(store, run_id), read_devices(store, run_id))
    return Analysis(spans, read_issues(store, run_id))


def load_issues(store: Store, run_id: int) -> pl.DataFrame:
    """The run's nesting issues: the stored ones when it was analysed (no span is read), else computed."""
    from modtrace.store.analysis_store import has_analysis, read_issues

    if has_analysis(store, run_id):
        return read_issues(store, run_id)
    return compute(store, run_id).issues


def load(store: Store, run_id: int) -> Analysis:
    """The run's analysis: the stored one when there is one, else computed (nothing written)."""
    found = stored(store, run_id)
    return found if found is not None else compute(store, run_id)


def _rounds(
    store: Store, run_id: int, ranks: list[int], complete: bool, chunk_rows: int, found: list[pl.DataFrame],
    n_spans: list[int],
) -> Iterator[tuple[pl.DataFrame, pl.DataFrame]]:
    from modtrace.analysis.stream import analyze_rounds
    from modtrace.store.reader import iter_event_chunks, read_modules

    for r in ranks:
        modules = read_modules(store, run_id, ranks=[r])
        chunks = iter_event_chunks(store, run_id, r, chunk_rows=chunk_rows)
        for part in analyze_rounds(chunks, modules, complete=complete):
            n_spans[0] += part.spans.height
            if part.issues.height:
                found.append(part.issues)
            yield part.spans, part.issues


def materialize_streamed(
    store: Store, run_id: int, *, rank: int | None = None, complete: bool | None = None,
    chunk_rows: int = CHUNK_ROWS,
) -> tuple[int, pl.DataFrame]:
    """Rebuild and store run ``run_id``'s spans and issues (only ``rank``'s when given) in rounds.

    Returns (number of spans stored, issues frame).  The run's (rank's)
    stored rows are replaced in one transaction, as ``materialize`` does.
    """
    import polars as pl

    from modtrace.analysis.nesting import ISSUE_SCHEMA, empty_issues
    from modtrace.store.analysis_store import write_analysis_rounds
    from modtrace.store.reader import read_ranks

    ranks = read_ranks(store, run_id) if rank is None else [rank]
    found: list[pl.DataFrame] = []
    n_spans = [0]
    parts = _rounds(store, run_id, ranks, _complete(store, run_id, rank, complete), chunk_rows, found, n_spans)
    write_analysis_rounds(store, run_id, parts, rank=rank)
    if not found:
        return n_spans[0], empty_issues()
    return n_spans[0], pl.concat(found).cast(ISSUE_SCHEMA).sort("rank", "seq", "kind")  # type: ignore[arg-type]


def materialize(store: Store, run_id: int, *, rank: int | None = None, complete: bool | None = None) -> Analysis:
    """Rebuild and store run ``run_id``'s spans and nesting issues (only ``rank``'s when given).

    Idempotent: the run's (rank's) stored rows are replaced in one transaction.
    A run with more than ``STREAM_ABOVE`` events on a rank is analysed in
    rounds with bounded memory (``materialize_streamed``); its spans then go
    to the store only, and the returned ``spans`` frame is empty.
    """
    from modtrace.analysis import Analysis
    from modtrace.store.analysis_store import write_analysis
    from modtrace.store.reader import max_rank_events

    if max_rank_events(store, run_id, rank) > STREAM_ABOVE:
        from modtrace.analysis.spans import empty_spans

        _, issues = materialize_streamed(store, run_id, rank=rank, complete=complete)
        return Analysis(empty_spans(), issues)
    result = compute(store, run_id, rank=rank, complete=complete)
    write_analysis(store, run_id, result.spans, result.issues, rank=rank)
    return result
