"""Which rank and which module held each step back, from the ranks' reduced times.

Input: the reduction ``store.stragglers.reduce_ranks`` makes in the database, per (step,
module, phase) over the ranks and per (step, rank); nothing here grows with the ranks beyond
one row per (step, rank).  The rule (docs/ranks.md, "Stragglers"):

- A module's **excess** in a step is its slowest rank's self time minus the median of the other
  ranks' (with two ranks, the other rank's).  It counts when above the **noise bar**: the largest
  of 100 us, 5% of the step, 3x the module's step-to-step spread (the median absolute deviation
  over steps of the other ranks' median) and, with 4 ranks or more, 2x the ranks' interquartile
  range in that step.
- A rank waiting for another at a collective inside a module also shows an excess there, but it
  leaves the module when the others do (on the wall clock the ranks share): an excess whose rank
  left the module less than half the excess after the others' median is that wait, not a
  straggler.
- The **straggler** is the largest excess left.  A rank above the modules' medians in two
  thirds of them or more, whose own time over the medians passes 100 us, 5% of the step and 3x
  its step-to-step spread, by a ratio of 1.1 or more, and is not half in any one module, is a
  **slow rank**: it is named with its ratio instead of a module.
- **Where others waited**: the other ranks' median time outside every module span (wall minus
  busy time) beyond the straggler's own, and the modules where they waited for it.
- **What-if**: the step (the slowest rank's wall time) less the straggler's excess, not below
  the other ranks' own step: the most time one of them spent inside module calls, plus the
  straggler's own time outside them (the optimizer step, data: what every rank does); never
  above the step.
- **Persistent**: a straggler named in at least half the steps, by median excess.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

FLOOR_NS = 100_000
STEP_SHARE = 0.05
STEP_SPREAD_K = 3.0
RANK_SPREAD_K = 2.0
WAIT_SHARE = 0.5
SLOW_RANK_ABOVE = 2 / 3
SLOW_RANK_TOP_SHARE = 0.5
SLOW_RANK_RATIO = 1.1
PERSISTENT_SHARE = 0.5

STEP_COLUMNS = {
    "step": pl.Int64, "step_ns": pl.Int64, "kind": pl.String, "rank": pl.Int64, "fqn": pl.String,
    "phase": pl.String, "excess_ns": pl.Int64, "ratio": pl.Float64, "bar_ns": pl.Int64,
    "what_if_step_ns": pl.Int64, "waited_outside_ns": pl.Int64, "waited_fqn": pl.String,
    "waited_phase": pl.String, "waited_ns": pl.Int64,
}
PERSISTENT_COLUMNS = {
    "kind": pl.String, "rank": pl.Int64, "fqn": pl.String, "phase": pl.String, "steps": pl.Int64,
    "median_excess_ns": pl.Int64, "ratio": pl.Float64, "what_if_step_ns": pl.Int64,
}


@dataclass(frozen=True)
class Stragglers:
    """Per step the straggler (``kind`` ``module`` or ``rank``, null when none), and the
    persistent ones; the steps compared, and those left out because not every rank had them."""

    ranks: int
    steps: pl.DataFrame  # STEP_COLUMNS, one row per step compared
    persistent: pl.DataFrame  # PERSISTENT_COLUMNS, by median excess
    left_out: list[int] = field(default_factory=list)
    skipped: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape: ``steps`` and ``persistent`` (docs/ranks.md)."""
        steps = []
        for r in self.steps.iter_rows(named=True):
            who = None
            if r["kind"] is not None:
                who = {"kind": r["kind"], "rank": r["rank"], "fqn": r["fqn"], "phase": r["phase"],
                       "excess_ns": r["excess_ns"], "ratio": r["ratio"]}
            waited = None
            if r["kind"] is not None:
                inside = None if r["waited_fqn"] is None else {
                    "fqn": r["waited_fqn"], "phase": r["waited_phase"], "ns": r["waited_ns"]}
                waited = {"outside_ns": r["waited_outside_ns"], "inside": inside}
            steps.append({"step": r["step"], "step_ns": r["step_ns"], "straggler": who, "waited": waited,
                          "what_if_step_ns": r["what_if_step_ns"]})
        return {"ranks": self.ranks, "steps": steps, "persistent": self.persistent.to_dicts(),
                "left_out_steps": self.left_out, "skipped": self.skipped}


def _mad(col: str) -> pl.Expr:
    return (pl.col(col) - pl.col(col).median()).abs().median()


