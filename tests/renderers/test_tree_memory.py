"""The tree shows kept and peak memory when nodes have them, and a narrow terminal drops them
before any other column."""

from __future__ import annotations

from typing import Any

from modtrace.renderers.base import Terminal
from modtrace.renderers.tree import TreeTextRenderer, TreeView


def _node(level: int, fqn: str, kept: float | None, peak: int | None) -> dict[str, Any]:
    return {"level": level, "fqn": fqn, "module_type": "Linear", "phase": "forward", "calls": 2, "steps": 2,
            "inclusive_total_ns": 2000, "self_total_ns": 1000, "inclusive_median_ns": 1000.0, "self_median_ns": 500.0,
            "percent": 50.0, "source": "hooks", "flops_per_step": 1e6, "gflop_per_s": 1.0, "flop_per_byte": 0.5,
            "peak_percent": None, "kept_mem_per_step": kept, "peak_mem_bytes": peak}


NODES = [_node(0, "Net", 3 * 1024**2, 4 * 1024**2), _node(1, "Net.fc", 1024.0, 2048)]


def test_memory_columns_when_present_and_dropped_first() -> None:
    wide = TreeTextRenderer().render(TreeView(NODES))
    assert wide.splitlines()[0].split()[-3:] == ["kept/step", "peak", "mem"]
    assert "3 MiB" in wide and "4 MiB" in wide and "1 KiB" in wide
    full = len(wide.splitlines()[0])
    narrow = TreeTextRenderer(terminal=Terminal(width=full - 12)).render(TreeView(NODES))
    first = narrow.splitlines()[0]
    assert "peak mem" not in first and "FLOP/B" in first and "incl total" in first
    narrower = TreeTextRenderer(terminal=Terminal(width=full - 24)).render(TreeView(NODES))
    assert "kept/step" not in narrower.splitlines()[0] and "FLOPs/step" in narrower.splitlines()[0]


def test_no_memory_columns_without_memory() -> None:
    plain = [{**n, "kept_mem_per_step": None, "peak_mem_bytes": None} for n in NODES]
    assert "kept/step" not in TreeTextRenderer().render(TreeView(plain))
