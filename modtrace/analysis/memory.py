"""Memory per span on counted steps: live levels, kept and peak bytes, from the recorder's storages.

Pure polars and numpy (``modtrace.results.span_memory`` reads and writes).  A storage row
(``mem_storages``) is an allocation at position ``alloc_seq`` (it happened after event
``alloc_seq - 1`` and before event ``alloc_seq``; NULL: alive before the range, *baseline*)
and a free at ``free_seq`` (NULL: alive at the range's end); ``sid`` and ``free_order`` come
from one counter, so they order the changes at one position.  docs/schema.md "Memory" defines
the columns computed here.
"""

from __future__ import annotations

import numpy as np
import polars as pl

SPAN_MEMORY = ("kept_mem_bytes", "kept_mem_bytes_self", "peak_mem_bytes", "peak_mem_bytes_self")
_GROUP = ("rank", "first_seq", "device")


def live_levels(storages: pl.DataFrame) -> pl.DataFrame:
    """Live bytes after each allocation and free of each counted range, per device.

    ``storages``: rank, first_seq, sid, device, nbytes, alloc_seq, free_seq, free_order (as
    ``mem_storages``).  Returns rank, first_seq, device, pos (the change's position), delta
    (bytes: + allocated, - freed) and level (live bytes after it, baseline storages counted from
    the range's start), one row per change in the order they happened, by rank, first_seq and
    device."""
    return _levels(storages).select(*_GROUP, "pos", "delta", "level")


def _levels(storages: pl.DataFrame) -> pl.DataFrame:
    """``live_levels`` with ``sid``: the storage allocated (null at a free)."""
    out = {"rank": pl.Int32, "first_seq": pl.Int64, "device": pl.Int32, "pos": pl.Int64, "delta": pl.Int64,
           "level": pl.Int64, "sid": pl.Int64}
    if storages.height == 0:
        return pl.DataFrame(schema=out)
    s = storages.select(pl.col("rank").cast(pl.Int32), pl.col("first_seq").cast(pl.Int64),
                        pl.col("device").cast(pl.Int32), pl.col("sid").cast(pl.Int64), pl.col("nbytes").cast(pl.Int64),
                        pl.col("alloc_seq").cast(pl.Int64), pl.col("free_seq").cast(pl.Int64),
                        pl.col("free_order").cast(pl.Int64))
    base = s.filter(pl.col("alloc_seq").is_null()).group_by(_GROUP).agg(pl.col("nbytes").sum().alias("base"))
    allocs = s.filter(pl.col("alloc_seq").is_not_null()).select(
        *_GROUP, pl.col("alloc_seq").alias("pos"), pl.col("sid").alias("order"), pl.col("nbytes").alias("delta"), "sid")
    frees = s.filter(pl.col("free_seq").is_not_null()).select(
        *_GROUP, pl.col("free_seq").alias("pos"), pl.col("free_order").alias("order"), (-pl.col("nbytes")).alias("delta"),
        pl.lit(None, dtype=pl.Int64).alias("sid"))
    changes = pl.concat([allocs, frees]).sort(*_GROUP, "order")
    return (
        changes.join(base, on=list(_GROUP), how="left")
        .with_columns((pl.col("base").fill_null(0) + pl.col("delta").cum_sum().over(_GROUP)).alias("level"))
        .select(*_GROUP, "pos", "delta", "level", "sid")
        .cast(out)  # type: ignore[arg-type]
    )


def range_memory(storages: pl.DataFrame) -> pl.DataFrame:
    """Per counted range and device: rank, first_seq, device, base_bytes (live at the start) and
    peak_bytes (the most live at any moment of the range, base included)."""
    out = {"rank": pl.Int32, "first_seq": pl.Int64, "device": pl.Int32, "base_bytes": pl.Int64, "peak_bytes": pl.Int64}
    if storages.height == 0:
        return pl.DataFrame(schema=out)
    base = storages.group_by(_GROUP).agg(
        pl.col("nbytes").filter(pl.col("alloc_seq").is_null()).sum().alias("base_bytes"))
    peaks = live_levels(storages).group_by(_GROUP).agg(pl.col("level").max().alias("top"))
    return (
        base.cast({"rank": pl.Int32, "first_seq": pl.Int64, "device": pl.Int32})
        .join(peaks, on=list(_GROUP), how="left")
        .with_columns(pl.max_horizontal("base_bytes", pl.col("top").fill_null(0)).alias("peak_bytes"))
        .select(*out).cast(out).sort(*_GROUP)  # type: ignore[arg-type]
    )


