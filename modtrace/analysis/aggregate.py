"""Aggregate: spans -> per-step samples and the module call tree.

``step_samples`` is the unit other comparisons build on (``modtrace diff``
compares the per-step samples of two runs); ``module_tree`` is what
``modtrace tree`` shows.  Only spans that were exited count towards times.
"""

from __future__ import annotations

import polars as pl

from modtrace.analysis.step_time import total_step_time
from modtrace.core.contracts import TREE_NODE_FRAME, is_attributed, source_of
from modtrace.core.tree_rows import shown_nodes

SAMPLE_COLUMNS: tuple[str, ...] = ("rank", "step", "fqn", "module_type", "phase", "calls", "inclusive_ns", "self_ns")

# The span columns ``module_tree`` (with the steps and step time it needs) reads; a
# caller may fetch only these.  The others of a spans frame may be null.
TREE_SPAN_COLUMNS: tuple[str, ...] = (
    "rank", "span_id", "parent_span_id", "depth", "module_id", "phase", "step", "thread_id",
    "start_ns", "end_ns", "duration_ns", "self_ns", "status",
)

NODE_COLUMNS: tuple[str, ...] = TREE_NODE_FRAME.names


def step_samples(spans: pl.DataFrame) -> pl.DataFrame:
    """Spans frame -> one row per (rank, step, fqn, phase) with its per-step totals.

    Output columns (``SAMPLE_COLUMNS``): rank Int32, step Int32, fqn String,
    module_type String, phase Enum, calls UInt32 (spans of that module and
    phase in that step), inclusive_ns Int64 (sum of their durations),
    self_ns Int64 (sum of their self times).  Spans never exited are left
    out.  Sorted by rank, step, phase, fqn.
    """
    return (
        spans.filter(pl.col("duration_ns").is_not_null())
        .group_by("rank", "step", pl.col("fqn").cast(pl.String), pl.col("module_type").cast(pl.String), "phase")
        .agg(
            pl.len().alias("calls"),
            pl.col("duration_ns").sum().alias("inclusive_ns"),
            pl.col("self_ns").sum().alias("self_ns"),
        )
        .sort("rank", "step", "phase", "fqn")
        .select(SAMPLE_COLUMNS)
    )


def _codes(spans: pl.DataFrame, column: str) -> pl.Expr:
    """A name column as integer codes below 2**32 + 1, equal exactly where the names are (an
    Enum's or a Categorical's physical codes; other columns are made Categorical first; a
    missing name is 2**32)."""
    col = pl.col(column) if isinstance(spans.schema[column], (pl.Enum, pl.Categorical)) else (
        pl.col(column).cast(pl.String).cast(pl.Categorical))
    return col.to_physical().cast(pl.Int64).fill_null(1 << 32)


def _packed(columns: list[tuple[pl.Expr, int, int]]) -> pl.Expr | None:
    """Integer columns (expression, min, max) as one Int64 key, equal exactly where all of them
    are; None when their ranges do not fit in 62 bits together."""
    key: pl.Expr | None = None
    span = 1
    for expr, low, high in columns:
        width = high - low + 1
        span *= width
        if span >= 1 << 62:
            return None
        part = expr.cast(pl.Int64) - low
        key = part if key is None else key * width + part
    return key


def _path_nodes(spans: pl.DataFrame) -> tuple[pl.Series, pl.DataFrame]:
    """Each span's call-path node as a dense index (Int64, in the spans' row order), and the
    nodes: ``_node``, ``_parent`` (its parent's ``_node``, null at a root).

    A node is a path of (phase, fqn) from a root span down: built level by level (depth), a
    span's node is that of its parent and its own (phase, fqn), as small integers; a span
    whose parent is not among the spans one level up starts a path of its own, as a root's.
    Grouping by these integers rather than by a hash of the names per span is what keeps
    ``module_tree`` cheap on a large run; the hashes (``node_id``) are taken per node.
    """
    own = _codes(spans, "phase") * (1 << 33) + _codes(spans, "fqn")
    base = spans.select("rank", "span_id", "parent_span_id", "depth", own.alias("_own")).with_row_index("_row")
    owns = base.get_column("_own").unique().sort()
    n_own = owns.len()
    base = base.with_columns(owns.search_sorted(base.get_column("_own")).cast(pl.Int64).alias("_own"))
    bounds = base.select(pl.col("rank").min().alias("r0"), pl.col("rank").max().alias("r1"),
                         pl.min_horizontal(pl.col("span_id").min(), pl.col("parent_span_id").min()).alias("s0"),
                         pl.max_horizontal(pl.col("span_id").max(), pl.col("parent_span_id").max()).alias("s1"),
                         pl.col("depth").max().fill_null(0).alias("d")).row(0, named=True)
    # (rank, span_id) as one key where it fits: a join on one integer column costs half of two
    fits = None not in (bounds["r0"], bounds["s0"])
    at = _packed([(pl.col("rank"), bounds["r0"], bounds["r1"]), (pl.col("span_id"), bounds["s0"], bounds["s1"])]) if fits else None
    up = _packed([(pl.col("rank"), bounds["r0"], bounds["r1"]),
                  (pl.col("parent_span_id"), bounds["s0"], bounds["s1"])]) if fits else None
    nodes = pl.DataFrame(schema={"_key": pl.Int64, "_node": pl.Int64, "_parent": pl.Int64})
    placed: list[pl.DataFrame] = []
    known: pl.DataFrame | None = None
    for d in range(int(bounds["d"]) + 1):
        level = base.filter(pl.col("depth") == d)
        if known is None:
            level = level.with_columns(pl.lit(None, pl.Int64).alias("_parent"))
        elif at is not None and up is not None:
            level = level.with_columns(up.alias("_at")).join(known, on="_at", how="left")
        else:
            level = level.join(known.rename({"span_id": "parent_span_id"}), on=["rank", "parent_span_id"], how="left")
        key = pl.when(pl.col("_parent").is_null()).then(pl.col("_own")).otherwise((pl.col("_parent") + 1) * n_own + pl.col("_own"))
        level = level.with_columns(key.alias("_key"))
        new = (level.select("_key", "_parent").unique("_key").join(nodes.select("_key"), on="_key", how="anti")
               .sort("_key").with_columns((pl.int_range(pl.len(), dtype=pl.Int64) + nodes.height).alias("_node")))
        nodes = pl.concat([nodes, new.select("_key", "_node", "_parent")])
        level = level.join(nodes.select("_key", "_node"), on="_key", how="left")
        placed.append(level.select("_row", "_node"))
        known = level.select(at.alias("_at") if at is not None else pl.col("rank"),
                             *(() if at is not None else ("span_id",)), pl.col("_node").alias("_parent"))
    node = pl.concat(placed).sort("_row").get_column("_node")
    return node, nodes.select("_node", "_parent")


