"""A rank's events after a seq, as the writer process's analysis reads them while the run goes on.

``reader.iter_event_chunks`` reads a rank from its first event; the analysis that follows a
recording (``results.incremental``) reads what was committed since its last read, in the same
frames (``EVENT_FRAME``) and through the same SQL (``reader``'s CSV chunks), so the rows it
analyses are those a later ``modtrace analyze`` reads.  Or it takes the rows the writer process
has just committed (``events_frame``): the same frame as reading them back gives, without the
read (4 us an event on SQLite, the largest part of a round: docs/performance.md, "Analysis as
the run goes").
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from modtrace.core.codes import OUT_OF_RANGE_CODE
from modtrace.store import reader
from modtrace.store.cursor import driver_cursor
from modtrace.store.engine import Store


def committed_head(store: Store, run_id: int, rank: int) -> tuple[int, int | None]:
    """(events committed, the largest seq among them) of the rank: its ``run_ranks`` count,
    written with every batch, and the last key of its events (an index probe)."""
    with driver_cursor(store) as cur:
        cur.execute(f"SELECT event_count FROM run_ranks WHERE run_id = {int(run_id)} AND rank = {int(rank)}")
        row = cur.fetchone()
        count = int(row[0] or 0) if row else 0
        cur.execute(f"SELECT max(seq) FROM events WHERE run_id = {int(run_id)} AND rank = {int(rank)}")
        row = cur.fetchone()
    return count, (None if row is None or row[0] is None else int(row[0]))


def iter_events_between(store: Store, run_id: int, rank: int, after: int | None, upto: int,
                        chunk_rows: int) -> Iterator[pl.DataFrame]:
    """The rank's events with ``after < seq <= upto`` (``after`` None: from the first), by seq,
    in frames of at most ``chunk_rows`` rows."""
    low = -(1 << 63) if after is None else after + 1
    while low <= upto:
        limit = max(1, min(chunk_rows, upto - low + 1))
        frame = _chunk(store, run_id, rank, low, limit).filter(pl.col("seq") <= upto)
        if frame.height == 0:
            return
        yield frame
        low = int(frame["seq"][-1]) + 1


def _chunk(store: Store, run_id: int, rank: int, low: int, limit: int) -> pl.DataFrame:
    fetched = reader._FETCHED
    if store.dialect == "sqlite":
        with driver_cursor(store) as cur:
            cur.execute(reader._SQLITE_CHUNK.format(">="), (run_id, rank, low, limit))
            (text,) = cur.fetchone()
        if not text:
            return pl.DataFrame(schema=reader._EVENT_FRAME_SCHEMA)
        frame = reader._unpack_small(pl.read_csv(text.encode(), has_header=False, new_columns=reader._CSV_COLUMNS,
                                                 schema=reader._CSV_SCHEMA))
    else:
        columns = ", ".join(f"{reader.small_code(c)} AS {c}" if c in reader._SMALL else c for c in fetched)
        data = reader.csv_text(store, f"SELECT {columns} FROM events WHERE run_id = {int(run_id)} AND rank = "
                                      f"{int(rank)} AND seq >= {int(low)} ORDER BY seq LIMIT {int(limit)}",
                               fetched, key_order=True)
        if not data:
            return pl.DataFrame(schema=reader._EVENT_FRAME_SCHEMA)
        frame = pl.read_csv(data, has_header=False, new_columns=fetched, schema=reader._FETCHED_SCHEMA)
    if not frame["seq"].is_sorted():
        frame = frame.sort("seq")
    return frame.select(pl.lit(run_id, dtype=pl.Int32).alias("run_id"), pl.lit(rank, dtype=pl.Int32).alias("rank"),
                        *fetched)


_WIDE = {c: pl.Int64() for c in reader._FETCHED}


def events_frame(rows: list[tuple[object, ...]], run_id: int, rank: int) -> pl.DataFrame:
    """Event rows of the rank as the writer wrote them (``EVENT_ROW`` tuples, no run_id or rank)
    -> the frame ``iter_events_between`` reads back for them (a one-byte code that does not fit
    becomes ``OUT_OF_RANGE_CODE``, as ``reader.small_code`` reads it), in the rows' order.
    Raises where a value does not fit its column (the follow then stops: the rank is analysed
    from its stored events at the end)."""
    frame = pl.DataFrame(rows, schema=_WIDE, orient="row")
    small = [pl.when(pl.col(c).is_between(-127, 127)).then(pl.col(c)).otherwise(OUT_OF_RANGE_CODE).alias(c)
             for c in reader._SMALL]
    return frame.with_columns(small).select(
        pl.lit(run_id, dtype=pl.Int32).alias("run_id"), pl.lit(rank, dtype=pl.Int32).alias("rank"),
        *(pl.col(c).cast(reader._FETCHED_SCHEMA[c], strict=True) for c in reader._FETCHED))
