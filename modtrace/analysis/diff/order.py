"""Call order: where the call sequences of two runs' aligned steps first differ, as an excerpt.

The k-th compared step of the lowest rank of each run is compared with the
other run's k-th, for the first k whose sequences differ
(``first_divergence``); ``Divergence.excerpt`` aligns the calls around the
first difference (``EXCERPT_SCHEMA``), and ``order_finding`` is its
``order_changed`` structure row.
"""

from __future__ import annotations

import difflib

import polars as pl

from modtrace.analysis.diff.frames import (
    EXCERPT_SCHEMA,
    PHASES,
    DiffOptions,
    Divergence,
    key_module,
    key_phase,
    of_phases,
    pack_key,
)
from modtrace.analysis.diff.structure import structure_row
from modtrace.analysis.events import lookup_key


def call_sequences(compared: pl.DataFrame, phases: tuple[str, ...] | None) -> pl.DataFrame:
    """Compared calls with ``mkey`` of the lowest rank -> its calls in call order (per step, per
    thread, threads in id order): rank, step, ``k`` (0-based ordinal of the step), key and depth."""
    sp = of_phases(compared, phases)
    if sp.height == 0:
        return pl.DataFrame()
    rank = sp["rank"].min()
    seq = sp.filter(pl.col("rank") == rank).select(
        "rank", "step", "span_id", lookup_key("step", "thread_id").alias("_st"),
        pack_key(pl.col("mkey"), pl.col("phase").cast(pl.Int64)).alias("key"), "depth",
    )
    # by (step, thread, span_id): two single-column sorts (the first is usually of sorted rows)
    seq = seq.sort("span_id").sort("_st", maintain_order=True)
    first = (pl.col("step") != pl.col("step").shift(1)).fill_null(True)
    return seq.select("rank", "step", (first.cast(pl.Int64).cum_sum() - 1).alias("k"), "key", "depth")


def order_varies(seq: pl.DataFrame) -> bool:
    """Whether a run's compared steps (``call_sequences``) differ in call order among themselves:
    data-dependent calls (routing, early exit), whose order between two runs is no structure
    change."""
    if seq.height == 0:
        return False
    pos = pl.int_range(pl.len()).over("k")
    sig = seq.group_by("k").agg(pl.struct(pos.alias("pos"), "key", "depth").hash().sum().alias("_h"), pl.len())
    return sig.select("_h", "len").n_unique() > 1


def first_divergence(seq_b: pl.DataFrame, seq_c: pl.DataFrame, names: pl.DataFrame,
                     options: DiffOptions) -> Divergence | None:
    """The first k-th compared step of each run whose call sequences differ, with an aligned excerpt.

    Steps of equal lengths line up row by row, so the runs are compared
    column against column up to the first step whose lengths differ.
    """
    if seq_b.height == 0 or seq_c.height == 0:
        return None
    steps = min(int(seq_b["k"].max()), int(seq_c["k"].max())) + 1  # type: ignore[arg-type]
    len_b = seq_b["k"].filter(seq_b["k"] < steps).value_counts(sort=False).sort("k")["count"]
    len_c = seq_c["k"].filter(seq_c["k"] < steps).value_counts(sort=False).sort("k")["count"]
    unequal = (len_b != len_c).arg_true()
    k_len = int(unequal[0]) if unequal.len() else steps  # the first step whose lengths differ
    rows = int(len_b.head(k_len).sum())
    a, b = seq_b.head(rows), seq_c.head(rows)
    differs = ((a["key"] != b["key"]) | (a["depth"] != b["depth"])).arg_true()
    k = int(a["k"][int(differs[0])]) if differs.len() else k_len
    if k >= steps:
        return None
    one_b = seq_b.filter(pl.col("k") == k)
    one_c = seq_c.filter(pl.col("k") == k)
    excerpt, position = _excerpt(one_b, one_c, names, options)
    return Divergence(
        rank_base=int(seq_b["rank"][0]), rank_cand=int(seq_c["rank"][0]),
        step_base=int(one_b["step"][0]), step_cand=int(one_c["step"][0]), position=position, excerpt=excerpt,
    )


def _display(phase: str, depth: int, fqn: str) -> str:
    return f"{phase:<9} {'  ' * depth}{fqn}"


def _excerpt(a: pl.DataFrame, b: pl.DataFrame, names: pl.DataFrame, options: DiffOptions) -> tuple[pl.DataFrame, int]:
    fqns = names["fqn"]
    la = list(a.select("key", "depth").iter_rows())
    lb = list(b.select("key", "depth").iter_rows())
    da = [_display(PHASES[key_phase(k)], d, fqns[key_module(k)]) for k, d in la]
    db = [_display(PHASES[key_phase(k)], d, fqns[key_module(k)]) for k, d in lb]
    ops = difflib.SequenceMatcher(None, la, lb, autojunk=False).get_opcodes()
    first = next(i for i, op in enumerate(ops) if op[0] != "equal")
    tag, i1, i2, j1, j2 = ops[first]
    rows: list[tuple[str, int | None, int | None, str | None, str | None]] = []
    ctx = options.excerpt_context
    for n in range(max(0, i1 - ctx), i1):
        rows.append(("=", n + 1, j1 - (i1 - n) + 1, da[n], db[j1 - (i1 - n)]))
    changed: list[tuple[str, int | None, int | None, str | None, str | None]] = []
    for n in range(max(i2 - i1, j2 - j1)):
        ia, ib = i1 + n, j1 + n
        has_a, has_b = ia < i2, ib < j2
        if has_a and has_b:
            changed.append(("~", ia + 1, ib + 1, da[ia], db[ib]))
        elif has_a:
            changed.append(("-", ia + 1, None, da[ia], None))
        else:
            changed.append(("+", None, ib + 1, None, db[ib]))
    rows.extend(changed[: options.excerpt_changes])
    if len(changed) > options.excerpt_changes:
        rows.append(("…", None, None, f"{len(changed) - options.excerpt_changes} more", None))
    for n in range(ctx):
        ia, ib = i2 + n, j2 + n
        if ia >= len(la) or ib >= len(lb) or la[ia] != lb[ib]:
            break
        rows.append(("=", ia + 1, ib + 1, da[ia], db[ib]))
    return pl.DataFrame(rows, schema=EXCERPT_SCHEMA, orient="row"), min(i1, j1) + 1



def order_finding(divergence: Divergence) -> dict[str, str | None]:
    """The ``order_changed`` structure row of a divergence."""
    first = divergence.excerpt.filter(pl.col("op") != "=").row(0, named=True)
    what = first["cand"] if first["base"] is None else first["base"]
    message = (
        f"call order differs from call {divergence.position} of step {divergence.step_base}"
        + ("" if divergence.step_base == divergence.step_cand else f" (candidate step {divergence.step_cand})")
        + f": {' '.join(str(what).split())}"
    )
    return structure_row("order_changed", None, None, f"step {divergence.step_base}",
                         f"step {divergence.step_cand}", message)
