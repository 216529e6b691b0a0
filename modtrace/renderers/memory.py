"""Renderers of ``modtrace memory``: the model is ``MemoryReport.to_dict()`` with ``top`` (how many
modules the table and Markdown list) added, plain values; as a table, JSON, CSV (the modules, one
row each) or Markdown."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from typing import Any

from modtrace.core.sizes import format_bytes
from modtrace.renderers.base import Renderer
from modtrace.renderers.rows import MarkdownRenderer, Table, TableRenderer
from modtrace.renderers.tree import format_ns


def _percent(new: float, old: float) -> str:
    return f"{(new - old) / old * 100:+.0f}%" if old else ""


def step_table(model: Mapping[str, Any]) -> Table:
    rows = [[s["rank"], s["step"], s["device"], format_bytes(s["base_bytes"]), format_bytes(s["peak_bytes"])]
            for s in model["steps"]]
    return Table(["rank", "step", "device", "alive at start", "peak"], rows,
                 title="peak live tensor memory of each counted step")


def module_table(model: Mapping[str, Any]) -> Table:
    shown = model["modules"][: model.get("top") or len(model["modules"])]
    rows = [[m["fqn"], m["calls"], format_bytes(m["kept_bytes"]), format_bytes(m["freed_bytes"]),
             format_bytes(m["forward_peak_bytes"]), format_ns(m["forward_ns"]), "yes" if m["backward"] else "no"]
            for m in shown]
    more = len(model["modules"]) - len(shown)
    title = f"modules by what their forward keeps, on {model['device']} (per counted step)"
    if more > 0:
        title += f"; {more} more with less"
    return Table(["module", "calls", "kept", "not returned", "fwd peak", "fwd time", "backward"], rows, title=title,
                 droppable=["backward", "fwd peak", "calls"])


def summary_lines(model: Mapping[str, Any]) -> list[str]:
    """The step time, the what-if and the budget's answer, one line each."""
    n = model["timed_steps"]
    lines = [f"step time {format_ns(model['step_ns'])} (median over {n} step{'s' if n != 1 else ''})"]
    w = model.get("what_if")
    if w is not None:
        names = ", ".join(w["modules"]) or "no module with a backward"
        lines.append(
            f"what-if, checkpoint {' '.join(w['checkpoint'])} ({names}): peak {format_bytes(w['measured_peak_bytes'])}"
            f" -> {format_bytes(w['peak_bytes'])} ({_percent(w['peak_bytes'], w['measured_peak_bytes'])}); step "
            f"{format_ns(w['measured_step_ns'])} -> {format_ns(w['step_ns'])} (+{format_ns(w['added_ns'])} recompute)")
    b = model.get("budget")
    if b is not None:
        how = f"{b['search']} search over {b['candidates']} candidate module{'s' if b['candidates'] != 1 else ''}"
        if not b["found"]:
            lines.append(f"budget {format_bytes(b['budget_bytes'])}: no set of modules brings the predicted peak "
                         f"within it ({how}; the lowest predicted: {format_bytes(b['lowest_peak_bytes'])})")
        elif not b["modules"]:
            lines.append(f"budget {format_bytes(b['budget_bytes'])}: the measured peak is within it; nothing to "
                         "checkpoint")
        else:
            lines.append(f"budget {format_bytes(b['budget_bytes'])}: checkpoint {', '.join(b['modules'])}: predicted "
                         f"peak {format_bytes(b['peak_bytes'])}, step {format_ns(b['step_ns'])} "
                         f"(+{format_ns(b['added_ns'])}) ({how})")
    return lines


class MemoryRenderer(Renderer[Mapping[str, Any]]):
    kind = "memory"


class MemoryTableRenderer(MemoryRenderer):
    name = "table"

    def render(self, model: Mapping[str, Any]) -> str:
        table = TableRenderer(terminal=self.terminal)
        return (f"run {model['run']}\n" + table.render(step_table(model)) + "\n" + table.render(module_table(model))
                + "\n" + "\n".join(summary_lines(model)) + "\n")


class MemoryJsonRenderer(MemoryRenderer):
    name = "json"

    def render(self, model: Mapping[str, Any]) -> str:
        return json.dumps({k: v for k, v in model.items() if k != "top"}, indent=2) + "\n"


_CSV = ["fqn", "calls", "kept_bytes", "freed_bytes", "forward_peak_bytes", "forward_ns", "backward"]


class MemoryCsvRenderer(MemoryRenderer):
    name = "csv"

    def render(self, model: Mapping[str, Any]) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(_CSV)
        for m in model["modules"]:
            writer.writerow([m[c] for c in _CSV])
        return buf.getvalue()


class MemoryMarkdownRenderer(MemoryRenderer):
    name = "markdown"

    def render(self, model: Mapping[str, Any]) -> str:
        md = MarkdownRenderer()
        out = [f"run {model['run']}", "", md.render(step_table(model)), md.render(module_table(model))]
        out.extend(f"- {line}" for line in summary_lines(model))
        return "\n".join(out) + "\n"
