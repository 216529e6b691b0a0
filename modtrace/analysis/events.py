"""Event frames: the input contract of the analysis, and tie normalisation.

An *event frame* holds one run's rows of the ``events`` table, with the
store's integer codes (``modtrace.core.codes``), in these columns and dtypes
(``EVENT_SCHEMA``, from ``modtrace.core.contracts.EVENT_FRAME``)::

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

from modtrace.core.codes import Kind, Phase
from modtrace.core.contracts import DEVICE_FRAME, EVENT_FRAME, MODULE_FRAME, PHASES, STATUSES

EVENT_SCHEMA: dict[str, pl.DataType] = EVENT_FRAME.polars()
MODULE_SCHEMA: dict[str, pl.DataType] = MODULE_FRAME.polars()
DEVICE_SCHEMA: dict[str, pl.DataType] = DEVICE_FRAME.polars()

# Readable values of the codes, as polars Enums whose physical index is the
# code itself, so a frame can carry names at the cost of integers.
PHASE_ENUM = pl.Enum(list(PHASES))
STATUS_ENUM = pl.Enum(list(STATUSES))

ENTER = int(Kind.ENTER)
EXIT = int(Kind.EXIT)


def lookup_key(rank: str, code: str) -> pl.Expr:
    """One Int64 naming an Int32 (rank, code) pair: joins on it beat joins on two columns."""
    return pl.col(rank).cast(pl.Int64) * (1 << 32) + pl.col(code).cast(pl.Int64) + (1 << 31)


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
    names = pl.Series(list(enum.categories), dtype=enum)
    # A gather from the few names is several times faster than a replace.
    return pl.lit(names).gather(pl.when(expr.is_between(0, names.len() - 1)).then(expr))


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


def _stack_expr(ev: pl.DataFrame) -> pl.Expr:
    """The ``stack`` key of ``ev``'s rows as an expression (see ``with_stack``)."""
    backward = pl.col("phase") != int(Phase.FORWARD)
    task = pl.col("graph_task").fill_null(-1)
    lo, hi = ev.select(task.filter(backward).min(), task.filter(backward).max().alias("_hi")).row(0)
    if lo is None or (lo >= -1 and hi < (1 << 32) - 2):
        # Graph task ids are small counters: they number the stacks as they are.
        number = task + 2
    else:
        tasks = ev.select(task.filter(backward).unique().sort()).to_series()
        number = task.replace_strict(
            tasks, pl.int_range(1, tasks.len() + 1, eager=True), default=0, return_dtype=pl.Int64
        )
    return (
        pl.col("rank").cast(pl.Int64) * (1 << 48)
        + pl.col("thread_id").cast(pl.Int64) * (1 << 32)
        + pl.when(backward).then(number).otherwise(0)
    )


def with_stack(ev: pl.DataFrame) -> pl.DataFrame:
    """Add ``stack`` (Int64): one value per hierarchy the rows form.

    Forward rows stack per (rank, thread); backward, recompute and
    backward_call rows per (rank, thread, graph task), so a recompute (or a
    backward_call) nests under the backward span
    open on its thread when it ran.  The value is a key, not a number to
    read: rank * 2**48 + thread * 2**32 + a number for the graph task (0 for
    forward rows; for the others the task id + 2, a null task counting as
    -1, or 1 + the task's dense rank when ids do not fit in 32 bits).
    """
    return ev.with_columns(_stack_expr(ev).alias("stack"))


def _is_sorted(ev: pl.DataFrame) -> bool:
    """Whether ``ev`` is strictly ordered by (rank, seq) already (a sort then changes nothing)."""
    if ev.height < 2:
        return True
    step = pl.col("rank").diff()
    ok = (step > 0) | ((step == 0) & (pl.col("seq").diff() > 0))
    return bool(ev.select(ok.slice(1).fill_null(False).all()).item())