def find_stragglers(modules: pl.DataFrame, ranks: pl.DataFrame, *, world: int,
                    left_out: list[int] | None = None) -> Stragglers:
    """The stragglers of the steps in ``ranks`` (``store.stragglers.RankTables``' frames)."""
    per_step = ranks.group_by("step").agg(pl.col("wall_ns").max().alias("step_ns"))
    cells = _module_cells(modules, per_step)
    module_pick = _module_stragglers(cells)
    rank_pick = _slow_ranks(ranks, per_step)
    steps = _choose(per_step, module_pick, rank_pick, ranks)
    steps = _waited(steps, ranks, cells).sort("step")
    return Stragglers(world, steps.select(list(STEP_COLUMNS)).cast(STEP_COLUMNS),  # type: ignore[arg-type]
                      _persistent(steps), sorted(left_out or []))


def _module_cells(modules: pl.DataFrame, per_step: pl.DataFrame) -> pl.DataFrame:
    """Each (step, module, phase) with its excess, noise bar and whether it counts."""
    ref = pl.coalesce("others_ns", "median_ns")
    frame = modules.with_columns(ref.alias("ref_ns")).with_columns(
        _mad("ref_ns").over("fqn", "phase").alias("spread_ns"))
    frame = frame.join(per_step, on="step", how="left")
    iqr = pl.when(pl.col("ranks") >= 4).then(RANK_SPREAD_K * (pl.col("q3_ns") - pl.col("q1_ns"))).otherwise(0.0)
    bar = pl.max_horizontal(pl.lit(float(FLOOR_NS)), STEP_SHARE * pl.col("step_ns"),
                            STEP_SPREAD_K * pl.col("spread_ns"), iqr)
    return frame.with_columns((pl.col("max_ns") - pl.col("ref_ns")).alias("excess_ns"), bar.alias("bar_ns")).with_columns(
        (pl.col("excess_ns") > pl.col("bar_ns")).alias("counts"))


def _module_stragglers(cells: pl.DataFrame) -> pl.DataFrame:
    """Per step the largest counted excess whose rank left the module after the others (by half
    the excess or more): one that left with them was waiting at a collective, not slower."""
    kept = cells.filter(pl.col("counts") & (pl.col("max_late_ns") >= WAIT_SHARE * pl.col("excess_ns")))
    return (kept.sort("step", "excess_ns", "max_rank", descending=[False, True, False])
            .group_by("step", maintain_order=True).first()
            .select("step", pl.col("max_rank").alias("rank"), "fqn", "phase", "excess_ns", "bar_ns"))


def _slow_ranks(ranks: pl.DataFrame, per_step: pl.DataFrame) -> pl.DataFrame:
    """Per step the rank slower in most modules alike, if any, with its excess and ratio."""
    frame = ranks.join(per_step, on="step").with_columns(
        (pl.col("self_ns") - pl.col("median_sum_ns")).alias("excess_ns"))
    frame = frame.with_columns(_mad("excess_ns").over("rank").alias("spread_ns")).with_columns(
        pl.max_horizontal(pl.lit(float(FLOOR_NS)), STEP_SHARE * pl.col("step_ns"),
                          STEP_SPREAD_K * pl.col("spread_ns")).alias("bar_ns"))
    slow = frame.filter(
        (pl.col("excess_ns") > pl.col("bar_ns"))
        & (pl.col("self_ns") >= SLOW_RANK_RATIO * pl.col("median_sum_ns"))
        & (pl.col("above") >= SLOW_RANK_ABOVE * pl.col("cells"))
        & (pl.col("top_excess_ns") < SLOW_RANK_TOP_SHARE * pl.col("excess_ns")))
    return (slow.with_columns((pl.col("self_ns") / pl.col("median_sum_ns")).alias("ratio"))
            .sort("step", "excess_ns", descending=[False, True]).group_by("step", maintain_order=True).first()
            .select("step", pl.col("rank").alias("r_rank"), pl.col("excess_ns").alias("r_excess"),
                    pl.col("ratio"), pl.col("bar_ns").alias("r_bar")))


