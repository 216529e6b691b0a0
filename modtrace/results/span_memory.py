"""Memory on counted steps where stored meets computed: each span's kept and peak memory and each
counted step's base and peak (stored by ``modtrace analyze``, else computed from the recorder's
``mem_storages``).

Only a run that recorded storages (``store.memory.has_memory``: one indexed probe) reads or
computes anything here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import polars as pl

    from modtrace.store.engine import Store

# the span row columns ``analysis.memory.span_memory`` reads
SPAN_COLUMNS = ("rank", "span_id", "parent_span_id", "call_id", "phase", "graph_task", "thread_id", "device_id",
                "exit_seq")


def _rank_memory(store: Store, run_id: int, rank: int, spans: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(span memory, range memory) of one rank from its storages and counted ranges."""
    from modtrace.analysis.memory import range_memory, span_memory
    from modtrace.store.counters import read_counters
    from modtrace.store.memory import read_storages

    storages = read_storages(store, run_id, rank)
    _calls, ranges = read_counters(store, run_id, rank)
    return span_memory(spans, storages, ranges), range_memory(storages)


def _named_steps(store: Store, run_id: int, rank: int, ranges: pl.DataFrame, steps: dict[int, int]) -> pl.DataFrame:
    """``step_memory`` rows of one rank (without run_id) from ``range_memory``'s frame."""
    import polars as pl

    from modtrace.store.reader import read_devices

    names = read_devices(store, run_id, ranks=[rank]).select(
        pl.col("device_id").cast(pl.Int32).alias("device"), pl.col("name").cast(pl.String).alias("name"))
    return ranges.join(names, on="device", how="left").select(
        pl.col("rank").cast(pl.Int32), "first_seq",
        pl.col("first_seq").replace_strict(steps, default=None, return_dtype=pl.Int32).alias("step"),
        pl.col("name").fill_null(pl.col("device").cast(pl.String)).alias("device"), "base_bytes", "peak_bytes",
    )


def store_memory(store: Store, run_id: int, ranks: list[int], spans: pl.DataFrame | None = None) -> None:
    """The span memory rows and ``step_memory`` of a run that recorded storages, rank by rank,
    from its stored spans, once they are stored (a span's kept memory needs its rank's call tree).
    ``spans``: the span rows of the one rank in ``ranks``, held by the caller (not read back).
    The ranges' steps are read from the stored step starts (``range_steps``)."""
    from modtrace.store.memory import has_memory

    if not has_memory(store, run_id):
        return
    from modtrace.store.analysis_store import read_span_rows
    from modtrace.store.counters import range_bounds, read_counters
    from modtrace.store.memory import range_steps, write_span_memory, write_step_memory

    for r in ranks:
        rows = spans
        if rows is None:  # the spans entered in counted ranges, read by key (as _store_counters does)
            _calls, ranges = read_counters(store, run_id, r)
            rows = read_span_rows(store, run_id, columns=SPAN_COLUMNS, rank=r, within=range_bounds(ranges))
        per_span, per_range = _rank_memory(store, run_id, r, rows)
        write_span_memory(store, run_id, r, per_span)
        seqs = per_range["first_seq"].unique().to_list()
        steps = range_steps(store, run_id, r, seqs)
        write_step_memory(store, run_id, r, _named_steps(store, run_id, r, per_range, steps))


def span_memory(store: Store, run_id: int, spans: pl.DataFrame) -> pl.DataFrame | None:
    """rank, span_id and ``analysis.memory.SPAN_MEMORY`` of the run's counted spans; None when the
    run recorded no storages.  The stored rows when the run was analysed, else computed from
    ``spans`` (the run's spans frame: rank, span_id, parent_span_id, call_id, phase, graph_task,
    thread_id, device_id, exit_seq)."""
    from modtrace.store.analysis_store import has_analysis
    from modtrace.store.memory import has_memory, read_span_memory

    if not has_memory(store, run_id):
        return None
    if has_analysis(store, run_id):
        return read_span_memory(store, run_id)
    import polars as pl

    if isinstance(spans.schema["phase"], pl.Enum):  # its order is the codes' (contracts.PHASES)
        spans = spans.with_columns(pl.col("phase").to_physical())
    parts = [_rank_memory(store, run_id, rank, spans.filter(pl.col("rank") == rank))[0]
             for rank in sorted(spans["rank"].unique().to_list())]
    from modtrace.analysis.memory import SPAN_MEMORY

    empty = pl.DataFrame(schema={"rank": pl.Int32, "span_id": pl.Int64, **dict.fromkeys(SPAN_MEMORY, pl.Int64)})
    return pl.concat(parts) if parts else empty


def step_memory(store: Store, run_id: int) -> pl.DataFrame | None:
    """rank, first_seq, step, device (its name), base_bytes and peak_bytes of each counted range
    of the run; None when it recorded no storages.  Stored when the run was analysed, else
    computed (step: the recorded step of the range's first event)."""
    from modtrace.store.analysis_store import has_analysis
    from modtrace.store.memory import has_memory, read_step_memory

    if not has_memory(store, run_id):
        return None
    if has_analysis(store, run_id):
        return read_step_memory(store, run_id)
    import polars as pl

    from modtrace.analysis.memory import range_memory
    from modtrace.store.memory import read_storages
    from modtrace.store.reader import read_ranks

    parts = []
    for r in read_ranks(store, run_id):
        per_range = range_memory(read_storages(store, run_id, r))
        steps = _recorded_steps(store, run_id, r, per_range["first_seq"].unique().to_list())
        parts.append(_named_steps(store, run_id, r, per_range, steps))
    return pl.concat(parts) if parts else None


def _recorded_steps(store: Store, run_id: int, rank: int, seqs: list[int]) -> dict[int, int]:
    from modtrace.store.cursor import driver_cursor, mark

    if not seqs:
        return {}
    with driver_cursor(store) as cur:
        cur.execute(f"SELECT seq, step FROM events WHERE run_id = {mark(store)} AND rank = {int(rank)} "
                    f"AND seq IN ({', '.join(str(int(s)) for s in seqs)})", (run_id,))
        return {int(s): int(step) for s, step in cur.fetchall()}
