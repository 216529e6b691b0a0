"""The module call tree folded round by round: ``module_tree`` of a rank's spans without
holding them to the end.

A rank analysed while it is recorded (``results.incremental``) closes its spans in rounds.
``TreeFold.add`` takes each round's spans (named, with ``_key``: their step as
``analysis.steps.step_keys`` gives it) and keeps only what the tree needs of them: per
call-path node and step the summed inclusive and self time, per node its calls, totals and
where it first appears, and the closed root spans that make step time.  ``TreeFold.tree``
merges those parts into the nodes frame ``module_tree`` gives for all the spans at once: the
same rows, computed from a few rows per node and step instead of every span.

A span's node is its parent's path and its own (phase, fqn), hashed as ``module_tree``
hashes it, so the node ids are the same.  A parent exits after its children, so a span whose
parent has not closed yet waits (``pending``) for a later round; one still waiting at the
end (its parent never closed, or closed in an earlier round: calls that did not nest) makes
the fold give up, and so does a pending set that grows past ``MAX_PENDING`` (a call open across
the whole run): the caller then computes the tree from all the spans, as before.

Pure: frames in, frames out.
"""

from __future__ import annotations

import polars as pl

from modtrace.analysis.aggregate import _own_hash, tree_frame
from modtrace.analysis.step_time import step_time
from modtrace.core.contracts import is_attributed

# Spans waiting for a parent beyond which the fold gives up: each round looks at them again.
MAX_PENDING = 200_000

# What the fold reads of a round's spans (named spans frame columns, and ``_key``).
FOLD_COLUMNS = ("rank", "span_id", "parent_span_id", "depth", "fqn", "module_type", "phase", "status",
                "start_ns", "duration_ns", "self_ns", "_key")

class TreeFold:
    """``module_tree`` of a rank's spans, given round by round (see the module's docstring)."""

    def __init__(self) -> None:
        self.broken: str | None = None  # why the fold gave up, if it did
        self._pending: pl.DataFrame | None = None
        # Per (node, rank, step key) sums: those of steps before the latest round's first step
        # are settled (each with its range of keys), the rest stay open to later rounds.
        self._per_step: list[tuple[pl.DataFrame, int, int]] = []
        self._open: pl.DataFrame | None = None
        self._per_node: list[pl.DataFrame] = []
        self._roots: list[pl.DataFrame] = []

    def give_up(self, why: str) -> None:
        """Stop folding (the caller computes the tree from every span instead)."""
        if self.broken is None:
            self.broken = why
        self._pending = self._open = None
        self._per_step, self._per_node, self._roots = [], [], []

    def add(self, spans: pl.DataFrame) -> None:
        """Fold in one round's spans (``FOLD_COLUMNS``)."""
        if self.broken is not None or spans.height == 0:
            return
        work = spans.select(FOLD_COLUMNS).with_columns(_own_hash(), is_attributed().alias("_attributed"))
        if self._pending is not None:
            work = pl.concat([self._pending, work], how="vertical_relaxed")
        placed, waiting = _place(work)
        self._pending = waiting if waiting.height else None
        if waiting.height > MAX_PENDING:
            self.give_up(f"{waiting.height:,} spans wait for a parent")
            return
        if placed.height == 0:
            return
        sums = placed.group_by("node_id", "rank", "_key").agg(
            pl.col("duration_ns").sum().alias("_inc"), pl.col("self_ns").sum().alias("_self"))
        self._settle(sums, int(sums.get_column("_key").min()))  # type: ignore[arg-type]
        node_sums = placed.group_by("node_id").agg(
            pl.col("parent_node_id").first(),
            pl.col("fqn").cast(pl.String).first(),
            pl.col("phase").first(),
            pl.len().cast(pl.Int64).alias("calls"),
            pl.col("duration_ns").sum().alias("inclusive_total_ns"),
            pl.col("self_ns").sum().alias("self_total_ns"),
            pl.col("_attributed").sum().cast(pl.Int64).alias("_attributed"),
            # where the node first appears: its lowest (rank, span id), and its module type there
            pl.col("rank").min().alias("_rank"),
            pl.col("span_id").filter(pl.col("rank") == pl.col("rank").min()).min().alias("_first"),
            pl.col("module_type").cast(pl.String).sort_by("rank", "span_id").first(),
        )
        # one row per node so far: a round adds a few hundred rows to merge, the end none
        self._per_node = [_merge_nodes([*self._per_node, node_sums])]
        roots = placed.filter((pl.col("depth") == 0) & pl.col("duration_ns").is_not_null())
        if roots.height:
            self._roots.append(roots.select("rank", "_key", "depth", "start_ns", "duration_ns"))

    def _settle(self, sums: pl.DataFrame | None, below: int | None) -> None:
        """Add a round's per-step ``sums`` to the open ones; settle those of steps below
        ``below`` (the round's first step: a later round rarely brings more of them, and
        ``tree`` checks that none did); None: settle all."""
        open_ = self._open if sums is None else sums if self._open is None else pl.concat([self._open, sums]).group_by(
            "node_id", "rank", "_key").agg(pl.col("_inc").sum(), pl.col("_self").sum())
        if open_ is None or open_.height == 0:
            self._open = None
            return
        done = open_ if below is None else open_.filter(pl.col("_key") < below)
        self._open = None if below is None else open_.filter(pl.col("_key") >= below)
        if done.height:
            keys = done.get_column("_key")
            self._per_step.append((done, int(keys.min()), int(keys.max())))  # type: ignore[arg-type]

    def tree(self) -> pl.DataFrame | None:
        """The nodes frame of every span added (``module_tree``'s), or None when the fold gave up
        or spans still wait for a parent (the caller computes it from the spans)."""
        if self.broken is not None:
            return None
        if self._pending is not None:
            self.give_up(f"{self._pending.height:,} spans found no parent")
            return None
        if not self._per_node:
            return None
        self._settle(None, None)
        per_step = _merge_settled(self._per_step)
        medians = per_step.group_by("node_id").agg(
            pl.len().alias("steps"),
            pl.col("_inc").median().alias("inclusive_median_ns"),
            pl.col("_self").median().alias("self_median_ns"),
        )
        agg = _merge_nodes(self._per_node).with_columns(pl.col("calls").cast(pl.UInt32))
        step_total = 0
        if self._roots:
            step_total = int(pl.concat(self._roots).rename({"_key": "step"}).group_by("rank", "step")
                             .agg(step_time().alias("_t"))["_t"].sum() or 0)
        return tree_frame(agg, medians, step_total)


