"""Step times at one machine speed: each step against the speed probe taken before it.

A run recorded with the speed probe (``modtrace.recording.speed_probe``) timed the same fixed
work just before each recorded step.  These functions turn a run's steps into the measures the
step verdict weighs ("wall", "cpu", "cpu_raw"; ``step.measure_step``), defined once in
docs/diff.md ("The step").  A step takes the latest probe on its rank taken before its first
call (by event seq) and not already taken by the step before.
"""

from __future__ import annotations

from collections.abc import Sequence

import polars as pl

from modtrace.core.codes import ProbeWork

# A probe counts for at most this many times its rank's median in a step's CPU time: above it, it
# was preempted and the CPU clock beside it had stopped (docs/diff.md, "The step").
PROBE_CAP = 1.5


def probed_units(compared: pl.DataFrame, units: pl.DataFrame, speeds: pl.DataFrame | None) -> pl.DataFrame:
    """Step units (rank, step, step_ns) with ``probe_ns``, the probe taken in the gap before each
    step (null where none was), ``window_cpu_ns``, the thread's CPU time from it to the next probe,
    and ``share``, that over the host's time (at most 1; a window without one takes the run's
    median share); both null where the run noted no CPU time (an injected clock)."""
    if speeds is None or speeds.height == 0 or units.height == 0:
        return units.with_columns(pl.lit(None, pl.Int64).alias("probe_ns"), pl.lit(None, pl.Int64).alias("window_cpu_ns"),
                                  pl.lit(None, pl.Float64).alias("share"))
    starts = compared.group_by("rank", "step").agg(pl.col("span_id").min().cast(pl.Int64).alias("_start")).with_columns(
        pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int32))
    nxt_cpu, nxt_real = (pl.col(c).shift(-1).over("rank", order_by="seq") for c in ("cpu_ns", "real_ns"))
    cpu, share = nxt_cpu - pl.col("cpu_ns"), (nxt_cpu - pl.col("cpu_ns")) / (nxt_real - pl.col("real_ns"))
    windows = speeds.with_columns(pl.when(cpu > 0).then(cpu).alias("window_cpu_ns"),
                                  pl.when(share > 0).then(pl.min_horizontal(share, pl.lit(1.0))).alias("share"))
    probes = windows.select(pl.col("rank").cast(pl.Int32), pl.col("seq").alias("_probe_seq"), "probe_ns",
                                          pl.col("window_cpu_ns").cast(pl.Int64), "share").sort("_probe_seq")
    timed = units.join(starts, on=["rank", "step"], how="left").sort("_start")
    matched = timed.join_asof(probes, left_on="_start", right_on="_probe_seq", by="rank", strategy="backward",
                              check_sortedness=False)  # both sorted on the key; by rank within it
    # a probe matched by the step before too is that step's, not this one's
    taken = pl.col("_probe_seq").shift(1).over("rank", order_by="_start")
    own = pl.col("_probe_seq").is_not_null() & (taken.is_null() | (taken != pl.col("_probe_seq")))
    return (matched.with_columns(*(pl.when(own).then(pl.col(c)).otherwise(None).alias(c) for c in ("probe_ns", "window_cpu_ns")),
                                 pl.col("share").fill_null(pl.col("share").median().over("rank")).cast(pl.Float64))
            .drop("_start", "_probe_seq").sort("rank", "step"))


def probe_works(speeds: Sequence[pl.DataFrame | None]) -> list[int]:
    """The work (``ProbeWork``) each run's probes timed, in run order, for the runs that took any
    (``RunCalls.speeds``); a probe recorded before revision 0019 (NULL) timed the forward only."""
    out: list[int] = []
    for s in speeds:
        if s is not None and s.height:
            works = s["work"].fill_null(int(ProbeWork.FORWARD)).unique().to_list()
            out.extend(int(w) for w in works)
    return out


def unprobed(sides: Sequence[pl.DataFrame]) -> int:
    """How many runs (``probed_units`` frames) have a compared step without its own probe."""
    return sum(1 for units in sides if units.height == 0 or units["probe_ns"].null_count() > 0)


def lacking(sides: Sequence[pl.DataFrame], column: str) -> int:
    """How many runs (``probed_units`` frames) have a probed step without ``column``: ``share``
    (no CPU share noted) or ``window_cpu_ns`` (no window of CPU time)."""
    return sum(1 for units in sides if units.filter(pl.col("probe_ns").is_not_null())[column].null_count() > 0)


def at_shares(sides: Sequence[pl.DataFrame]) -> list[pl.DataFrame]:
    """Each run's probes at its steps' share of the machine (probe_ns / share), when every run
    noted its shares; else the probes as timed, for every run alike."""
    if lacking(sides, "share"):
        return [u.drop("share", "window_cpu_ns") for u in sides]
    return [u.with_columns((pl.col("probe_ns") / pl.col("share")).round(0).cast(pl.Int64)).drop("share", "window_cpu_ns")
            for u in sides]


def reference_probe(history: Sequence[pl.DataFrame]) -> float:
    """The history's median probe: the speed step times are expressed at."""
    return float(pl.concat([u.select("probe_ns") for u in history])["probe_ns"].median())  # type: ignore[arg-type]


def adjusted(units: pl.DataFrame, reference: float) -> pl.DataFrame:
    """Step units with ``step_ns`` at the reference speed: step_ns * reference / probe_ns."""
    return units.select("rank", "step", (pl.col("step_ns") * reference / pl.col("probe_ns")).round(0).cast(pl.Int64))


def _capped_probe() -> pl.Expr:
    return pl.min_horizontal(pl.col("probe_ns"), pl.col("probe_ns").median().over("rank") * PROBE_CAP)


def _cpu_work() -> pl.Expr:
    return pl.max_horizontal(pl.col("window_cpu_ns") - _capped_probe(), pl.lit(0))


def cpu_per_step(units: pl.DataFrame) -> pl.DataFrame:
    """``probed_units`` of one or more runs (ranks apart) -> (rank, step, step_ns): the step's
    window of CPU time less its probe, capped at ``PROBE_CAP`` times the rank's median."""
    return units.select("rank", "step", _cpu_work().round(0).cast(pl.Int64).alias("step_ns"))


def cpu_at_speed(units: pl.DataFrame, reference: float) -> pl.DataFrame:
    """``cpu_per_step`` times ``reference`` over the step's probe (capped as there)."""
    return units.select("rank", "step", (_cpu_work() * reference / _capped_probe()).round(0).cast(pl.Int64)
                        .alias("step_ns"))
