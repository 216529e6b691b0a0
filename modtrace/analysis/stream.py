"""Streamed analysis: a large run's events in chunks, with open calls carried across.

``analyze_events`` holds a whole run in memory: fine for millions of
events, not for a long multi-rank recording.  Here one rank's events arrive
as chunks in seq order (``store.reader.iter_event_chunks``: a server-side
cursor on PostgreSQL), and each *round* analyses what is safe to analyse so
far with the same pure steps (normalise, pair, time, check):

- a round ends at a *safe cut*: a seq no hook-dispatch tie group straddles,
  so tie normalisation sees whole groups (rows after the cut wait for the
  next round);
- spans still open at the cut are *carried*: their enter rows open the next
  round's frame, so the calls they enclose get the right parent and depth,
  and their own exit, when it comes, closes them.  The time of their
  children already written is carried too, so self time is exact;
- a round yields the spans it closed and its issues; calls left open are
  reported (``unclosed``) only by the last round, with the run's
  completeness.

Memory is bounded by a chunk, the carried stack and one round's spans; the
result is the same as the one-piece analysis for any stream whose stacks
nest (healthy or cut short by a crash).  In a corrupted stream, a call
repeated (``duplicate_enter`` / ``duplicate_exit``) across a cut is reported
as a ``no_enter`` or not at all, and a ``crossed`` exit whose inner calls
stay open may be reported once per round: the one-piece analysis
(``materialize.compute``) names those exactly.

``materialize_streamed`` writes the rounds into ``span_rows`` and
``nesting_issues`` in one transaction; ``materialize.materialize`` uses it
for runs above ``STREAM_ABOVE`` events on a rank.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import polars as pl

from modtrace.analysis.events import EVENT_SCHEMA, conform, empty_events, normalize_events
from modtrace.analysis.nesting import ISSUE_COLUMNS, collect_issues, empty_issues
from modtrace.analysis.spans import SPAN_ROW_COLUMNS, SPAN_ROW_SCHEMA, pair_events, time_spans
from modtrace.analysis.validate import validate

if TYPE_CHECKING:
    from modtrace.store.engine import Store

# A rank with more events than this is analysed in rounds by ``materialize``.
STREAM_ABOVE = 2_000_000
CHUNK_ROWS = 200_000

_NO_END = 1 << 62


@dataclass(frozen=True)
class Round:
    """What one round closed: span rows (``SPAN_ROW_COLUMNS``, codes) and issues (``ISSUE_COLUMNS``)."""

    spans: pl.DataFrame
    issues: pl.DataFrame


def _tie_groups(ev: pl.DataFrame) -> pl.DataFrame:
    """Per row of ``ev`` (one rank, sorted by seq): seq, thread_id, tie and ``_grp``, its
    hook-dispatch group (a tie=0 row and the tie=1 rows after it on its thread), in ``ev``'s order."""
    return (
        ev.select(pl.int_range(pl.len(), dtype=pl.Int64).alias("_row"), "seq", "thread_id", "tie")
        .sort("thread_id", maintain_order=True)
        .with_columns(
            ((pl.col("tie") == 0) | (pl.col("thread_id") != pl.col("thread_id").shift(1)).fill_null(True))
            .cum_sum()
            .cast(pl.Int64)
            .alias("_grp")
        )
        .sort("_row")
        .drop("_row")
    )


