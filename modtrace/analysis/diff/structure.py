"""Structure: what is called, in which phase, how often and where, compared between two runs.

One row per finding (``STRUCTURE_SCHEMA``; the kinds and when each is found: docs/diff.md,
"Structure"); ``order_changed`` comes from ``order``.
"""

from __future__ import annotations

import polars as pl

from modtrace.analysis.diff.frames import (
    CALLS_SCHEMA,
    PHASES,
    STRUCTURE_SCHEMA,
    key_fqn,
    key_module,
    key_phase,
    key_phase_name,
    of_phases,
)
from modtrace.analysis.events import lookup_key


def _joined(values: pl.Expr) -> pl.Expr:
    return values.drop_nulls().cast(pl.String).unique().sort().str.join(",")


def placement(compared: pl.DataFrame, devices: pl.DataFrame, phases: tuple[str, ...] | None) -> pl.DataFrame:
    """Compared calls with ``mkey`` -> (mkey, device, stream): each module's device names and
    streams, comma-joined."""
    sp = of_phases(compared, phases)
    names = devices.select(
        lookup_key("rank", "device_id").alias("_dk"), pl.col("name").cast(pl.String).alias("device")
    ).unique("_dk")
    return (
        sp.select("rank", "mkey", "device_id", "stream").unique()
        .with_columns(lookup_key("rank", "device_id").alias("_dk"))
        .join(names, on="_dk", how="left")
        .group_by("mkey")
        .agg(_joined(pl.col("device")).alias("device"), _joined(pl.col("stream")).alias("stream"))
    )


def compare_structure(
    base: pl.DataFrame, cand: pl.DataFrame, names: pl.DataFrame,
    placed_base: pl.DataFrame, placed_cand: pl.DataFrame,
) -> pl.DataFrame:
    """Filled samples and placements of two runs -> structure findings (``STRUCTURE_SCHEMA``), except order."""
    rows: list[dict[str, str | None]] = []
    fqns = names["fqn"]

    def per_key(samples: pl.DataFrame, alias: str) -> pl.DataFrame:
        return samples.group_by("key").agg(pl.col("calls").median().alias(alias))

    calls_b, calls_c = per_key(base, "b"), per_key(cand, "c")
    changed_calls = {(r["fqn"], r["phase"]): r for r in calls_per_step(base, cand, names).iter_rows(named=True)}
    mods_b = {fqns[key_module(int(k))] for k in calls_b["key"].to_list()}
    mods_c = {fqns[key_module(int(k))] for k in calls_c["key"].to_list()}
    for fqn, n in collapse_subtrees(mods_b - mods_c):
        rows.append(structure_row("module_removed", fqn, None, "called", "not called",
                         f"{fqn}{_and(n)} is not called in the candidate"))
    for fqn, n in collapse_subtrees(mods_c - mods_b):
        rows.append(structure_row("module_added", fqn, None, "not called", "called", f"{fqn}{_and(n)} is new in the candidate"))

    both = (
        calls_b.join(calls_c, on="key", how="full", coalesce=True)
        .with_columns(key_fqn(pl.col("key"), names).alias("fqn"), key_phase_name(pl.col("key")).alias("phase"))
        .filter(pl.col("fqn").is_in(list(mods_b & mods_c)))
        .sort("fqn", key_phase(pl.col("key")))
    )
    for phase in PHASES:
        of_phase = both.filter(pl.col("phase") == phase)
        added = dict(of_phase.filter(pl.col("b").is_null()).select("fqn", "c").iter_rows())
        for fqn, n in collapse_subtrees(set(added)):
            rows.append(structure_row("phase_added", fqn, phase, "none", _calls(added[fqn]),
                             f"{fqn}{_and(n)} has {phase} calls in the candidate only ({_calls(added[fqn])}/step)"))
        removed = dict(of_phase.filter(pl.col("c").is_null()).select("fqn", "b").iter_rows())
        for fqn, n in collapse_subtrees(set(removed)):
            rows.append(structure_row("phase_removed", fqn, phase, _calls(removed[fqn]), "none",
                             f"{fqn}{_and(n)} has no {phase} calls in the candidate (base: {_calls(removed[fqn])}/step)"))
    for fqn, phase, b, c in both.drop_nulls(["b", "c"]).select("fqn", "phase", "b", "c").iter_rows():
        varying = changed_calls.get((fqn, phase))
        if varying is not None:
            if varying["changed"]:
                db, dc = _spread(varying, "base"), _spread(varying, "cand")
                rows.append(structure_row("calls_changed", fqn, phase, db, dc,
                                          f"{fqn} {phase}: {db} -> {dc} calls per step (ranges do not overlap)"))
        elif b != c:
            rows.append(structure_row("calls_changed", fqn, phase, _calls(b), _calls(c),
                             f"{fqn} {phase}: {_calls(b)} -> {_calls(c)} calls per step"))

    where = (
        placed_base.join(placed_cand, on="mkey", suffix="_c")
        .with_columns(pl.lit(fqns).gather(pl.col("mkey")).alias("fqn"))
        .sort("fqn")
    )
    for what in ("device", "stream"):
        for fqn, b, c in where.filter(pl.col(what) != pl.col(f"{what}_c")).select("fqn", what, f"{what}_c").iter_rows():
            b, c = b or "none", c or "none"
            rows.append(structure_row(f"{what}_changed", fqn, None, b, c, f"{fqn} runs on {what} {c} (base: {b})"))
    return pl.DataFrame(rows, schema=STRUCTURE_SCHEMA) if rows else pl.DataFrame(schema=STRUCTURE_SCHEMA)