def _merge_settled(parts: list[tuple[pl.DataFrame, int, int]]) -> pl.DataFrame:
    """Settled per-step sums, each with its range of step keys -> one frame of them, one row per
    (node, rank, step): where ranges overlap, a step's sums were settled before a later round
    brought more of it, and they are added up.  (Merging them into one frame as the run goes,
    sorted by node or not, saved the end no time: at 10M events the copy into one frame costs
    what grouping one frame saves, 0.18 against 0.19 s for 5M rows.)"""
    ranges = sorted((lo, hi) for _, lo, hi in parts)
    frame = pl.concat([f for f, _, _ in parts], rechunk=False) if len(parts) > 1 else parts[0][0]
    if any(lo <= hi for (_, hi), (lo, _) in zip(ranges, ranges[1:], strict=False)):
        frame = frame.group_by("node_id", "rank", "_key").agg(pl.col("_inc").sum(), pl.col("_self").sum())
    return frame


def _merge_nodes(parts: list[pl.DataFrame]) -> pl.DataFrame:
    """Per-node parts (as ``TreeFold.add`` makes them) -> one row per node: sums added, and the
    parent, names and module type of where the node first appears."""
    if len(parts) == 1:
        return parts[0]
    both = pl.concat(parts)
    firsts = both.sort("_rank", "_first").group_by("node_id", maintain_order=True).agg(
        pl.col("parent_node_id", "fqn", "phase", "module_type", "_rank", "_first").first())
    return both.group_by("node_id").agg(
        pl.col("calls", "inclusive_total_ns", "self_total_ns", "_attributed").sum(),
    ).join(firsts, on="node_id").select(both.columns)


def _place(work: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(spans whose call path is known, with ``node_id`` and ``parent_node_id``; spans whose
    parent is not among ``work``'s placed spans one level up), level by level from the roots."""
    placed: list[pl.DataFrame] = []
    waiting: list[pl.DataFrame] = []
    known: pl.DataFrame | None = None
    top = work.get_column("depth").max()
    for d in range(int(top) + 1 if top is not None else 0):  # type: ignore[arg-type]
        level = work.filter(pl.col("depth") == d)
        if d == 0:
            level = level.with_columns(pl.col("_own").alias("node_id"), pl.lit(None, pl.UInt64).alias("parent_node_id"))
        else:
            if known is None:
                waiting.append(level)
                continue
            level = level.join(known, on="parent_span_id", how="left")
            waiting.append(level.filter(pl.col("parent_node_id").is_null()).drop("parent_node_id"))
            level = level.filter(pl.col("parent_node_id").is_not_null()).with_columns(
                pl.struct("parent_node_id", "_own").hash().alias("node_id"))
        level = level.select(*work.columns, "node_id", "parent_node_id")
        placed.append(level)
        known = level.select(pl.col("span_id").alias("parent_span_id"), pl.col("node_id").alias("parent_node_id"))
    empty = work.clear()
    return (pl.concat(placed, how="vertical_relaxed") if placed else empty.with_columns(
                pl.lit(None, pl.UInt64).alias("node_id"), pl.lit(None, pl.UInt64).alias("parent_node_id")),
            pl.concat(waiting, how="vertical_relaxed") if waiting else empty)