def safe_cut(ev: pl.DataFrame, continuing: set[int]) -> int:
    """The largest seq ``p`` such that no tie group of ``ev`` has rows on both sides of it.

    ``ev``: one rank's rows sorted by seq.  ``continuing``: threads whose last
    group goes on after ``ev`` (their next row is tied).  Rows with seq < p
    can be analysed now; p is past the last row when nothing must wait.
    """
    if ev.height == 0:
        return 0
    groups = _tie_groups(ev).group_by("_grp").agg(
        pl.col("seq").min().alias("lo"), pl.col("seq").max().alias("hi"),
        pl.col("thread_id").first(), pl.len().alias("n"),
    )
    last = groups.group_by("thread_id").agg(pl.col("_grp").max())
    open_ends = last.filter(pl.col("thread_id").is_in(sorted(continuing)))["_grp"]
    spans = groups.with_columns(
        pl.when(pl.col("_grp").is_in(open_ends.implode())).then(pl.lit(_NO_END)).otherwise(pl.col("hi")).alias("hi")
    ).filter(pl.col("hi") > pl.col("lo"))
    p = int(ev["seq"].max()) + 1  # type: ignore[arg-type]
    while True:
        hit = spans.filter((pl.col("lo") < p) & (pl.col("hi") >= p))
        if hit.height == 0:
            return p
        p = int(hit["lo"].min())  # type: ignore[arg-type]


def _carry_rows(rows: pl.DataFrame, open_ids: pl.Series) -> pl.DataFrame:
    """The enter rows of the calls still open, re-tied so each keeps exactly the
    tie group it had among the carried rows (normalisation then orders them as before)."""
    groups = _tie_groups(rows)
    carried = rows.with_columns(groups["_grp"]).filter(pl.col("seq").is_in(open_ids.implode()))
    return (
        carried.with_columns(
            pl.when((pl.col("_grp") == pl.col("_grp").shift(1).over("thread_id")).fill_null(False))
            .then(pl.lit(1, dtype=pl.Int8))
            .otherwise(pl.lit(0, dtype=pl.Int8))
            .alias("tie")
        )
        .drop("_grp")
        .sort("seq")
    )


def analyze_rounds(
    chunks: Iterable[pl.DataFrame], modules: pl.DataFrame, *, complete: bool = True
) -> Iterator[Round]:
    """One rank's event chunks, in seq order -> the spans and issues of each round.

    Input: event frames (``EVENT_SCHEMA``) of one rank, consecutive in seq,
    and the rank's module frame.  Output: rounds whose spans, together, are
    the rank's span rows (``time_spans``'s columns), each span once, and
    whose issues, together, are its nesting issues (``collect_issues``);
    ``complete`` as there (it matters only to the last round).
    """
    carry = empty_events()
    child_ns = pl.DataFrame(schema={"span_id": pl.Int64(), "_carried_ns": pl.Int64()})
    pending = empty_events()
    it = iter(chunks)
    chunk = next(it, None)
    while chunk is not None:
        following = next(it, None)
        final = following is None
        frame = pl.concat([pending, conform(chunk, EVENT_SCHEMA)], rechunk=False)
        if final:
            now, pending = frame, empty_events()
        else:
            assert following is not None
            heads = following.group_by("thread_id").agg(pl.col("tie").first())
            continuing = set(heads.filter(pl.col("tie") == 1)["thread_id"].to_list())
            p = safe_cut(frame, continuing)
            now, pending = frame.filter(pl.col("seq") < p), frame.filter(pl.col("seq") >= p)
        chunk = following
        if now.height == 0:
            continue
        now, invalid = validate(now, modules)  # checked per round: a gap or reversal across rounds goes unseen
        rows = pl.concat([carry, now], rechunk=True)
        ev = normalize_events(rows, modules)
        pairing = pair_events(ev)
        spans = time_spans(pairing.pairs)
        issues = collect_issues(ev, pairing, modules, complete=complete if final else True)
        if invalid.height:
            issues = pl.concat([invalid, issues]).sort("rank", "seq", "kind")
        # Children written in earlier rounds count against their (carried) parent's self time.
        if child_ns.height:
            spans = (
                spans.join(child_ns, on="span_id", how="left", maintain_order="left")
                .with_columns((pl.col("self_ns") - pl.col("_carried_ns").fill_null(0)).alias("self_ns"))
                .drop("_carried_ns")
            )
        if final:
            yield Round(spans, issues)
            return
        still_open = spans.filter(pl.col("exit_seq").is_null())
        closed = spans.filter(pl.col("exit_seq").is_not_null())
        open_ids = still_open["span_id"]
        child_ns = (
            pl.concat([
                child_ns,
                closed.filter(pl.col("parent_span_id").is_in(open_ids.implode()))
                .group_by(pl.col("parent_span_id").alias("span_id"))
                .agg(pl.col("duration_ns").sum().alias("_carried_ns")),
            ])
            .group_by("span_id")
            .agg(pl.col("_carried_ns").sum())
            .filter(pl.col("span_id").is_in(open_ids.implode()))
        )
        carry = _carry_rows(rows, open_ids)
        yield Round(closed, issues.filter(pl.col("kind") != "unclosed"))


