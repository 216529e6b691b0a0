"""One side of a diff, read from the store: a run's closed calls and its description.

A run never analysed is analysed in memory, nothing written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from modtrace.api._runs import Run, RunLike
from modtrace.core.errors import RunNotFound, UsageError

if TYPE_CHECKING:
    import polars as pl

    from modtrace.analysis.diff import DiffOptions, DiffResult, RunCalls
    from modtrace.store.engine import Store
    from modtrace.store.runs import RunRef


class Reader(Protocol):
    """What a diff reads of a database (``Database`` is one): a run resolved, a side read, its
    spans on a clock."""

    def _ref(self, ref: RunLike) -> Run: ...

    def _side(self, ref: RunLike, rank: int | None, step_on: str | None,
              clock: str) -> tuple[RunCalls, dict[str, Any]]: ...

    def _spans_on(self, run: Run, clock: str | None) -> pl.DataFrame: ...


def split_ref(db: Reader, ref: RunLike) -> tuple[Run, int | None]:
    """RUN or RUN:RANK -> (run, rank or None); a run whose name contains ':' still resolves whole."""
    if not isinstance(ref, str):
        return db._ref(ref), None
    try:
        return db._ref(ref), None
    except RunNotFound:
        head, sep, tail = ref.rpartition(":")
        if not sep or not head or not tail.isdigit():
            raise
    return db._ref(head), int(tail)


def _device_calls(db: Reader, run: Run, rank: int | None) -> RunCalls:
    """The run's closed calls with device times (from its spans: the fast read is of host times)."""
    import polars as pl

    from modtrace.analysis.diff import calls_of_spans

    spans = db._spans_on(run, "device")
    return calls_of_spans(spans if rank is None else spans.filter(pl.col("rank") == rank))


def load_side(db: Reader, store: Store, ref: RunLike, rank: int | None,
              step_on: str | None = None, clock: str = "host") -> tuple[RunCalls, dict[str, Any]]:
    """(closed calls of RUN[:RANK], or of ``rank``, steps under ``step_on``, times on ``clock``; its
    description for the diff document, holding under ``_stepped`` the calls' steps and kinds for
    ``like_with_like``)."""
    from modtrace.api._steps import restep
    from modtrace.results.materialize import load_calls

    run, ref_rank = split_ref(db, ref)
    if ref_rank is not None:
        rank = ref_rank
    if rank is not None:
        from modtrace.store.reader import read_ranks

        ranks = read_ranks(store, run.id)
        if rank not in ranks:
            raise UsageError(f"run {run.name!r} has no rank {rank} (ranks: {', '.join(map(str, ranks))})")
    if clock == "device":
        calls = _device_calls(db, run, rank)
    else:
        from dataclasses import replace

        from modtrace.store.speeds import read_speeds

        calls = load_calls(store, run.id, rank)
        speeds = read_speeds(store, run.id, rank)  # the speed probe times the host: host clock only
        if speeds.height:
            calls = replace(calls, speeds=speeds)
    stepped = restep(store, run.id, run.name, calls.calls, step_on, None if rank is None else [rank])
    if calls.calls.height == 0:
        raise UsageError(f"run {run.name!r} has no module calls to compare")
    from modtrace.store.runs import recorded_steps

    info: dict[str, Any] = {"run": run.name, "run_id": run.id, "db": store.label, "rank": rank, "clock": clock,
                            "_stepped": stepped}
    recorded = recorded_steps(store, run.id, rank)
    if recorded is not None:  # recorded under a schedule: which steps
        info["recorded_steps"] = recorded
    return calls, info


def like_with_like(base: tuple[RunCalls, dict[str, Any]], cand: tuple[RunCalls, dict[str, Any]],
                   kind: str | None) -> tuple[RunCalls, RunCalls]:
    """Both sides' calls in steps of one kind (``like_with_like_all`` of the two)."""
    base_calls, cand_calls = like_with_like_all([base, cand], kind)
    return base_calls, cand_calls


