"""Event frames: the input contract of the analysis, and tie normalisation.

An *event frame* holds one run's rows of the ``events`` table, with the
store's integer codes (``modtrace.codes``), in these columns and dtypes
(``EVENT_SCHEMA``)::

    run_id Int32, rank Int32, seq Int64, ts_ns Int64, kind Int8,
    module_id Int32, phase Int8, call_id Int64, step Int32, thread_id Int32,
    device_id Int32 (null), stream Int64 (null), status Int8,
    graph_task Int64 (null), tie Int8

A *module frame* (``MODULE_SCHEMA``) and a *device frame* (``DEVICE_SCHEMA``)
hold the per-rank lookups.  ``modtrace.store.reader`` produces all three.

``normalize_events`` is the first analysis step: it orders every rank's rows
as the hierarchy happened (resolving hook-dispatch ties) and says which stack
each row belongs to.
"""

from __future__ import annotations

import polars as pl

from modtrace.codes import Kind, Phase, Status

EVENT_SCHEMA: dict[str, pl.DataType] = {
    "run_id": pl.Int32(),
    "rank": pl.Int32(),
    "seq": pl.Int64(),
    "ts_ns": pl.Int64(),
    "kind": pl.Int8(),
    "module_id": pl.Int32(),
    "phase": pl.Int8(),
    "call_id": pl.Int64(),
    "step": pl.Int32(),
    "thread_id": pl.Int32(),
    "device_id": pl.Int32(),
    "stream": pl.Int64(),
    "status": pl.Int8(),
    "graph_task": pl.Int64(),
    "tie": pl.Int8(),
}

MODULE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "module_id": pl.Int32(),
    "fqn": pl.String(),
    "module_type": pl.String(),
    "parent_module_id": pl.Int32(),
}

DEVICE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "device_id": pl.Int32(),
    "name": pl.String(),
}

# Readable values of the codes, as polars Enums whose physical index is the
# code itself, so a frame can carry names at the cost of integers.
PHASE_ENUM = pl.Enum([p.name.lower() for p in Phase])
STATUS_ENUM = pl.Enum([s.name.lower() for s in Status])

ENTER = int(Kind.ENTER)
EXIT = int(Kind.EXIT)


def empty_events() -> pl.DataFrame:
    return pl.DataFrame(schema=EVENT_SCHEMA)


def empty_modules() -> pl.DataFrame:
    return pl.DataFrame(schema=MODULE_SCHEMA)


def empty_devices() -> pl.DataFrame:
    return pl.DataFrame(schema=DEVICE_SCHEMA)