def _ranges_of(spans: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """Each span entered inside a counted range with the range's first_seq: the range begun on
    the span's thread when there is one (ranges of several threads overlap in seq), else the
    latest range begun before it."""
    r = ranges.select(pl.col("rank").cast(pl.Int32), pl.col("first_seq").cast(pl.Int64),
                      pl.col("last_seq").cast(pl.Int64)).sort("rank", "first_seq")
    thread_of = spans.select("rank", pl.col("span_id").alias("first_seq"), pl.col("thread_id").alias("r_thread"))
    r = r.join(thread_of, on=["rank", "first_seq"], how="left")
    s = spans.sort("rank", "span_id")

    def asof(by: list[str], right: pl.DataFrame) -> pl.DataFrame:
        return s.join_asof(right.sort("first_seq"), left_on="span_id", right_on="first_seq", by=by,
                           strategy="backward", check_sortedness=False).filter(
            pl.col("first_seq").is_not_null() & (pl.col("span_id") <= pl.col("last_seq"))).drop("last_seq")

    same = asof(["rank", "thread_id"], r.filter(pl.col("r_thread").is_not_null()).select(
        "rank", pl.col("r_thread").alias("thread_id"), "first_seq", "last_seq"))
    # Spans of a thread that began no range (the autograd engine's device threads) go by seq alone.
    rest = asof(["rank"], r.select("rank", "first_seq", "last_seq")).join(
        r.filter(pl.col("r_thread").is_not_null()).select("rank", pl.col("r_thread").alias("thread_id")).unique(),
        on=["rank", "thread_id"], how="anti")
    return pl.concat([same, rest]).sort("rank", "span_id")


def span_memory(spans: pl.DataFrame, storages: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """Kept and peak memory of the spans entered in ``ranges`` (docs/schema.md "Memory").

    ``spans``: rank, span_id, parent_span_id, call_id, phase (code), graph_task, thread_id,
    device_id, exit_seq; ``storages``: as ``live_levels`` with call_id, phase, graph_task (-1 in
    forward); ``ranges``: rank, first_seq, last_seq.  Returns rank, span_id and ``SPAN_MEMORY``
    (null for a span never exited), by rank and span_id."""
    out_schema = {"rank": pl.Int32, "span_id": pl.Int64, **dict.fromkeys(SPAN_MEMORY, pl.Int64)}
    if spans.height == 0 or ranges.height == 0:
        return pl.DataFrame(schema=out_schema)
    picked = spans.select(
        pl.col("rank").cast(pl.Int32), pl.col("span_id").cast(pl.Int64), pl.col("parent_span_id").cast(pl.Int64),
        pl.col("call_id").cast(pl.Int64), pl.col("phase").cast(pl.Int8),
        pl.col("graph_task").fill_null(-1).cast(pl.Int64).alias("graph_task"), pl.col("thread_id").cast(pl.Int32),
        pl.col("device_id").cast(pl.Int32), pl.col("exit_seq").cast(pl.Int64),
    )
    picked = _ranges_of(picked, ranges)
    if picked.height == 0 or storages.height == 0:
        return picked.select("rank", "span_id", *(pl.when(pl.col("exit_seq").is_not_null()).then(pl.lit(0)).otherwise(None)
                                                   .cast(pl.Int64).alias(c) for c in SPAN_MEMORY)).cast(out_schema)  # type: ignore[arg-type]
    st = storages.select(
        pl.col("rank").cast(pl.Int32), pl.col("first_seq").cast(pl.Int64), pl.col("sid").cast(pl.Int64),
        pl.col("device").cast(pl.Int32), pl.col("nbytes").cast(pl.Int64), pl.col("alloc_seq").cast(pl.Int64),
        pl.col("free_seq").cast(pl.Int64), pl.col("free_order").cast(pl.Int64), pl.col("call_id").cast(pl.Int64),
        pl.col("phase").cast(pl.Int8), pl.col("graph_task").cast(pl.Int64),
    )
    # A span with no device of its own takes its range's, when the range used one device.
    only = st.group_by("rank", "first_seq").agg(pl.col("device").unique().alias("devs")).filter(
        pl.col("devs").list.len() == 1).select("rank", "first_seq", pl.col("devs").list.first().alias("only"))
    picked = picked.join(only, on=["rank", "first_seq"], how="left").with_columns(
        pl.coalesce("device_id", "only").alias("device")).drop("only")
    # Ranges begun on one thread never overlap in seq: each thread's ranges are computed together
    # (their spans nest in one containment forest, their levels follow one another).
    group = picked.filter(pl.col("span_id") == pl.col("first_seq")).select(
        "rank", "first_seq", pl.col("thread_id").alias("group"))
    picked = picked.join(group, on=["rank", "first_seq"], how="left").with_columns(pl.col("group").fill_null(-1))
    st = st.join(group, on=["rank", "first_seq"], how="left").with_columns(pl.col("group").fill_null(-1))
    held = st.partition_by("rank", "group", as_dict=True)
    parts = [_group(chosen, held[key]) for key, chosen in picked.partition_by("rank", "group", as_dict=True).items()
             if key in held]
    covered = pl.concat([p for p in parts if p.height]) if parts else pl.DataFrame(schema=out_schema)
    missing = picked.join(covered.select("rank", "span_id"), on=["rank", "span_id"], how="anti").select(
        "rank", "span_id", *(pl.when(pl.col("exit_seq").is_not_null()).then(pl.lit(0)).otherwise(None)
                             .cast(pl.Int64).alias(c) for c in SPAN_MEMORY))
    return pl.concat([covered.cast(out_schema), missing.cast(out_schema)]).sort("rank", "span_id")  # type: ignore[arg-type]


def _group(spans: pl.DataFrame, storages: pl.DataFrame) -> pl.DataFrame:
    """``span_memory`` of the spans of ranges that do not overlap (one thread's), from their storages."""
    n = spans.height
    out = {c: np.zeros(n, dtype=np.int64) for c in SPAN_MEMORY}
    if n == 0:
        return pl.DataFrame({"rank": [], "span_id": [], **{c: [] for c in SPAN_MEMORY}})
    spans = spans.sort("span_id")
    span_id = spans["span_id"].to_numpy()
    exit_seq = spans["exit_seq"].fill_null(np.iinfo(np.int64).max).to_numpy()
    closed = spans["exit_seq"].is_not_null().to_numpy()
    dev = spans["device"].fill_null(-1).to_numpy()
    span_range = spans["first_seq"].to_numpy()
    # Each allocation's owner: the span of its call key (as the counters charge ops).
    keys = spans.select("call_id", "phase", "graph_task", pl.int_range(pl.len()).alias("owner")).unique(
        subset=["call_id", "phase", "graph_task"], keep="first")
    allocs = storages.filter(pl.col("alloc_seq").is_not_null()).join(
        keys, on=["call_id", "phase", "graph_task"], how="left", maintain_order="left")
    owner = allocs["owner"].fill_null(-1).to_numpy().astype(np.int64)
    a_dev = allocs["device"].to_numpy()
    a_bytes = allocs["nbytes"].to_numpy()
    a_free = allocs["free_seq"].fill_null(np.iinfo(np.int64).max).to_numpy()
    has = owner >= 0
    same = has.copy()
    same[has] = a_dev[has] == dev[owner[has]]
    # Self kept: the span's own allocations on its device still alive at its exit.
    keep = same & (a_free > exit_seq[np.maximum(owner, 0)])
    np.add.at(out["kept_mem_bytes_self"], owner[keep], a_bytes[keep])
    # Inclusive kept, on each span's device: the bytes allocated at positions in (enter, exit]
    # still alive at the exit.  Spans nest in seq, so an allocation at a counts for the spans
    # containing a (its holder, the innermost, and its ancestors in the containment tree), and it
    # is freed by the exit of those containing its free as well (from its "container" up).
    parent = _containment(span_id, exit_seq)
    a_seq = allocs["alloc_seq"].to_numpy()
    holder = _container(np.searchsorted(span_id, a_seq, side="left") - 1, a_seq, parent, exit_seq)
    for d in np.unique(dev[dev >= 0]):
        on_d = (holder >= 0) & (a_dev == d)
        mass = np.zeros(n, dtype=np.int64)
        np.add.at(mass, holder[on_d], a_bytes[on_d])
        sel = on_d & (a_free < np.iinfo(np.int64).max)
        cont = _container(holder[sel], a_free[sel], parent, exit_seq)
        ok = cont >= 0
        np.add.at(mass, cont[ok], -a_bytes[sel][ok])
        incl = _subtree_sums(mass, parent)
        out["kept_mem_bytes"][dev == d] = incl[dev == d]
    # Peaks from the live levels on each span's device.
    # The ranges' levels on a device follow one another in seq (the ranges do not overlap): one
    # sorted array per device, and a span's rows are those at positions in (enter, exit].
    levels = _levels(storages.select(*_GROUP, "sid", "nbytes", "alloc_seq", "free_seq", "free_order"))
    owners = allocs.select("sid", pl.Series("owner", owner))
    bases = storages.filter(pl.col("alloc_seq").is_null()).group_by("first_seq", "device").agg(
        pl.col("nbytes").sum().alias("base"))
    for d in np.unique(dev[dev >= 0]):
        lv = levels.filter(pl.col("device") == d)
        mine = np.flatnonzero(dev == d)
        base = pl.DataFrame({"first_seq": span_range[mine]}).join(
            bases.filter(pl.col("device") == d).select("first_seq", "base"), on="first_seq", how="left",
            maintain_order="left")["base"].fill_null(0).to_numpy()
        pos = np.maximum.accumulate(lv["pos"].to_numpy()) if lv.height else np.zeros(0, dtype=np.int64)
        level = lv["level"].to_numpy()
        row_range = lv["first_seq"].to_numpy()
        lo = np.searchsorted(pos, span_id[mine], side="right")
        hi = np.searchsorted(pos, exit_seq[mine], side="right")
        before = np.maximum(lo - 1, 0)
        ours = (lo > 0) & (row_range[before] == span_range[mine]) if level.size else np.zeros(mine.size, dtype=bool)
        enter = np.where(ours, level[before] if level.size else 0, base)
        top = _range_max(level, lo, hi)
        out["peak_mem_bytes"][mine] = np.maximum(np.where(hi > lo, top - enter, 0), 0)
        # Self peak: the level right after each of the span's own allocations.
        if lv.height:
            at = lv.filter(pl.col("sid").is_not_null()).join(owners, on="sid", how="inner").filter(pl.col("owner") >= 0)
            o = at["owner"].to_numpy()
            top_self = np.full(n, np.iinfo(np.int64).min, dtype=np.int64)
            np.maximum.at(top_self, o, at["level"].to_numpy())
            enter_all = np.zeros(n, dtype=np.int64)
            enter_all[mine] = enter
            got = (top_self > np.iinfo(np.int64).min) & (dev == d)
            out["peak_mem_bytes_self"][got] = np.maximum(top_self[got] - enter_all[got], 0)
    frame = pl.DataFrame({"rank": spans["rank"], "span_id": spans["span_id"], **out})
    return frame.with_columns(pl.when(pl.Series(closed)).then(pl.col(c)).otherwise(None).alias(c) for c in SPAN_MEMORY)


def _depths(parent: np.ndarray) -> np.ndarray:
    depth = np.zeros(parent.size, dtype=np.int64)
    cur = parent.copy()
    while True:
        live = cur >= 0
        if not live.any():
            return depth
        depth[live] += 1
        cur[live] = parent[cur[live]]


def _containment(enter: np.ndarray, exit_seq: np.ndarray) -> np.ndarray:
    """Each span's innermost enclosing span by seq (-1: none), spans sorted by enter: the
    tree the positions nest in (a nested graph task's backward spans inside the span that ran
    it, which the spans' own parents leave as roots)."""
    parent = np.full(enter.size, -1, dtype=np.int64)
    stack: list[int] = []
    ends = exit_seq.tolist()
    for i, e in enumerate(enter.tolist()):
        while stack and ends[stack[-1]] < e:
            stack.pop()
        if stack:
            parent[i] = stack[-1]
        stack.append(i)
    return parent


def _subtree_sums(mass: np.ndarray, parent: np.ndarray) -> np.ndarray:
    """Each span's mass plus its descendants'."""
    total: np.ndarray = mass.copy()
    depth = _depths(parent)
    for d in range(int(depth.max()) if depth.size else 0, 0, -1):
        at = np.flatnonzero(depth == d)
        p = parent[at]
        ok = p >= 0
        np.add.at(total, p[ok], total[at[ok]])
    return total


def _container(owner: np.ndarray, free: np.ndarray, parent: np.ndarray, exit_seq: np.ndarray) -> np.ndarray:
    """The deepest ancestor-or-self of each owner that exits at or after the free (-1: none),
    by binary lifting (exits grow towards the root)."""
    if owner.size == 0:
        return owner
    start = owner
    owner = np.maximum(owner, 0)
    up = [parent]
    while True:
        prev = up[-1]
        nxt = np.where(prev >= 0, prev[np.maximum(prev, 0)], -1)
        if not (nxt >= 0).any():
            break
        up.append(nxt)
    cur = owner.copy()
    inside = exit_seq[cur] >= free
    todo = ~inside
    # climb from the owner while the exit is before the free: the last such node's parent is it
    for k in range(len(up) - 1, -1, -1):
        j = up[k][cur]
        move = todo & (j >= 0)
        move[move] = exit_seq[j[move]] < free[move]
        cur[move] = j[move]
    found: np.ndarray = np.where(start < 0, -1, np.where(inside, cur, parent[cur]))
    return found


def _range_max(values: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """max(values[lo:hi]) for each pair (anything where hi <= lo), by one ``reduceat``: spans nest,
    so the ranges' total length is the rows times the nesting depth at most."""
    if values.size == 0 or lo.size == 0:
        return np.zeros(lo.size, dtype=np.int64)
    padded = np.append(values, values[-1])
    order = np.argsort(lo, kind="stable")
    idx = np.empty(2 * lo.size, dtype=np.int64)
    idx[0::2] = np.minimum(lo[order], values.size)
    idx[1::2] = np.minimum(np.maximum(hi[order], lo[order]), values.size)
    res = np.maximum.reduceat(padded, idx)[0::2]
    out = np.empty(lo.size, dtype=np.int64)
    out[order] = res
    return out