def calls_per_step(base: pl.DataFrame, cand: pl.DataFrame, names: pl.DataFrame) -> pl.DataFrame:
    """Filled samples of two runs -> ``CALLS_SCHEMA``: the (module, phase) keys of both runs whose
    calls per step vary from step to step in either run, with each side's min, median and max, and
    ``changed`` when the two ranges do not overlap."""

    def spread(samples: pl.DataFrame, side: str) -> pl.DataFrame:
        c = pl.col("calls").cast(pl.Float64)
        return samples.group_by("key").agg(
            c.min().alias(f"{side}_min"), c.median().alias(f"{side}_median"), c.max().alias(f"{side}_max")
        )

    both = spread(base, "base").join(spread(cand, "cand"), on="key")
    varying = both.filter((pl.col("base_min") != pl.col("base_max")) | (pl.col("cand_min") != pl.col("cand_max")))
    return (
        varying.with_columns(
            key_fqn(pl.col("key"), names).alias("fqn"), key_phase_name(pl.col("key")).alias("phase"),
            ((pl.col("cand_max") < pl.col("base_min")) | (pl.col("cand_min") > pl.col("base_max"))).alias("changed"),
        )
        .sort("fqn", key_phase(pl.col("key")))
        .select(list(CALLS_SCHEMA))
        .cast(CALLS_SCHEMA)  # type: ignore[arg-type]
    )


def _spread(row: dict[str, float], side: str) -> str:
    lo, mid, hi = row[f"{side}_min"], row[f"{side}_median"], row[f"{side}_max"]
    return _calls(lo) if lo == hi else f"{_calls(lo)}-{_calls(hi)} (median {_calls(mid)})"


def collapse_subtrees(fqns: set[str]) -> list[tuple[str, int]]:
    """Sorted fqns with their descendants folded in: (topmost fqn, number of descendants in the set)."""
    out: list[tuple[str, int]] = []
    for fqn in sorted(fqns):
        if out and fqn.startswith(out[-1][0] + "."):
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((fqn, 0))
    return out


def _and(n: int) -> str:
    return "" if n == 0 else f" (and {n} submodule{'' if n == 1 else 's'})"


def _calls(value: float | None) -> str:
    if value is None:
        return "none"
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def structure_row(kind: str, fqn: str | None, phase: str | None, base: str, cand: str, message: str) -> dict[str, str | None]:
    return {"kind": kind, "fqn": fqn, "phase": phase, "base": base, "cand": cand, "message": message}