def no_common_step(base: dict[str, Any], cand: dict[str, Any]) -> str | None:
    """One line when both runs were recorded under schedules that share no recorded step; else None."""
    from modtrace.core.step_ranges import parse_ranges

    b, c = base.get("recorded_steps"), cand.get("recorded_steps")
    if b is None or c is None or parse_ranges(b) & parse_ranges(c):
        return None
    return (f"runs {base['run']!r} (recorded steps {b or 'none'}) and {cand['run']!r} (recorded steps "
            f"{c or 'none'}) have no recorded step in common: their schedules differ; steps are compared "
            "as samples all the same")


def diff_counters(base_store: Store, base: dict[str, Any], cand_store: Store, cand: dict[str, Any],
                  rank: int | None, phases: tuple[str, ...] | None) -> pl.DataFrame | None:
    """The work counters that differ between the sides (``analysis.diff.counters``), by
    step kind; None when a side counted no step (each side's ``rank`` as it was chosen).

    When the sides' steps share no kind (``unshared_kinds``: another batch size, another
    prompt length), each side's commonest kind is compared with the other's, under the kind
    ``BASE_KIND -> CAND_KIND``: twice the batch is twice the FLOPs of every module, a real
    difference that ``--fail-on counters`` must see, not a comparison silently skipped."""
    from modtrace.analysis.diff.counters import counter_changes
    from modtrace.store.counters import has_counters, read_counted_spans

    if not has_counters(base_store, base["run_id"]) or not has_counters(cand_store, cand["run_id"]):
        return None
    base_spans = _with_kept(base_store, base["run_id"], read_counted_spans(base_store, base["run_id"], base.get("rank", rank)))
    cand_spans = _with_kept(cand_store, cand["run_id"], read_counted_spans(cand_store, cand["run_id"], cand.get("rank", rank)))
    paired = unshared_kinds(base, cand)
    if paired is not None:
        base_spans, cand_spans = _relabelled(base_spans, paired[0], paired), _relabelled(cand_spans, paired[1], paired)
    return counter_changes(base_spans, cand_spans, phases)


def _with_kept(store: Store, run_id: int, spans: pl.DataFrame) -> pl.DataFrame:
    """The counted spans with their own kept memory (``kept_mem_bytes_self``, null where the run
    tracked none), which ``counter_changes`` compares like a counter."""
    from modtrace.store.memory import read_span_memory

    kept = read_span_memory(store, run_id).select("rank", "span_id", "kept_mem_bytes_self")
    return spans.join(kept, on=["rank", "span_id"], how="left", maintain_order="left")


def _kind_steps(info: dict[str, Any]) -> list[tuple[str, int]]:
    """A side's step kinds with their steps, most first (``Stepped.describe``); steps without a
    root call have no kind and are left out."""
    return [(k["kind"], int(k["steps"])) for k in info.get("step_kinds") or () if k["kind"] is not None]


def unshared_kinds(base: dict[str, Any], cand: dict[str, Any]) -> tuple[str, str] | None:
    """(the base's kind, the candidate's) to compare with each other when the sides' steps
    have kinds but none in common (each side's kind of the most steps); None when they share
    one, or a side's steps have no kind.  The sides are described by ``like_with_like_all``."""
    b, c = _kind_steps(base), _kind_steps(cand)
    if not b or not c or {k for k, _ in b} & {k for k, _ in c}:
        return None
    return b[0][0], c[0][0]


def _relabelled(spans: pl.DataFrame, kind: str, paired: tuple[str, str]) -> pl.DataFrame:
    import polars as pl

    label = f"{paired[0]} -> {paired[1]}"
    return spans.with_columns(pl.when(pl.col("kind") == kind).then(pl.lit(label)).otherwise(pl.col("kind")).alias("kind"))