def _choose(per_step: pl.DataFrame, module_pick: pl.DataFrame, rank_pick: pl.DataFrame,
            ranks: pl.DataFrame) -> pl.DataFrame:
    """A slow rank replaces a module of its own, and wins over another rank's smaller excess; the
    what-if step is not below the other ranks' own step."""
    frame = per_step.join(module_pick, on="step", how="left").join(rank_pick, on="step", how="left")
    as_rank = pl.col("r_rank").is_not_null() & (
        pl.col("rank").is_null() | (pl.col("rank") == pl.col("r_rank")) | (pl.col("r_excess") > pl.col("excess_ns")))
    frame = frame.with_columns(
        pl.when(as_rank).then(pl.lit("rank")).when(pl.col("rank").is_not_null()).then(pl.lit("module"))
        .otherwise(pl.lit(None, dtype=pl.String)).alias("kind"))
    is_rank = pl.col("kind") == "rank"
    frame = frame.with_columns(
        pl.when(is_rank).then(pl.col("r_rank")).otherwise(pl.col("rank")).alias("rank"),
        pl.when(is_rank).then(pl.lit(None, dtype=pl.String)).otherwise(pl.col("fqn")).alias("fqn"),
        pl.when(is_rank).then(pl.lit(None, dtype=pl.String)).otherwise(pl.col("phase")).alias("phase"),
        pl.when(is_rank).then(pl.col("r_excess")).otherwise(pl.col("excess_ns")).alias("excess_ns"),
        pl.when(is_rank).then(pl.col("ratio")).otherwise(pl.lit(None, dtype=pl.Float64)).alias("ratio"),
        pl.when(is_rank).then(pl.col("r_bar")).otherwise(pl.col("bar_ns")).alias("bar_ns"))
    # the others' own step: their time in module calls, and the time outside them that the
    # straggler (who waited for no one) had too
    joined = ranks.join(frame.select("step", pl.col("rank").alias("s_rank")), on="step")
    own = joined.filter(pl.col("rank") == pl.col("s_rank")).select(
        "step", (pl.col("wall_ns") - pl.col("busy_ns")).clip(lower_bound=0).alias("s_out"))
    busy = (joined.filter((pl.col("rank") != pl.col("s_rank")).fill_null(True))
            .group_by("step").agg(pl.col("busy_ns").max().alias("others_busy_ns"))
            .join(own, on="step", how="left")
            .select("step", (pl.col("others_busy_ns") + pl.col("s_out").fill_null(0)).alias("others_ns")))
    frame = frame.join(busy, on="step", how="left")
    what_if = pl.min_horizontal(pl.col("step_ns"),
                                pl.max_horizontal(pl.col("step_ns") - pl.col("excess_ns"), pl.col("others_ns")))
    return frame.with_columns(
        pl.when(pl.col("kind").is_null()).then(pl.col("step_ns")).otherwise(what_if).alias("what_if_step_ns"))


def _waited(steps: pl.DataFrame, ranks: pl.DataFrame, cells: pl.DataFrame) -> pl.DataFrame:
    """Where the other ranks waited for each step's straggler: outside every module span (their
    median beyond the straggler's own), and the module where they waited longest for it."""
    outside = ranks.select("step", "rank", (pl.col("wall_ns") - pl.col("busy_ns")).clip(lower_bound=0).alias("out"))
    own = outside.join(steps.select("step", pl.col("rank").alias("s_rank")), on="step")
    theirs = (own.filter(pl.col("rank") != pl.col("s_rank")).group_by("step").agg(pl.col("out").median().alias("o"))
              .join(own.filter(pl.col("rank") == pl.col("s_rank")).select("step", pl.col("out").alias("s")),
                    on="step", how="left")
              .select("step", (pl.col("o") - pl.col("s").fill_null(0)).clip(lower_bound=0).alias("waited_outside_ns")))
    # in a module: others slower than the straggler there (it was the fastest, or another rank
    # the slowest), beyond the bar, and not the straggler's own module
    waits = cells.join(steps.select("step", pl.col("rank").alias("s_rank"), pl.col("fqn").alias("s_fqn"),
                                    pl.col("phase").alias("s_phase")), on="step")
    waits = waits.with_columns(
        pl.when(pl.col("min_rank") == pl.col("s_rank")).then(pl.col("median_ns") - pl.col("min_ns"))
        .when(pl.col("max_rank") != pl.col("s_rank")).then(pl.col("excess_ns")).otherwise(0.0).alias("w"))
    waits = waits.filter((pl.col("w") > pl.col("bar_ns"))
                         & ~((pl.col("fqn") == pl.col("s_fqn")) & (pl.col("phase") == pl.col("s_phase"))).fill_null(False))
    top = (waits.sort("step", "w", descending=[False, True]).group_by("step", maintain_order=True).first()
           .select("step", pl.col("fqn").alias("waited_fqn"), pl.col("phase").alias("waited_phase"),
                   pl.col("w").alias("waited_ns")))
    out = steps.join(theirs, on="step", how="left").join(top, on="step", how="left")
    none = pl.col("kind").is_null()
    return out.with_columns(
        pl.when(none).then(None).otherwise(pl.col(c)).alias(c)
        for c in ("waited_outside_ns", "waited_fqn", "waited_phase", "waited_ns"))


def _persistent(steps: pl.DataFrame) -> pl.DataFrame:
    named = steps.filter(pl.col("kind").is_not_null())
    need = PERSISTENT_SHARE * steps.height
    frame = (named.group_by("kind", "rank", "fqn", "phase")
             .agg(pl.len().alias("steps"), pl.col("excess_ns").median().alias("median_excess_ns"),
                  pl.col("ratio").median().alias("ratio"), pl.col("what_if_step_ns").median().alias("what_if_step_ns"))
             .filter(pl.col("steps") >= need)
             .sort("median_excess_ns", "rank", descending=[True, False]))
    return frame.select(list(PERSISTENT_COLUMNS)).cast(PERSISTENT_COLUMNS)  # type: ignore[arg-type]
