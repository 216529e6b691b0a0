"""Streamed analysis: a large run's events in chunks, with open calls carried across.

``analyze_events`` holds a whole run in memory: fine for millions of
events, not for a long multi-rank recording.  Here one rank's events arrive
as chunks in seq order (read by ``modtrace.results.materialize``: a server-side
cursor on PostgreSQL), and each *round* analyses what is safe to analyse so
far with the same pure steps (normalise, pair, time, check):

- a round ends at a *safe cut*: a seq no hook-dispatch tie group straddles,
  so tie normalisation sees whole groups (rows after the cut wait for the
  next round).  A group is a thread's tie=0 row and the tied rows after it on
  that thread, wherever other threads' rows fall between, so whether a
  thread's last group goes on is read from that thread's next row, looked for
  up to ``LOOKAHEAD_ROWS`` ahead; a round's first row on a thread starts a
  group (it never joins a carried call's);
- validation (``validate``) sees each round with the rows before it that its
  checks compare with (the rank's last seq, each thread's last usable row),
  so a gap or a reversal across a cut is reported as in one piece;
- spans still open at the cut are *carried*: their enter rows open the next
  round's frame, so the calls they enclose get the right parent and depth,
  and their own exit, when it comes, closes them.  The time of their
  children already written is carried too, so self time is exact;
- a round yields the spans it closed and its issues; calls left open are
  reported (``unclosed``) only by the last round, with the run's
  completeness.

Memory is bounded by a chunk (and the lookahead), the carried stack and one
round's spans; the result is the same as the one-piece analysis for any
stream whose stacks nest (healthy or cut short by a crash), and for a
corrupted one whose one-piece issues hold no ``crossed``, ``duplicate_enter``
or ``duplicate_exit`` (tests/analysis/test_stream.py).  What rounds alone get wrong:
they do not remember calls closed in earlier rounds, so a call exited again
across a cut is reported ``no_enter`` (not ``duplicate_exit``) and one
entered again is not reported; and the calls a ``crossed`` exit sets aside
are carried back onto the stack, so the calls after them may get them as
parent and a later exit may be reported ``crossed`` again.

``analyze_rank`` is the analysis of a rank: these rounds, plus a second look
where a cut could matter.  A round that reports a crossed, no_enter,
duplicate or reentered call, or enters again a call an earlier round closed
on the same stack, sends the rank back through as one round (the one-piece
analysis), so its result never depends on where the cuts fell, nor on the
run's size (tests/analysis/test_stream.py checks it on healthy and corrupted streams).

Pure: chunks in, rounds out.  ``modtrace.results.materialize`` reads the chunks from
the store and writes the rounds back.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator
from dataclasses import dataclass

import polars as pl

from modtrace.analysis.events import EVENT_SCHEMA, conform, empty_events, normalize_events
from modtrace.analysis.nesting import collect_issues
from modtrace.analysis.spans import pair_events, time_spans
from modtrace.analysis.validate import validate
from modtrace.core.contracts import CROSSED, DUPLICATE_ENTER, DUPLICATE_EXIT, NO_ENTER, REENTERED

_NO_END = 1 << 62


# The rank's module frame, or a function giving it as it is now: a rank analysed while it is
# recorded (``results.incremental``) registers modules as it goes, each before its first event.
Modules = pl.DataFrame | Callable[[], pl.DataFrame]


@dataclass(frozen=True)
class Round:
    """What one round closed: span rows (``SPAN_ROW_COLUMNS``, codes) and issues (``ISSUE_FRAME_COLUMNS``).

    ``restart``: this round is the rank's whole analysis, in place of every
    earlier round of it (``analyze_rank``)."""

    spans: pl.DataFrame
    issues: pl.DataFrame
    restart: bool = False


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


# How many rows past a chunk the rounds look for a thread's next row (is it tied to its
# last dispatch?).  Healthy recordings write a dispatch's rows back to back, so the next
# chunk answers; a corrupted stream may separate them by other threads' rows.
LOOKAHEAD_ROWS = 1 << 16


def _continuing(frame: pl.DataFrame, ahead: list[pl.DataFrame], pull: Callable[[], bool]) -> set[int]:
    """Threads of ``frame`` whose next row (in the chunks ``ahead``, pulled as needed up to
    ``LOOKAHEAD_ROWS`` rows) is tied: their last tie group goes on after ``frame``."""
    threads = set(frame["thread_id"].unique().to_list())
    out: set[int] = set()
    seen = 0
    i = 0
    while threads:
        if i == len(ahead):
            if seen >= LOOKAHEAD_ROWS or not pull():
                break
        part = ahead[i]
        i += 1
        seen += part.height
        heads = part.filter(pl.col("thread_id").is_in(sorted(threads))).group_by("thread_id").agg(pl.col("tie").first())
        for tid, tie in heads.iter_rows():
            threads.discard(tid)
            if tie == 1:
                out.add(tid)
    return out


def _fresh_groups(now: pl.DataFrame) -> pl.DataFrame:
    """``now`` with each thread's first row starting a tie group: a round's rows never
    join the tie group of a carried row (their groups were whole in an earlier round)."""
    first = pl.int_range(pl.len()).over("thread_id") == 0
    return now.with_columns(pl.when(first).then(pl.lit(0, dtype=pl.Int8)).otherwise(pl.col("tie")).alias("tie"))


def _validate(
    now: pl.DataFrame, context: pl.DataFrame, modules: pl.DataFrame
) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """Validate one round's rows as part of the whole stream: ``context`` holds the rows
    before them that the checks compare with (the rank's last row, each thread's last
    usable row).  Returns (usable rows, their issues, the context for the next round)."""
    usable, issues = validate(pl.concat([context, now]), modules)
    seqs = now["seq"].implode()
    issues = issues.filter(pl.col("seq").is_in(seqs))
    per_thread = usable.group_by("thread_id").agg(pl.all().last()).select(list(EVENT_SCHEMA))
    new_context = pl.concat([per_thread, now.tail(1)]).unique("seq").sort("seq")
    return usable.filter(pl.col("seq").is_in(seqs)), issues, conform(new_context, EVENT_SCHEMA)


def analyze_rounds(
    chunks: Iterable[pl.DataFrame], modules: Modules, *, complete: bool = True
) -> Generator[Round, None, None]:
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
    context = empty_events()
    it = iter(chunks)
    ahead: list[pl.DataFrame] = []
    exhausted = False

    def pull() -> bool:
        nonlocal exhausted
        if exhausted:
            return False
        got = next(it, None)
        if got is None:
            exhausted = True
            return False
        ahead.append(conform(got, EVENT_SCHEMA))
        return True

    pull()
    while ahead:
        chunk = ahead.pop(0)
        if not ahead:
            pull()
        final = not ahead
        frame = pl.concat([pending, chunk], rechunk=False)
        if final:
            now, pending = frame, empty_events()
        else:
            p = safe_cut(frame, _continuing(frame, ahead, pull))
            now, pending = frame.filter(pl.col("seq") < p), frame.filter(pl.col("seq") >= p)
        if now.height == 0 and not (final and carry.height):
            continue
        mods = modules() if callable(modules) else modules
        now, invalid, context = _validate(now, context, mods)
        rows = pl.concat([carry, _fresh_groups(now)], rechunk=True)
        ev = normalize_events(rows, mods)
        pairing = pair_events(ev)
        spans = time_spans(pairing.pairs, pairing.child_ns)
        issues = collect_issues(ev, pairing, mods, complete=complete if final else True)
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


# Issue kinds whose rows a cut can change (see the module's docstring): a call's story
# told across rounds that do not remember its earlier rounds.
_CUT_SENSITIVE = (CROSSED, NO_ENTER, DUPLICATE_ENTER, DUPLICATE_EXIT, REENTERED)
# A call on one stack: a repeated enter of a closed one is a duplicate_enter only the
# one-piece walk names (rounds forget closed calls).
_STACK_CALL = ("thread_id", "_task", "call_id", "phase")


def _stack_calls(spans: pl.DataFrame) -> pl.DataFrame:
    forward = pl.col("phase") == 0
    return spans.select(
        "thread_id", pl.when(forward).then(None).otherwise(pl.col("graph_task")).alias("_task"), "call_id", "phase",
    )


class _Closed:
    """The stack calls (``_STACK_CALL``) earlier rounds closed, a frame per round with the range
    of its call ids.  Call ids are handed out in call order, so a round's calls meet only the
    rounds whose ranges they fall in: a round is checked against a few earlier ones, not the
    whole rank (which made a long rank's rounds cost more and more).  Calls without an id are
    kept apart (a semi join matches them too: ``nulls_equal``)."""

    def __init__(self) -> None:
        self._parts: list[tuple[pl.DataFrame, int, int]] = []
        self._no_id: pl.DataFrame | None = None

    def add(self, calls: pl.DataFrame) -> None:
        no_id = calls.filter(pl.col("call_id").is_null())
        if no_id.height:
            self._no_id = no_id if self._no_id is None else pl.concat([self._no_id, no_id])
            calls = calls.filter(pl.col("call_id").is_not_null())
        if calls.height:
            ids = calls.get_column("call_id")
            self._parts.append((calls, int(ids.min()), int(ids.max())))  # type: ignore[arg-type]

    def meets(self, calls: pl.DataFrame) -> bool:
        """Whether one of ``calls`` is a call an earlier round closed."""
        def hit(some: pl.DataFrame, frame: pl.DataFrame) -> bool:
            return bool(some.height and some.join(frame, on=list(_STACK_CALL), how="semi", nulls_equal=True).height)

        if self._no_id is not None and hit(calls.filter(pl.col("call_id").is_null()), self._no_id):
            return True
        ids = calls.get_column("call_id")
        if not self._parts or ids.null_count() == calls.height:
            return False
        low, high = int(ids.min()), int(ids.max())  # type: ignore[arg-type]
        return any(hit(calls.filter(pl.col("call_id").is_between(first, last)), frame)
                   for frame, first, last in self._parts if first <= high and last >= low)


def analyze_rank(
    chunks: Callable[[], Iterable[pl.DataFrame]], modules: Modules, *, complete: bool = True
) -> Iterator[Round]:
    """The analysis of one rank: its events in rounds, as ``analyze_rounds`` cuts them,
    with results identical to the one-piece analysis on every stream.

    ``chunks()`` gives the rank's event chunks in seq order, from the start, each
    time it is called.  A rank that is one round is the one-piece analysis.
    Rounds of a stream whose calls nest (healthy, or cut short by a crash)
    equal it too.  Where a cut could change what is reported (a round finds
    a crossed, no_enter, duplicate or reentered call, or enters again a call
    an earlier round closed), the rank is analysed again as one round over
    all its chunks, yielded with ``restart`` set: it replaces the rounds
    yielded before it.  Memory is then the rank's, as in one piece; it is
    bounded by a round only on the streams that need no second look.
    """
    closed = _Closed()
    rounds = analyze_rounds(chunks(), modules, complete=complete)
    first = True
    # Each round is yielded as soon as it is checked, not once the next is made: the
    # caller writes it while the next is read and analysed (``materialize``).
    for part in rounds:
        calls = _stack_calls(part.spans).filter(pl.col("phase") != 2)
        unsafe = bool(part.issues["kind"].is_in(_CUT_SENSITIVE).any()) or closed.meets(calls)
        if unsafe and first and next(rounds, None) is None:  # the rank is one round: the one-piece analysis
            yield part
            return
        first = False
        if unsafe:
            rounds.close()
            whole = pl.concat([conform(c, EVENT_SCHEMA) for c in chunks()], rechunk=True)
            (once,) = analyze_rounds([whole], modules, complete=complete)
            yield Round(once.spans, once.issues, restart=True)
            return
        closed.add(calls)
        yield part


__all__ = ["Round", "analyze_rank", "analyze_rounds", "safe_cut"]
