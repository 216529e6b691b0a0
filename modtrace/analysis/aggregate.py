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


def assign_nodes(spans: pl.DataFrame) -> pl.DataFrame:
    """Spans frame -> (rank, span_id, node_id, parent_node_id): the call-path node of each span,
    in the spans' row order.

    A node is a path of (phase, fqn) from a root span down; spans with the
    same path, in any step or rank, share a node.  node_id is a hash of the
    path.
    """
    base = spans.select(
        "rank", "span_id", "parent_span_id", "depth",
        pl.struct(pl.col("phase").cast(pl.String), pl.col("fqn").cast(pl.String)).hash().alias("_own"),
    ).with_row_index("_row")
    max_depth = int(base.select(pl.col("depth").max().fill_null(0)).item())
    known = base.filter(pl.col("depth") == 0).select(
        "_row", "rank", "span_id", pl.col("_own").alias("node_id"),
        pl.lit(None, dtype=pl.UInt64).alias("parent_node_id"),
    )
    levels = [known]
    for d in range(1, max_depth + 1):
        level = base.filter(pl.col("depth") == d).join(
            known.select("rank", pl.col("span_id").alias("parent_span_id"), pl.col("node_id").alias("parent_node_id")),
            on=["rank", "parent_span_id"],
            how="left",
        )
        known = level.select(
            "_row",
            "rank",
            "span_id",
            pl.when(pl.col("parent_node_id").is_null())
            .then(pl.col("_own"))
            .otherwise(pl.struct("parent_node_id", "_own").hash())
            .alias("node_id"),
            "parent_node_id",
        )
        levels.append(known)
    # Back in row order by a sort of the row numbers: cheaper than joining the nodes to the spans.
    return pl.concat(levels).sort("_row").drop("_row")


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
    nodes = assign_nodes(spans).select("node_id", "parent_node_id")
    # names stay categorical until there is one row per node
    tagged = pl.concat(
        [spans.select("rank", "span_id", "step", "duration_ns", "self_ns", "fqn", "module_type", "phase",
                      is_attributed().alias("_attributed")),
         nodes],
        how="horizontal",
    )
    per_step = tagged.group_by("node_id", "rank", "step").agg(
        pl.col("duration_ns").sum().alias("_inc"), pl.col("self_ns").sum().alias("_self")
    )
    medians = per_step.group_by("node_id").agg(
        pl.len().alias("steps"),
        pl.col("_inc").median().alias("inclusive_median_ns"),
        pl.col("_self").median().alias("self_median_ns"),
    )
    step_total = total_step_time(spans)
    agg = (
        tagged.group_by("node_id")
        .agg(
            pl.col("parent_node_id").first(),
            pl.col("fqn").first(),
            pl.col("module_type").first(),
            pl.col("phase").first(),
            pl.len().alias("calls"),
            pl.col("duration_ns").sum().alias("inclusive_total_ns"),
            pl.col("self_ns").sum().alias("self_total_ns"),
            pl.col("rank").min().alias("_rank"),
            pl.col("span_id").filter(pl.col("rank") == pl.col("rank").min()).min().alias("_first"),
            pl.col("_attributed").sum().alias("_attributed"),
        )
        .with_columns(pl.col("fqn", "module_type").cast(pl.String))
        .join(medians, on="node_id")
        .with_columns(
            (pl.col("inclusive_total_ns") * 100.0 / step_total if step_total else pl.lit(None, dtype=pl.Float64))
            .alias("percent"),
            source_of(pl.col("_attributed"), pl.col("calls")).alias("source"),
        )
        .sort("_rank", "_first")
    )
    # Pre-order walk over the (small) node table.
    children: dict[int | None, list[int]] = {}
    for node, parent in agg.select("node_id", "parent_node_id").iter_rows():
        children.setdefault(parent, []).append(node)
    order: list[tuple[int, int]] = []
    stack = [(n, 0) for n in reversed(children.get(None, []))]
    while stack:
        node, level = stack.pop()
        order.append((node, level))
        stack.extend((c, level + 1) for c in reversed(children.get(node, [])))
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