def unshared_kinds_note(base: dict[str, Any], cand: dict[str, Any]) -> str | None:
    """One line for ``DiffResult.notes`` when the sides' steps share no kind: each side's
    kinds, and what was compared (``unshared_kinds``); else None."""
    paired = unshared_kinds(base, cand)
    if paired is None:
        return None

    def kinds(info: dict[str, Any]) -> str:
        return ", ".join(f"{k} ({n} step{'' if n == 1 else 's'})" for k, n in _kind_steps(info))

    others = len(_kind_steps(base)) + len(_kind_steps(cand)) > 2
    return (f"the runs' steps share no kind (base {base['run']!r}: {kinds(base)}; cand {cand['run']!r}: "
            f"{kinds(cand)}), so no step is compared with one of its own kind: structure and timing are "
            "compared over every step (a change of the whole step's time is the work's, not the code's), "
            f"work counters of kind {paired[0]} against kind {paired[1]}"
            + ("; the counters of the other kinds are not compared" if others else ""))


SELECTOR = "tag:"


def parse_selector(terms: Sequence[str]) -> dict[str, str] | None:
    """Base terms -> the tags a history's runs must all have (``tag:KEY=VALUE`` terms, AND-ed; a
    term may hold several separated by spaces); None when no term is a selector.  Raises
    ``UsageError`` for a malformed term, or selectors mixed with run references."""
    words = [w for t in terms for w in (t.split() if t.startswith(SELECTOR) else [t])]
    tagged = [w for w in words if w.startswith(SELECTOR)]
    if not tagged:
        return None
    if len(tagged) != len(words):
        plain = next(w for w in words if not w.startswith(SELECTOR))
        raise UsageError(f"base {plain!r}: give either runs or tag:KEY=VALUE selectors, not both")
    tags: dict[str, str] = {}
    for word in tagged:
        key, sep, value = word[len(SELECTOR):].partition("=")
        if not sep or not key.strip() or not value.strip():
            raise UsageError(f"bad selector {word!r}: write tag:KEY=VALUE (several are AND-ed)")
        if key in tags and tags[key] != value:
            raise UsageError(f"selectors {SELECTOR}{key}={tags[key]} and {word} can match no run")
        tags[key] = value
    return tags


def history_runs(store: Store, tags: dict[str, str], window: int, exclude: int | None) -> list[RunRef]:
    """The newest ``window`` completed runs having every tag, newest first, without run ``exclude``
    (the candidate, when it matches too).  None matching is a ``UsageError``."""
    from modtrace.store.runs import runs_tagged

    if window < 1:
        raise UsageError(f"window={window}: at least 1", cli=f"--window {window}: at least 1")
    found = [r for r in runs_tagged(store, tags) if r.id != exclude][:window]
    if not found:
        what = " ".join(f"{SELECTOR}{k}={v}" for k, v in tags.items())
        others = [r for r in runs_tagged(store, tags, status=None) if r.id != exclude]
        why = (f" ({len(others)} matching run{'s' if len(others) != 1 else ''} not completed)" if others else "")
        raise UsageError(f"no completed run matches {what} in {store.label}{why}; tag runs with "
                         "modtrace record --tag KEY=VALUE")
    return found


def like_with_like_all(sides: Sequence[tuple[RunCalls, dict[str, Any]]], kind: str | None) -> list[RunCalls]:
    """Every side's calls kept to steps of one kind (``api._steps.like_with_like``: None, the
    kind most steps share; ``all``, every step); the sides' descriptions lose ``_stepped`` and
    get their step rule, kinds and the kind compared.  Two sides, or a history and its candidate."""
    from dataclasses import replace

    from modtrace.api._steps import like_with_like as pick

    stepped = [(info["run"], info.pop("_stepped")) for _, info in sides]
    frames, chosen = pick(stepped, kind)
    for (_, info), (_, st) in zip(sides, stepped, strict=True):
        info.update(st.describe(), step_kind=chosen)
    return [replace(calls, calls=frame) for (calls, _), frame in zip(sides, frames, strict=True)]