# --- I/O: the one part that touches the store ----------------------------------------------


def event_total(store: Store, run_id: int, rank: int | None = None) -> int:
    """The largest number of events one rank of the run (or ``rank``) has written."""
    from modtrace.store.reader import _mark, driver_cursor

    m = _mark(store)
    sql = f"SELECT max(event_count) FROM run_ranks WHERE run_id = {m}"
    params: tuple[int, ...] = (run_id,)
    if rank is not None:
        sql += f" AND rank = {m}"
        params = (run_id, rank)
    with driver_cursor(store, "modtrace_total") as cur:
        cur.execute(sql, params)
        row = cur.fetchone()
    return int(row[0] or 0) if row else 0


def materialize_streamed(
    store: Store, run_id: int, *, rank: int | None = None, complete: bool | None = None,
    chunk_rows: int = CHUNK_ROWS,
) -> tuple[int, pl.DataFrame]:
    """Rebuild and store run ``run_id``'s spans and issues (only ``rank``'s when given) in rounds.

    Returns (number of spans stored, issues frame).  The run's (rank's)
    stored rows are replaced in one transaction, as ``materialize`` does.
    """
    from modtrace.analysis.events import PHASE_ENUM
    from modtrace.analysis.nesting import ISSUE_SCHEMA
    from modtrace.store.analysis_store import _insert
    from modtrace.store.reader import iter_event_chunks, read_modules, read_ranks, read_run_status

    ranks = read_ranks(store, run_id) if rank is None else [rank]
    if complete is None:
        complete = read_run_status(store, run_id, rank) == "completed"
    where = f"run_id = {int(run_id)}" + ("" if rank is None else f" AND rank = {int(rank)}")
    n_spans = 0
    found: list[pl.DataFrame] = []
    with store.engine.begin() as conn:
        conn.exec_driver_sql(f"DELETE FROM span_rows WHERE {where}")
        conn.exec_driver_sql(f"DELETE FROM nesting_issues WHERE {where}")
        for r in ranks:
            modules = read_modules(store, run_id, ranks=[r])
            chunks = iter_event_chunks(store, run_id, r, chunk_rows=chunk_rows)
            for part in analyze_rounds(chunks, modules, complete=complete):
                _insert(conn, store, "span_rows", SPAN_ROW_COLUMNS, part.spans.select(SPAN_ROW_COLUMNS))
                issues = part.issues.with_columns(pl.col("phase").cast(pl.String)).select(ISSUE_COLUMNS)
                _insert(conn, store, "nesting_issues", ISSUE_COLUMNS, issues)
                n_spans += part.spans.height
                if part.issues.height:
                    found.append(part.issues)
    if not found:
        return n_spans, empty_issues()
    schema = {**ISSUE_SCHEMA, "phase": PHASE_ENUM}
    return n_spans, pl.concat(found).cast(schema).sort("rank", "seq", "kind")  # type: ignore[arg-type]


__all__ = ["CHUNK_ROWS", "STREAM_ABOVE", "Round", "analyze_rounds", "event_total", "materialize_streamed",
           "safe_cut", "SPAN_ROW_SCHEMA"]
