"""The numbers derived from a module's work counts and its time, defined once for ``tree``,
``Database.tree`` and the HTML report (docs/schema.md, "Glossary").

A module's work per step is the median, over its counted steps, of its inclusive FLOPs
(bytes) summed over its calls in the step; its time per step is the median, over every
step it ran in, of its inclusive time summed likewise (``tree``'s ``incl/step``).  The
time is not that of the counted steps alone: counting routes every op through Python,
which slows the counted steps themselves (docs/performance.md, "Work counters"), and work counts repeat
from step to step of the same shapes (``--counters first`` counts one step per kind).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from typing import Any

# A node's (or a module's) work columns: what was counted, then what is derived from it.
COUNTED_KEYS: tuple[str, ...] = ("counted_steps", "flops_per_step", "bytes_per_step", "unknown_ops_per_step")
DERIVED_KEYS: tuple[str, ...] = ("gflop_per_s", "flop_per_byte", "peak_percent")
WORK_KEYS: tuple[str, ...] = (*COUNTED_KEYS, *DERIVED_KEYS)


def achieved_gflop_per_s(flops_per_step: float | None, ns_per_step: float | None) -> float | None:
    """Achieved throughput in GFLOP/s: FLOPs per step over nanoseconds per step (one FLOP per
    nanosecond is one GFLOP/s); None when either is missing or the time is 0."""
    if flops_per_step is None or not ns_per_step:
        return None
    return float(flops_per_step) / float(ns_per_step)


def flop_per_byte(flops_per_step: float | None, bytes_per_step: float | None) -> float | None:
    """Arithmetic intensity: FLOPs per byte of the ops' tensor inputs and outputs."""
    if flops_per_step is None or not bytes_per_step:
        return None
    return float(flops_per_step) / float(bytes_per_step)


def peak_percent(gflop_per_s: float | None, peak_tflops: float | None) -> float | None:
    """Utilisation: achieved FLOP/s as a percentage of a peak given in TFLOP/s."""
    if gflop_per_s is None or peak_tflops is None:
        return None
    return gflop_per_s / (peak_tflops * 1000.0) * 100.0


def derived(counted: Mapping[str, Any] | None, ns_per_step: float | None, peak_tflops: float | None) -> dict[str, Any]:
    """``WORK_KEYS`` of one node or module: ``counted`` (its ``COUNTED_KEYS``; None when it was not
    counted, every key then None) and its time per step."""
    if counted is None:
        return dict.fromkeys(WORK_KEYS)
    rate = achieved_gflop_per_s(counted["flops_per_step"], ns_per_step)
    return {
        **{k: counted[k] for k in COUNTED_KEYS},
        "gflop_per_s": rate,
        "flop_per_byte": flop_per_byte(counted["flops_per_step"], counted["bytes_per_step"]),
        "peak_percent": peak_percent(rate, peak_tflops),
    }


def counts_by_node(nodes: Iterable[Mapping[str, Any]], spans: Iterable[tuple[Any, ...]]) -> dict[int, dict[str, Any]]:
    """node_id -> ``COUNTED_KEYS`` of each node that ran in a counted step.

    ``nodes``: the whole tree's nodes (node_id, parent_node_id, phase, fqn; before any filter
    re-parents them); ``spans``: (rank, sample, span_id, parent_span_id, phase, fqn, flops,
    bytes, unknown_ops) of whole counted steps (``sample`` the step: a key unique within a
    rank), inclusive counts.  A span's node is its parent's child of its (phase, fqn), a root's
    (or a span whose parent is not among them) the root node of it: the call path
    ``analysis.aggregate.assign_nodes`` hashes into the node id.  Pure Python: a stored tree
    gets its work without polars."""
    child = {(n["parent_node_id"], str(n["phase"]), str(n["fqn"])): n["node_id"] for n in nodes}
    node_of: dict[tuple[int, int], int] = {}
    per_step: dict[tuple[int, int, int], list[int]] = {}
    for rank, sample, span_id, parent, phase, fqn, flops, nbytes, unknown in sorted(spans, key=lambda r: (r[0], r[2])):
        node = child.get((node_of.get((rank, parent)) if parent is not None else None, str(phase), str(fqn)))
        if node is None:
            continue
        node_of[(rank, span_id)] = node
        acc = per_step.setdefault((node, rank, sample), [0, 0, 0])
        acc[0] += flops
        acc[1] += nbytes
        acc[2] += unknown
    samples: dict[int, list[list[int]]] = {}
    for (node, _, _), acc in per_step.items():
        samples.setdefault(node, []).append(acc)
    return {
        node: {
            "counted_steps": len(accs),
            "flops_per_step": float(statistics.median(a[0] for a in accs)),
            "bytes_per_step": float(statistics.median(a[1] for a in accs)),
            "unknown_ops_per_step": float(statistics.median(a[2] for a in accs)),
        }
        for node, accs in samples.items()
    }


def check_peak(peak_tflops: float | None) -> None:
    """A usage error unless the peak is None or a positive finite number."""
    import math

    from modtrace.core.errors import UsageError

    if peak_tflops is not None and not (isinstance(peak_tflops, (int, float)) and math.isfinite(peak_tflops)
                                        and peak_tflops > 0):
        raise UsageError(f"peak_tflops={peak_tflops!r}: a number of TFLOP/s above 0")