def _node_ids(nodes: pl.DataFrame) -> pl.DataFrame:
    """Nodes (``_node``, ``_parent``, ``_own``: the hash of its (phase, fqn)) -> ``_node``,
    ``node_id``, ``parent_node_id``: a root's node_id is its own hash, another's the hash of
    its parent's node_id and its own."""
    done = nodes.filter(pl.col("_parent").is_null()).select(
        "_node", pl.col("_own").alias("node_id"), pl.lit(None, dtype=pl.UInt64).alias("parent_node_id"))
    rest = nodes.filter(pl.col("_parent").is_not_null())
    found = [done]
    while rest.height:
        level = rest.join(done.select(pl.col("_node").alias("_parent"), pl.col("node_id").alias("parent_node_id")),
                          on="_parent")
        if level.height == 0:
            raise ValueError("call-path nodes whose parents are not nodes")
        done = level.select("_node", pl.struct("parent_node_id", "_own").hash().alias("node_id"), "parent_node_id")
        found.append(done)
        rest = rest.join(level.select("_node"), on="_node", how="anti")
    return pl.concat(found)


def _own_hash() -> pl.Expr:
    return pl.struct(pl.col("phase").cast(pl.String), pl.col("fqn").cast(pl.String)).hash().alias("_own")


def assign_nodes(spans: pl.DataFrame) -> pl.DataFrame:
    """Spans frame -> (rank, span_id, node_id, parent_node_id): the call-path node of each span,
    in the spans' row order.

    A node is a path of (phase, fqn) from a root span down; spans with the
    same path, in any step or rank, share a node.  node_id is a hash of the
    path.
    """
    node, nodes = _path_nodes(spans)
    named = spans.select("phase", "fqn").with_columns(node.alias("_node")).unique("_node").select("_node", _own_hash())
    ids = _node_ids(nodes.join(named, on="_node"))
    return spans.select("rank", "span_id").with_columns(node.alias("_node")).join(
        ids, on="_node", how="left", maintain_order="left").drop("_node")