def conform(frame: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """``frame`` with exactly ``schema``'s columns and dtypes (missing nullable ones as null)."""
    cols = []
    for name, dtype in schema.items():
        if name in frame.columns:
            cols.append(pl.col(name).cast(dtype))
        else:
            cols.append(pl.lit(None, dtype=dtype).alias(name))
    return frame.select(cols)


def decode(expr: pl.Expr, enum: pl.Enum) -> pl.Expr:
    """Integer codes -> the Enum of their names (null stays null)."""
    names = list(enum.categories)
    return expr.replace_strict(list(range(len(names))), names, default=None, return_dtype=enum)


def module_depths(modules: pl.DataFrame) -> pl.DataFrame:
    """Module frame -> (rank, module_id, module_depth): 0 for a root, 1 for its children...

    Depth follows ``parent_module_id``; a cycle or a missing parent stops the
    walk (the module is then as deep as the chain that could be followed).
    """
    parent: dict[tuple[int, int], int | None] = {
        (r, m): p for r, m, p in modules.select("rank", "module_id", "parent_module_id").iter_rows()
    }
    depth: dict[tuple[int, int], int] = {}
    for key in parent:
        chain: list[tuple[int, int]] = []
        cur: tuple[int, int] | None = key
        seen: set[tuple[int, int]] = set()
        while cur is not None and cur in parent and cur not in depth and cur not in seen:
            seen.add(cur)
            chain.append(cur)
            p = parent[cur]
            cur = (cur[0], p) if p is not None else None
        base = depth[cur] + 1 if cur is not None and cur in depth else 0
        for i, k in enumerate(reversed(chain)):
            depth[k] = base + i
    return pl.DataFrame(
        [(r, m, d) for (r, m), d in depth.items()],
        schema={"rank": pl.Int32(), "module_id": pl.Int32(), "module_depth": pl.Int32()},
        orient="row",
    )


def with_stack(ev: pl.DataFrame) -> pl.DataFrame:
    """Add ``stack`` (Int64): one value per hierarchy the rows form.

    Forward rows stack per (rank, thread); backward and recompute rows per
    (rank, thread, graph task), so a recompute nests under the backward span
    open on its thread when it ran.  Layout: rank * 2**48 + thread * 2**32 +
    graph task number (0 for forward, 1 + its dense rank otherwise).
    """
    tasks = ev.filter(pl.col("phase") != int(Phase.FORWARD)).select(
        pl.col("graph_task").fill_null(-1).unique().sort()
    )
    task_no = tasks.with_columns(pl.int_range(1, pl.len() + 1, dtype=pl.Int64).alias("_task"))
    ev = ev.with_columns(
        pl.when(pl.col("phase") != int(Phase.FORWARD))
        .then(pl.col("graph_task").fill_null(-1))
        .alias("_gt")
    ).join(task_no.rename({"graph_task": "_gt"}), on="_gt", how="left", maintain_order="left")
    return ev.with_columns(
        (
            pl.col("rank").cast(pl.Int64) * (1 << 48)
            + pl.col("thread_id").cast(pl.Int64) * (1 << 32)
            + pl.col("_task").fill_null(0)
        ).alias("stack")
    ).drop("_gt", "_task")


def normalize_events(events: pl.DataFrame, modules: pl.DataFrame) -> pl.DataFrame:
    """Event frame -> the same rows in hierarchy order, with ``order`` and ``stack``.

    Input: an event frame and its module frame.  Output: the event frame's
    columns plus ``order`` (Int64: the seq slot the row takes once ties are
    resolved; equal to ``seq`` for untied rows) and ``stack`` (Int64, see
    ``with_stack``), sorted by (rank, order).

    A tie group is a row with ``tie = 0`` and the ``tie = 1`` rows that
    follow it on its thread (one autograd hook dispatch).  Within a group,
    exits come first, innermost first (reverse of the order their enters
    took), then enters, outermost first (module-tree ancestors before
    descendants).  The group keeps the seq values it had; only the rows
    move among them.
    """
    ev = conform(events, EVENT_SCHEMA).sort("rank", "seq")
    ev = ev.with_columns(pl.col("seq").alias("order"))
    if ev.height == 0 or not bool((ev["tie"] == 1).any()):
        return with_stack(ev)

    # Rows by thread (stable: seq order within a thread); a dispatch is a
    # tie=0 row and the tie=1 rows after it on its thread.
    thread_key = pl.col("rank").cast(pl.Int64) * (1 << 32) + pl.col("thread_id").cast(pl.Int64)
    by_thread = (
        ev.select(
            pl.int_range(pl.len(), dtype=pl.Int64).alias("_row"), thread_key.alias("_t"), "rank", "seq", "kind",
            "module_id", "phase", "call_id", "graph_task", "tie",
        )
        .sort("_t", maintain_order=True)
        .with_columns(
            ((pl.col("tie") == 0) | (pl.col("_t") != pl.col("_t").shift(1)).fill_null(True)).alias("_start"),
        )
        .with_columns(pl.col("_start").cum_sum().alias("_g"))
    )
    tied = by_thread.filter(
        (~pl.col("_start")) | (~pl.col("_start").shift(-1).fill_null(True))
    ).with_columns(pl.col("seq").min().over("_g").alias("_gstart"))
    depths = module_depths(modules)
    tied = tied.join(depths, on=["rank", "module_id"], how="left", maintain_order="left").with_columns(
        pl.col("module_depth").fill_null(0)
    )

    # The enter each tied exit closes: the latest enter of its call, phase and
    # graph task before it; its place in the normalised order is (group
    # start, module depth, seq), an untied enter being its own group.
    exits = tied.filter(pl.col("kind") == EXIT).select("_row", "rank", "seq", "call_id", "phase", "graph_task")
    key = ["rank", "call_id", "phase", "graph_task"]
    enters = ev.filter(pl.col("kind") == ENTER).select(*key, pl.col("seq").alias("_eseq"))
    matched = (
        exits.join(enters, on=key, how="inner", nulls_equal=True)
        .filter(pl.col("_eseq") < pl.col("seq"))
        .group_by("_row")
        .agg(pl.col("_eseq").max())
        .join(
            tied.filter(pl.col("kind") == ENTER).select(
                "rank", pl.col("seq").alias("_eseq"), pl.col("_gstart").alias("_eg"), pl.col("module_depth").alias("_ed")
            ),
            on="_eseq",
            how="left",
        )
        .with_columns(pl.col("_eg").fill_null(pl.col("_eseq")), pl.col("_ed").fill_null(0))
        .select("_row", "_eg", "_ed", "_eseq")
    )
    tied = tied.join(matched, on="_row", how="left")

    is_enter = pl.col("kind") == ENTER
    order = tied.select(
        "_row",
        "_g",
        "seq",
        is_enter.cast(pl.Int8).alias("_k0"),
        pl.when(is_enter).then(pl.col("module_depth").cast(pl.Int64)).otherwise(-pl.col("_eg")).alias("_k1"),
        pl.when(is_enter).then(pl.col("seq")).otherwise(-pl.col("_ed").cast(pl.Int64)).alias("_k2"),
        pl.when(is_enter).then(0).otherwise(-pl.col("_eseq")).alias("_k3"),
    )
    by_seq = order.sort("_g", "seq")
    by_key = order.sort("_g", "_k0", "_k1", "_k2", "_k3", "seq", nulls_last=True)
    # Row i of a group in key order takes the i-th seq slot (and row) of the group.
    perm = pl.select(pl.int_range(ev.height, dtype=pl.Int64)).to_series()
    perm.scatter(by_seq["_row"], by_key["_row"])
    slots = ev["seq"].alias("order")
    ev = ev[perm].with_columns(slots)
    return with_stack(ev)
