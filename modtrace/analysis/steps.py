"""Steps: which rule a run's steps follow, the steps under it, and their kinds.

The recorder writes two things a step can be made of: the recorded step
counter (``events.step``, advanced by optimizer steps and ``Recorder.step()``,
or by ``Recorder.step()`` alone under ``manual``), and root calls
(``root_calls``: each outermost module call of any thread, with its
input shape).  Which of them makes the steps is decided here, after the
fact, so ``tree``, ``diff`` and ``report`` can choose again (``--step-on``):

``resolve_rule`` (``modtrace.core.step_rules``)
    ``auto`` (the recorder's default) -> the recorded steps when the run
    made any, else root calls.  A training loop keeps its optimizer steps
    (gradient accumulation: several root calls per step; Lightning: forward
    and backward inside ``optimizer.step``), an inference loop gets one step
    per ``model(...)``.
``assign_steps``
    A frame with ``rank``, ``span_id`` and ``step`` (spans, or a diff's
    calls) -> the same frame with ``step`` under the rule.  Under ``root`` a
    step starts at every root call and at every recorded step boundary, and
    holds every span its thread entered until the next one (the backward of
    a forward included); steps are numbered from 0 per rank, in order.
``step_starts``
    Where each thread's spans enter another step: the compact form of every
    span's step that the store keeps with a run's step table.
``step_kinds``
    The kind of each step: the input shape of the first root call in it
    (``input_ids=1x7`` for a prompt, ``input_ids=1x1`` for a decode step),
    null for a step without one.  ``kind_counts``, ``common_kind`` and
    ``of_kind`` let a comparison put like next to like.

Pure functions of frames; nothing here reads a database.
"""

from __future__ import annotations

import polars as pl

from modtrace.core.contracts import ROOT_FRAME, STEP_RULES
from modtrace.core.step_rules import StepRuleError, resolve_rule

__all__ = ["STEP_RULES", "StepRuleError", "assign_steps", "common_kind", "kind_counts", "of_kind", "resolve_rule",
           "step_keys", "step_kinds", "step_starts"]

ALL_KINDS = "all"

# root_calls as the analysis reads them
ROOT_SCHEMA: dict[str, pl.DataType] = ROOT_FRAME.polars()
KIND_SCHEMA: dict[str, pl.DataType] = {"rank": pl.Int32(), "step": pl.Int32(), "kind": pl.String()}


def assign_steps(frame: pl.DataFrame, roots: pl.DataFrame, rule: str) -> pl.DataFrame:
    """``frame`` (``rank``, ``span_id``, ``step``, any other columns) with ``step`` under ``rule``.

    The recorded steps (``optimizer``, ``manual``) are the frame's own.
    Under ``root`` (``roots``: ``ROOT_SCHEMA``) a step is a pair (recorded
    step, root call), numbered densely per rank, root calls in start order
    whatever thread made them; rows keep their order.  A span belongs to the
    latest root call its own thread (``thread_id``) entered before it: a
    request's calls stay with their request while other threads serve
    others.  Spans of a thread that entered none before them (autograd's
    device threads running a backward) belong to the latest root call of
    the rank.  The ``span_steps`` view of the schema reads the steps this
    assigns under the run's own rule, stored with its analysis (``step_starts``).
    """
    if rule != "root" or frame.height == 0:
        return frame
    dtype = frame.schema["step"]
    keyed = _root_pairs(frame, roots, int(roots.height) + 1)
    return keyed.with_columns((pl.col("step").rank("dense").over("rank") - 1).cast(dtype))


def step_keys(frame: pl.DataFrame, roots: pl.DataFrame, rule: str) -> pl.Series:
    """Per row of ``frame`` (as for ``assign_steps``), an Int64 equal for two rows of a rank exactly
    where ``assign_steps`` gives them the same step, however many rows and root calls come later
    (so that a run read in parts can be grouped by step part by part): the recorded step, or
    under ``root`` the pair (recorded step, root call) as one integer.  ``roots``: every root
    call of the rank up to the frame's last row, in the numbering the whole run's give them
    (the rank's first root calls, none missing)."""
    if rule != "root" or frame.height == 0:
        recorded: pl.Series = frame.get_column("step").cast(pl.Int64)
        return recorded
    columns = ("rank", "span_id", "step", *(("thread_id",) if "thread_id" in frame.columns else ()))
    return _root_pairs(frame.select(columns), roots, 1 << 32).get_column("step")


def _root_pairs(frame: pl.DataFrame, roots: pl.DataFrame, width: int) -> pl.DataFrame:
    """``frame`` with ``step`` (Int64) the pair (recorded step, the ordinal of the root call the
    row belongs to, from 1; 0 before any) as ``step * width + ordinal``; rows keep their order."""
    bounds = (
        roots.select(pl.col("rank").cast(pl.Int32).alias("_rk"), pl.col("seq").cast(pl.Int64).alias("_root"),
                     pl.col("thread_id").cast(pl.Int32).alias("_th"))
        .sort("_rk", "_root")
        .with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).over("_rk").alias("_ord"))
        .sort("_root")
    )
    threaded = "thread_id" in frame.columns
    tagged = frame.with_row_index("_row").with_columns(
        pl.col("rank").cast(pl.Int32).alias("_rk"), pl.col("span_id").cast(pl.Int64).alias("_at"),
        (pl.col("thread_id").cast(pl.Int32) if threaded else pl.lit(None, pl.Int32)).alias("_th"),
    ).sort("_at")
    on_thread = tagged.join_asof(
        bounds.filter(pl.col("_th").is_not_null()).select("_rk", "_th", "_root", pl.col("_ord").alias("_ord_t")),
        left_on="_at", right_on="_root", by=["_rk", "_th"], strategy="backward", check_sortedness=False,
    ).drop("_root")
    joined = on_thread.join_asof(
        bounds.select("_rk", "_root", "_ord"), left_on="_at", right_on="_root", by="_rk", strategy="backward",
        check_sortedness=False,
    )
    root = pl.coalesce("_ord_t", "_ord", pl.lit(0, pl.Int64))
    pair = pl.col("step").cast(pl.Int64) * width + root
    return (
        joined.with_columns(pair.alias("step"))
        .sort("_row")
        .drop("_row", "_rk", "_at", "_th", "_root", "_ord", "_ord_t")
    )


