"""Each call-tree node's memory on counted steps, for ``tree``, ``Database.tree`` and the HTML
report: what its calls kept (``kept_mem_per_step``: the median, over its counted steps, of its
calls' ``kept_mem_bytes`` summed in the step) and the most any of its calls reached above its
entry level (``peak_mem_bytes``, the largest ``peak_mem_bytes``).  Pure Python, so a stored
tree gets its memory without polars (docs/memory.md)."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

MEMORY_KEYS: tuple[str, ...] = ("kept_mem_per_step", "peak_mem_bytes")


def memory_by_node(nodes: Iterable[Mapping[str, Any]], spans: Iterable[tuple[Any, ...]]) -> dict[int, dict[str, Any]]:
    """node_id -> ``MEMORY_KEYS`` of each node with a span that has memory.

    ``nodes``: the whole tree's (node_id, parent_node_id, phase, fqn); ``spans``: (rank, sample,
    span_id, parent_span_id, phase, fqn, kept, peak) of whole counted steps, ``sample`` the step
    (a key unique within a rank).  A span's node is found as ``core.work.counts_by_node`` finds
    it: its parent's node's child of its (phase, fqn)."""
    child = {(n["parent_node_id"], str(n["phase"]), str(n["fqn"])): n["node_id"] for n in nodes}
    node_of: dict[tuple[int, int], int] = {}
    kept: dict[tuple[int, int, int], int] = {}
    peak: dict[int, int] = {}
    for rank, sample, span_id, parent, phase, fqn, kept_bytes, peak_bytes in sorted(spans, key=lambda r: (r[0], r[2])):
        node = child.get((node_of.get((rank, parent)) if parent is not None else None, str(phase), str(fqn)))
        if node is None:
            continue
        node_of[(rank, span_id)] = node
        if kept_bytes is not None:
            kept[(node, rank, sample)] = kept.get((node, rank, sample), 0) + int(kept_bytes)
        if peak_bytes is not None:
            peak[node] = max(peak.get(node, 0), int(peak_bytes))
    samples: dict[int, list[int]] = {}
    for (node, _, _), value in kept.items():
        samples.setdefault(node, []).append(value)
    return {
        node: {"kept_mem_per_step": float(statistics.median(samples[node])) if node in samples else None,
               "peak_mem_bytes": peak.get(node)}
        for node in set(samples) | set(peak)
    }