def _tie_moves(ev: pl.DataFrame, modules: pl.DataFrame) -> tuple[pl.Series, pl.Series] | None:
    """Which rows move to put ``ev``'s tie groups in hierarchy order: (slots, rows), or None.

    ``ev`` is sorted by (rank, seq).  Only the rows of groups of two or more
    are looked at; row ``rows[i]`` takes the place (seq slot) of row ``slots[i]``.
    """
    n = ev.height
    # A dispatch is a tie=0 row and the tie=1 rows after it on its thread;
    # rows of a thread are in seq order (a stable sort keeps them so).
    thread_key = pl.col("rank").cast(pl.Int64) * (1 << 32) + pl.col("thread_id").cast(pl.Int64)
    by_thread = ev.select(pl.int_range(n, dtype=pl.UInt32).alias("_row"), thread_key.alias("_t"), "tie")
    if by_thread.select((pl.col("_t") != pl.col("_t").first()).any()).item():
        by_thread = by_thread.sort("_t", maintain_order=True)
    start = (pl.col("tie") == 0) | (pl.col("_t") != pl.col("_t").shift(1)).fill_null(True)
    groups = (
        by_thread.select("_row", start.alias("_start"))
        .with_columns(pl.col("_start").cum_sum().alias("_g"))
        .filter((~pl.col("_start")) | (~pl.col("_start").shift(-1).fill_null(True)))
        .select("_row", "_g")
    )
    del by_thread
    if groups.height == 0:
        return None
    cols = ["rank", "seq", "kind", "module_id", "phase", "call_id", "graph_task"]
    tied = pl.concat([groups, ev.select(cols)[groups["_row"]]], how="horizontal")
    # The group's first row (in thread order, so lowest seq) starts it.
    tied = tied.with_columns(
        pl.when(pl.col("_g") != pl.col("_g").shift(1).fill_null(-1)).then(pl.col("seq")).forward_fill().alias("_gstart")
    )
    depths = module_depths(modules).select(lookup_key("rank", "module_id").alias("_mk"), "module_depth")
    tied = (
        tied.with_columns(lookup_key("rank", "module_id").alias("_mk"))
        .join(depths, on="_mk", how="left", maintain_order="left")
        .with_columns(pl.col("module_depth").fill_null(0))
    )
    # ``tied`` is in (group, seq) order: the seq slots (and rows) of each group.
    slot_rows = tied["_row"]

    # The enter each tied exit closes: the latest enter of its call, phase and
    # graph task before it (rows of a rank are in seq order, so the latest is
    # the highest row); its place in the normalised order is (group start,
    # module depth, seq), an untied enter being its own group.  Joined on
    # call_id alone (one Int64 key), the rest compared after.
    exits = tied.filter(pl.col("kind") == EXIT).select("_row", "rank", "call_id", "phase", "graph_task")
    calls = exits["call_id"].unique().implode()
    enters = ev.select(
        pl.int_range(n, dtype=pl.UInt32).alias("_erow"), "kind", "rank", "call_id", "phase", "graph_task"
    ).filter((pl.col("kind") == ENTER) & pl.col("call_id").is_in(calls, nulls_equal=True))
    same = (
        pl.col("rank").eq_missing(pl.col("rank_e"))
        & pl.col("phase").eq_missing(pl.col("phase_e"))
        & pl.col("graph_task").eq_missing(pl.col("graph_task_e"))
        & (pl.col("_erow") < pl.col("_row"))
    )
    tied_enters = tied.filter(pl.col("kind") == ENTER).select(
        pl.col("_row").alias("_erow"), pl.col("_gstart").alias("_eg"), pl.col("module_depth").alias("_ed")
    )
    matched = (
        exits.join(enters.drop("kind"), on="call_id", how="inner", nulls_equal=True, suffix="_e")
        .filter(same.fill_null(False))
        .group_by("_row")
        .agg(pl.col("_erow").max())
        .with_columns(pl.lit(ev["seq"]).gather(pl.col("_erow")).alias("_eseq"))
        .join(tied_enters, on="_erow", how="left")
        .with_columns(pl.col("_eg").fill_null(pl.col("_eseq")), pl.col("_ed").fill_null(0))
        .select("_row", "_eg", "_ed", "_eseq")
    )
    tied = tied.join(matched, on="_row", how="left")

    is_enter = pl.col("kind") == ENTER
    by_key = tied.select(
        "_row",
        "_g",
        "seq",
        is_enter.cast(pl.Int8).alias("_k0"),
        pl.when(is_enter).then(pl.col("module_depth").cast(pl.Int64)).otherwise(-pl.col("_eg")).alias("_k1"),
        pl.when(is_enter).then(pl.col("seq")).otherwise(-pl.col("_ed").cast(pl.Int64)).alias("_k2"),
        pl.when(is_enter).then(0).otherwise(-pl.col("_eseq")).alias("_k3"),
    ).sort("_g", "_k0", "_k1", "_k2", "_k3", "seq", nulls_last=True)
    # Row i of a group in key order takes the i-th seq slot (and row) of the group.
    return slot_rows, by_key["_row"]


def _move_rows(ev: pl.DataFrame, slots: pl.Series, rows: pl.Series) -> pl.DataFrame:
    """``ev`` with row ``rows[i]`` in place of row ``slots[i]``.

    A column whose values are the same at both ends of every move (run,
    rank, thread, often step, phase, graph task) is kept as it is, sharing
    its memory with the input; the others are copied and patched, not
    gathered whole.
    """
    columns = []
    for column in ev.get_columns():
        moved = column.gather(rows)
        if not moved.equals(column.gather(slots), check_names=False, null_equal=True):
            column = column.clone().scatter(slots, moved)
        columns.append(column)
    return pl.DataFrame(columns)


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

    Columns are shared with the input where rows do not move (already sorted,
    no ties), so the output costs memory only for what changed.
    """
    ev = conform(events, EVENT_SCHEMA)
    if ev.n_chunks() > 1:
        ev = ev.rechunk()  # gathers from one buffer are much faster than from many (a parquet read, a concat)
    if not _is_sorted(ev):
        ev = ev.sort("rank", "seq", maintain_order=True)
    slots = ev["seq"].alias("order")
    if ev.height and bool((ev["tie"] == 1).any()):
        moves = _tie_moves(ev, modules)
        if moves is not None:
            ev = _move_rows(ev, *moves)
    return with_stack(ev.with_columns(slots))