def step_starts(frame: pl.DataFrame) -> pl.DataFrame:
    """A frame with ``rank``, ``thread_id``, ``span_id`` and ``step`` (steps already assigned) ->
    where each thread's spans enter another step: the thread's first span and every span whose
    step is not the step of the thread's span before it (``rank``, ``thread_id``, ``span_id``,
    ``step``, and ``nth``: the row's place among its thread's, from 1).  A span's step is the
    step of the latest of these at or before it on its thread: a few rows per step rather than
    one per span (the ``span_steps`` view reads them)."""
    rows = frame.select(
        pl.col("rank").cast(pl.Int32), pl.col("thread_id").cast(pl.Int32), pl.col("span_id").cast(pl.Int64),
        pl.col("step").cast(pl.Int32),
    )
    # The step before a span on its thread is the previous row of its (rank, thread) in span
    # order.  Spans come sorted by (rank, span_id) from the analysis: then each thread's rows
    # are already in span order, and only the few starts are sorted, not every span.
    in_order = rows.select(((pl.col("rank").diff() > 0) | ((pl.col("rank").diff() == 0) & (pl.col("span_id").diff() > 0)))
                           .all()).item()
    if not in_order:  # (rank, span_id) as one integer where it fits: a sort of one column costs half
        r0, r1, s0, s1 = rows.select(pl.col("rank").min().alias("r0"), pl.col("rank").max().alias("r1"),
                                     pl.col("span_id").min().alias("s0"), pl.col("span_id").max().alias("s1")).row(0)
        fits = None not in (r0, s0) and (r1 - r0 + 1) * (s1 - s0 + 1) < 1 << 62
        rows = rows.sort((pl.col("rank").cast(pl.Int64) - r0) * (s1 - s0 + 1) + (pl.col("span_id") - s0)) if fits else (
            rows.sort("rank", "span_id"))
    changed = pl.col("step") != pl.col("step").shift(1).over("rank", "thread_id")
    starts = rows.filter(changed.fill_null(True)).sort("rank", "thread_id", "span_id")
    return starts.with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int32).over("rank", "thread_id").alias("nth"))


def step_kinds(frame: pl.DataFrame, roots: pl.DataFrame) -> pl.DataFrame:
    """Every (rank, step) of ``frame`` (steps already assigned) with its kind (``KIND_SCHEMA``):
    the kind of its first root call, null when none of its spans is a root call."""
    steps = frame.select(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int32)).unique()
    heads = (
        frame.select(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int32),
                     pl.col("span_id").cast(pl.Int64))
        .join(roots.select(pl.col("rank").cast(pl.Int32), pl.col("seq").cast(pl.Int64).alias("span_id"),
                           pl.col("kind").cast(pl.String)), on=["rank", "span_id"])
        .sort("span_id")
        .group_by("rank", "step", maintain_order=True)
        .agg(pl.col("kind").first())
    )
    return steps.join(heads, on=["rank", "step"], how="left").sort("rank", "step").select(list(KIND_SCHEMA))


def kind_counts(kinds: pl.DataFrame) -> list[tuple[str | None, int]]:
    """(kind, steps) of ``step_kinds``, most steps first (then by name; no kind last among equals)."""
    counts = kinds.group_by("kind").agg(pl.len().alias("n")).rows()
    return sorted(((k, int(n)) for k, n in counts), key=lambda kn: (-kn[1], kn[0] is None, kn[0] or ""))


def common_kind(*kinds: pl.DataFrame) -> str | None:
    """The kind with the most steps over these runs among the kinds every one of them has;
    None when they have at most one kind between them (nothing to choose) or none in common.
    Steps without a root call have no kind: they are never chosen, and never make a choice."""
    sets = [set(k["kind"].to_list()) - {None} for k in kinds]
    if len(set().union(*sets)) <= 1:
        return None
    shared = set.intersection(*sets)
    total: dict[str, int] = {}
    for k in kinds:
        for kind, n in kind_counts(k):
            if kind is not None and kind in shared:
                total[kind] = total.get(kind, 0) + n
    if not total:
        return None
    return sorted(total.items(), key=lambda kn: (-kn[1], kn[0]))[0][0]


def of_kind(frame: pl.DataFrame, kinds: pl.DataFrame, kind: str | None) -> pl.DataFrame:
    """The rows of ``frame`` in steps of ``kind`` (null: steps without a root call)."""
    chosen = kinds.filter(pl.col("kind").is_null() if kind is None else pl.col("kind") == kind)
    keys = chosen.select(pl.col("rank").cast(frame.schema["rank"]), pl.col("step").cast(frame.schema["step"]))
    return frame.join(keys, on=["rank", "step"], how="semi")
