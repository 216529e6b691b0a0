"""``Database.tree`` and ``api._cli.tree_rows``: a run's module call tree, from its stored tree when
that answers the options, else from its spans.  ``Database._tree_rows`` resolves the run and
the clock and hands this module the store and where to get the run's spans.

A stored tree (``modtrace.results.tree``) is the whole run's, on one clock, its
steps under the run's own rule: it answers any ``--phase``, ``--max-depth``
and ``--min-percent`` (they filter nodes, ``tree_rows.filter_nodes``) and a
``--step-on`` that resolves to that rule; ``--step``, ``--rank`` and
``--step-kind`` select spans, so they read the spans (as does a run without
a stored tree: analysed by an older modtrace, or rank by rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from modtrace.core.contracts import PHASES
from modtrace.core.errors import UsageError

if TYPE_CHECKING:
    from collections.abc import Callable

    import polars as pl

    from modtrace.store.engine import Store


@dataclass(frozen=True)
class TreeOptions:
    """What ``tree`` was asked for (``Database.tree``'s keywords)."""

    phase: str | None = None
    step: int | None = None
    rank: int | None = None
    max_depth: int | None = None
    min_percent: float | None = None
    step_on: str | None = None
    step_kind: str | None = None
    peak_tflops: float | None = None

    def check(self) -> None:
        from modtrace.core.work import check_peak

        if self.phase is not None and self.phase not in PHASES:
            raise UsageError(f"phase {self.phase!r}: one of {', '.join(PHASES)}")
        check_peak(self.peak_tflops)

    @property
    def whole_run(self) -> bool:
        """Whether every span counts (no step, rank or step kind selected)."""
        return self.step is None and self.rank is None and self.step_kind in (None, "all")

    @property
    def phases(self) -> set[str] | None:
        return None if self.phase is None else {self.phase}


def stored_nodes(store: Store, run_id: int, clock: str, opts: TreeOptions
                 ) -> tuple[list[dict[str, Any]], dict[int, Any] | None, dict[int, Any] | None] | None:
    """The nodes to show from the run's stored tree on ``clock``, the tree's work counts
    (``results.counters.node_counts``) and memory (``results.memory.node_memory``); None when it
    cannot answer ``opts``."""
    from modtrace.core.tree_rows import filter_nodes
    from modtrace.results.counters import node_counts
    from modtrace.results.memory import node_memory
    from modtrace.results.tree import read_tree_rows

    nodes = read_tree_rows(store, run_id, clock, opts.step_on) if opts.whole_run else None
    if nodes is None:
        return None
    shown = filter_nodes(nodes, phases=opts.phases, max_depth=opts.max_depth, min_percent=opts.min_percent)
    return shown, node_counts(store, run_id, nodes), node_memory(store, run_id, nodes)


def step_ranges(steps: list[int]) -> str:
    """Sorted step numbers as runs of consecutive steps: ``0-4, 10, 20-29``.

    A scheduled run records a few windows of steps; listing them is what tells
    the reader which ``--step`` values exist.
    """
    parts: list[str] = []
    start = prev = steps[0]
    for step in [*steps[1:], None]:
        if step is not None and step == prev + 1:
            prev = step
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if step is not None:
            start = prev = step
    return ", ".join(parts)


def nodes_from_spans(store: Store, run_id: int, run_name: str, frame: pl.DataFrame, opts: TreeOptions
                     ) -> tuple[pl.DataFrame, dict[int, Any] | None, dict[int, Any] | None]:
    """The nodes frame to show, from the run's spans ``frame`` (with at least ``TREE_SPAN_COLUMNS``),
    its nodes' work counts (``results.counters.node_counts``; None when the run counted none) and
    memory (``results.memory.node_memory``; None when it has none)."""
    import polars as pl

    from modtrace.analysis.aggregate import filter_tree, module_tree
    from modtrace.api._steps import of_kind, restep
    from modtrace.results.counters import node_counts
    from modtrace.results.memory import node_memory

    stepped = restep(store, run_id, run_name, frame, opts.step_on)
    spans = stepped.frame if opts.step_kind in (None, "all") else of_kind(run_name, stepped, opts.step_kind)
    if opts.rank is not None:
        if opts.rank not in set(spans["rank"].unique().to_list()):
            raise UsageError(f"run {run_name} has no spans on rank {opts.rank}")
        spans = spans.filter(pl.col("rank") == opts.rank)
    if opts.step is not None:
        chosen = spans.filter(pl.col("step") == opts.step)
        if chosen.height == 0:
            recorded = spans["step"].drop_nulls().unique().sort().to_list()
            where = f"its steps are {step_ranges(recorded)}" if recorded else "it has no steps"
            raise UsageError(f"run {run_name} has no spans in step {opts.step}; {where}")
        spans = chosen
    whole = module_tree(spans)
    nodes = filter_tree(whole, phases=opts.phases, max_depth=opts.max_depth, min_percent=opts.min_percent)
    keys = whole.select("node_id", "parent_node_id", "phase", "fqn").to_dicts()
    return nodes, node_counts(store, run_id, keys, spans, frame), node_memory(store, run_id, keys, spans, frame)


def tree_nodes(store: Store, run_id: int, run_name: str, clock: str, opts: TreeOptions,
               spans: Callable[[tuple[str, ...]], pl.DataFrame]) -> list[dict[str, Any]]:
    """The nodes ``tree`` shows on ``clock`` (resolved), as plain dicts in pre-order with their work
    (``core.work.WORK_KEYS``, None where a node ran in no counted step): the stored tree's rows when
    it answers ``opts`` (read without polars unless the run counted work), else computed from
    ``spans(columns)``, the run's spans on ``clock`` with at least those columns (called only then)."""
    from modtrace.core.memory_nodes import MEMORY_KEYS
    from modtrace.core.work import derived

    stored = stored_nodes(store, run_id, clock, opts)
    if stored is not None:
        nodes, counts, memory = stored
    else:
        from modtrace.analysis.aggregate import TREE_SPAN_COLUMNS

        frame, counts, memory = nodes_from_spans(store, run_id, run_name, spans(TREE_SPAN_COLUMNS), opts)
        nodes = frame.to_dicts()
    found, held = counts or {}, memory or {}
    none = dict.fromkeys(MEMORY_KEYS)
    return [{**n, **derived(found.get(n["node_id"]), n["inclusive_median_ns"], opts.peak_tflops),
             **held.get(n["node_id"], none)} for n in nodes]
