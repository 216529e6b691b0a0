"""Materialise: read a run's events, analyse them, store spans and issues.

The one place in ``modtrace.analysis`` that does I/O, all of it through
``modtrace.store``.  The recorder calls ``materialize`` when a rank
finishes; ``modtrace analyze`` calls it for a whole run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from modtrace.analysis import Analysis
    from modtrace.store.engine import Store


def compute(store: Store, run_id: int, *, rank: int | None = None, complete: bool | None = None) -> Analysis:
    """Analyse run ``run_id`` (or one rank of it) from its events, without writing.

    ``complete`` says whether the run finished normally (calls left open are
    then errors rather than the trace of a crash); by default it is read from
    the run's (or rank's) status: ``completed`` is complete.
    """
    from modtrace.analysis import analyze_events
    from modtrace.store.reader import read_devices, read_events, read_modules, read_run_status

    ranks = None if rank is None else [rank]
    if complete is None:
        complete = read_run_status(store, run_id, rank) == "completed"
    events = read_events(store, run_id, ranks=ranks)
    return analyze_events(
        events,
        read_modules(store, run_id, ranks=ranks),
        read_devices(store, run_id, ranks=ranks),
        complete=complete,
    )


def materialize(store: Store, run_id: int, *, rank: int | None = None, complete: bool | None = None) -> Analysis:
    """Rebuild and store run ``run_id``'s spans and nesting issues (only ``rank``'s when given).

    Idempotent: the run's (rank's) stored rows are replaced in one transaction.
    A run with more than ``stream.STREAM_ABOVE`` events on a rank is analysed
    in rounds with bounded memory (``stream.materialize_streamed``); its spans
    then go to the store only, and the returned ``spans`` frame is empty.
    """
    from modtrace.analysis import stream
    from modtrace.store.analysis_store import write_analysis

    if stream.event_total(store, run_id, rank) > stream.STREAM_ABOVE:
        import polars as pl

        from modtrace.analysis import Analysis
        from modtrace.analysis.events import empty_devices, empty_modules
        from modtrace.analysis.spans import SPAN_ROW_SCHEMA, name_spans

        _, issues = stream.materialize_streamed(store, run_id, rank=rank, complete=complete)
        return Analysis(name_spans(pl.DataFrame(schema=SPAN_ROW_SCHEMA), empty_modules(), empty_devices()), issues)
    result = compute(store, run_id, rank=rank, complete=complete)
    write_analysis(store, run_id, result.spans, result.issues, rank=rank)
    return result