def diff(base_db: tuple[Reader, Store], cand_db: tuple[Reader, Store], base: RunLike | Sequence[RunLike],
         cand: RunLike, options: DiffOptions | None, *, rank: int | None, step_on: str | None,
         step_kind: str | None, clock: str | None, window: int) -> DiffResult:
    """``Database.diff``: read the base runs (of ``base_db``, a database and its store) and the
    candidate (of ``cand_db``), each on one clock and in steps of one kind, judge them
    (``analysis.diff.diff_history``), and add what the store knows: the sides' descriptions, the
    notes, the work counters."""
    from dataclasses import replace

    from modtrace.analysis.diff import diff_history
    from modtrace.api._clock import common_clock

    (db, store), (other, other_store) = base_db, cand_db
    terms: list[RunLike] = [base] if isinstance(base, (str, int, Run)) else list(base)
    if not terms:
        raise UsageError("no base run to compare with")
    texts = [t for t in terms if isinstance(t, str)]
    tags = parse_selector(texts) if texts else None
    if tags is not None and len(texts) != len(terms):
        raise UsageError("give either runs or tag:KEY=VALUE selectors as the base, not both")
    cand_run = split_ref(other, cand)[0]
    bases: list[RunLike] = list(terms) if tags is None else [
        Run(r.id, r.name) for r in history_runs(store, tags, window, cand_run.id if other is db else None)]
    runs = [split_ref(db, b)[0] for b in bases]
    chosen = common_clock([(store, r.id, r.name) for r in runs] + [(other_store, cand_run.id, cand_run.name)], clock)
    sides = _read_sides(db, other, bases, cand, rank, step_on, chosen)
    calls = like_with_like_all(sides, step_kind)
    result = diff_history(calls[:-1], calls[-1], options)
    base_info, cand_info = dict(sides[0][1]), sides[-1][1]
    if len(bases) > 1:
        base_info["history"] = [{"run": info["run"], "run_id": info["run_id"], "step_us": round(ns / 1000.0, 3)}
                                for (_, info), ns in zip(sides[:-1], result.summary.history_run_step_ns, strict=True)]
    base_info["selector"] = None if tags is None else " ".join(f"{SELECTOR}{k}={v}" for k, v in tags.items())
    notes: list[str] = []
    if tags is not None and len(bases) == 1:
        notes.append(f"one base run matched {base_info['selector']}: a step-wide change cannot be told from "
                     "machine load with one base run; record more baseline runs")
    for note in (no_common_step(sides[0][1], cand_info), unshared_kinds_note(sides[0][1], cand_info)):
        if note is not None:
            notes.append(note)
    # Work counters are exact: the candidate against the newest base run.
    phases = None if options is None else options.phases
    counters = diff_counters(store, sides[0][1], other_store, cand_info, rank, phases)
    summary = replace(result.summary, counter_changes=0 if counters is None else counters.height)
    return replace(result, sides=(base_info, cand_info), notes=tuple(notes), counters=counters, summary=summary)


def _read_sides(db: Reader, other: Reader, bases: Sequence[RunLike], cand: RunLike, rank: int | None,
                step_on: str | None, clock: str) -> list[tuple[RunCalls, dict[str, Any]]]:
    """Every side's calls and description; two sides are read side by side (the database driver
    works without Python's lock: it paid end to end, docs/performance.md)."""
    if len(bases) != 1:
        return [db._side(b, rank, step_on, clock) for b in bases] + [other._side(cand, rank, step_on, clock)]
    from concurrent.futures import ThreadPoolExecutor

    import modtrace.store.samples  # noqa: F401 -- before the threads, which both import it

    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="modtrace-diff") as pool:
        base_read = pool.submit(db._side, bases[0], rank, step_on, clock)
        cand_read = pool.submit(other._side, cand, rank, step_on, clock)
        import modtrace.analysis.diff  # noqa: F401 -- this thread imports the comparison meanwhile

        return [base_read.result(), cand_read.result()]