def module_tree(spans: pl.DataFrame) -> pl.DataFrame:
    """Spans frame -> call-tree nodes with their timings (``NODE_COLUMNS``), in tree pre-order.

    Per node: calls (spans), steps (distinct (rank, step) samples), total
    inclusive and self time, the per-step medians of both (over the steps
    the node ran in), and percent: total inclusive time as a percentage of
    the summed step time (``analysis.step_time``: time in root spans) of the
    steps present in ``spans``; source: kernels when every span of the node
    has status attributed (its time attributed from compiled kernels), mixed
    when some have, else hooks.
    ``level`` is the depth in the tree, ``parent_node_id`` null at a root.
    Children follow their parent in order of first appearance.
    """
    if spans.height == 0:
        return pl.DataFrame(schema={c: pl.Int64 for c in NODE_COLUMNS})
    node, nodes = _path_nodes(spans)
    tagged = spans.select("rank", "span_id", "step", "duration_ns", "self_ns", "fqn", "module_type", "phase",
                          is_attributed().alias("_attributed")).with_columns(node.alias("_node")).with_row_index("_row")
    # Sorted by (node, rank, step) as one integer where it fits, the per-step and per-node
    # groups below are runs of rows (a group_by over them about a third of one over the rows
    # as they come); sums and medians do not depend on the order.
    ranges = tagged.select(pl.col("rank").min().alias("r0"), pl.col("rank").max().alias("r1"),
                           pl.col("step").min().alias("t0"), pl.col("step").max().alias("t1"),
                           pl.col("rank").null_count().alias("rn"), pl.col("step").null_count().alias("tn")).row(0, named=True)
    key = None
    if not ranges["rn"] and not ranges["tn"]:
        key = _packed([(pl.col("_node"), 0, nodes.height - 1), (pl.col("rank"), ranges["r0"], ranges["r1"]),
                       (pl.col("step"), ranges["t0"], ranges["t1"])])
    if key is not None:
        tagged = tagged.with_columns(key.alias("_key")).sort("_key")
        per_step = tagged.group_by("_key").agg(
            pl.col("_node").first(), pl.col("duration_ns").sum().alias("_inc"), pl.col("self_ns").sum().alias("_self"))
    else:
        per_step = tagged.group_by("_node", "rank", "step").agg(
            pl.col("duration_ns").sum().alias("_inc"), pl.col("self_ns").sum().alias("_self"))
    medians = per_step.group_by("_node").agg(
        pl.len().alias("steps"),
        pl.col("_inc").median().alias("inclusive_median_ns"),
        pl.col("_self").median().alias("self_median_ns"),
    )
    step_total = total_step_time(spans)
    first = pl.col("_row").arg_min()
    agg = (
        tagged.group_by("_node")
        .agg(
            pl.col("fqn").get(first),
            pl.col("module_type").get(first),
            pl.col("phase").get(first),
            pl.len().alias("calls"),
            pl.col("duration_ns").sum().alias("inclusive_total_ns"),
            pl.col("self_ns").sum().alias("self_total_ns"),
            pl.col("rank").min().alias("_rank"),
            pl.col("span_id").filter(pl.col("rank") == pl.col("rank").min()).min().alias("_first"),
            pl.col("_attributed").sum().alias("_attributed"),
        )
        .with_columns(_own_hash())
    )
    ids = _node_ids(agg.select("_node", "_own").join(nodes, on="_node"))
    return tree_frame(agg.join(ids, on="_node"), medians.join(ids.select("_node", "node_id"), on="_node"), step_total)


def tree_frame(agg: pl.DataFrame, medians: pl.DataFrame, step_total: int) -> pl.DataFrame:
    """The nodes frame (``NODE_COLUMNS``, pre-order) from its parts: ``agg``, per node
    (``node_id``, ``parent_node_id``, ``fqn``, ``module_type``, ``phase``, ``calls``,
    ``inclusive_total_ns``, ``self_total_ns``, ``_attributed``: its spans attributed from kernels,
    and ``_rank``, ``_first``: the rank and span id it first appears at, for the order); ``medians``,
    per node (``node_id``, ``steps``, ``inclusive_median_ns``, ``self_median_ns``); ``step_total``,
    the summed step time (``analysis.step_time.total_step_time``)."""
    agg = (
        agg.with_columns(pl.col("fqn", "module_type").cast(pl.String))
        .join(medians.select("node_id", "steps", "inclusive_median_ns", "self_median_ns"), on="node_id")
        .with_columns(
            (pl.col("inclusive_total_ns") * 100.0 / step_total if step_total else pl.lit(None, dtype=pl.Float64))
            .alias("percent"),
            source_of(pl.col("_attributed"), pl.col("calls")).alias("source"),
        )
        .sort("_rank", "_first")
    )
    # Pre-order walk over the (small) node table.
    children: dict[int | None, list[int]] = {}
    for node_id, parent in agg.select("node_id", "parent_node_id").iter_rows():
        children.setdefault(parent, []).append(node_id)
    order: list[tuple[int, int]] = []
    stack = [(n, 0) for n in reversed(children.get(None, []))]
    while stack:
        node_id, level = stack.pop()
        order.append((node_id, level))
        stack.extend((c, level + 1) for c in reversed(children.get(node_id, [])))
    layout = pl.DataFrame(order, schema={"node_id": pl.UInt64, "level": pl.Int32}, orient="row").with_row_index("_pos")
    return layout.join(agg, on="node_id").sort("_pos").select(NODE_COLUMNS)


def filter_tree(nodes: pl.DataFrame, *, phases: set[str] | None = None, max_depth: int | None = None,
                min_percent: float | None = None) -> pl.DataFrame:
    """Nodes (``module_tree``) -> the nodes to show, re-parented and re-levelled (``tree_rows.shown_nodes``:
    another phase's nodes hidden, their shown descendants moved up; nodes deeper than ``max_depth``
    or below ``min_percent`` dropped with their subtrees)."""
    rows = shown_nodes(
        zip(*(nodes[c].to_list() for c in ("node_id", "parent_node_id", "phase", "percent")), strict=True),
        phases=phases, max_depth=max_depth, min_percent=min_percent,
    )
    layout = pl.DataFrame(
        rows, schema={"node_id": pl.UInt64, "parent_node_id": pl.UInt64, "level": pl.Int32}, orient="row"
    ).with_row_index("_pos")
    return layout.join(nodes.drop("parent_node_id", "level"), on="node_id").sort("_pos").select(NODE_COLUMNS)
