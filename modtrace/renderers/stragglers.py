"""Renderers of ``modtrace stragglers``: the model is ``Stragglers.to_dict()`` with ``run`` added
(plain values), as a table, JSON, CSV (one row per step) or Markdown."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Mapping
from typing import Any

from modtrace.renderers.base import Renderer
from modtrace.renderers.rows import Table, TableRenderer


def _ms(ns: Any) -> str:
    return "" if ns is None else f"{ns / 1e6:.2f}"


def who(s: Mapping[str, Any] | None) -> str:
    """``rank 1 blocks.1 forward``, or ``rank 3 (every module, 1.31x)`` for a slow rank."""
    if s is None:
        return "-"
    if s["kind"] == "rank":
        return f"rank {s['rank']} (every module, {s['ratio']:.2f}x)"
    return f"rank {s['rank']} {s['fqn']} {s['phase']}"


def waited(w: Mapping[str, Any] | None) -> str:
    if w is None:
        return ""
    parts = []
    if w["outside_ns"]:
        parts.append(f"outside modules {_ms(w['outside_ns'])} ms")
    if w["inside"] is not None:
        parts.append(f"in {w['inside']['fqn']} {w['inside']['phase']} {_ms(w['inside']['ns'])} ms")
    return "; ".join(parts) or "-"


def head_lines(model: Mapping[str, Any]) -> list[str]:
    """What was compared: ranks, steps, and the steps skipped or left out."""
    n = len(model["steps"])
    line = f"run {model['run']}: {model['ranks']} ranks, {n} step(s) compared"
    if model.get("skipped"):
        line += f" (steps before {model['skipped']} skipped)"
    lines = [line]
    if model["left_out_steps"]:
        steps = ", ".join(str(s) for s in model["left_out_steps"][:20])
        more = " ..." if len(model["left_out_steps"]) > 20 else ""
        lines.append(f"left out: step(s) {steps}{more}: not every rank recorded them")
    return lines


def persistent_lines(model: Mapping[str, Any]) -> list[str]:
    n = len(model["steps"])
    if not model["persistent"]:
        return ["persistent straggler: none (no rank and module named in half the steps or more)"]
    out = []
    for p in model["persistent"]:
        name = who(p)
        out.append(f"persistent straggler: {name}: {p['steps']}/{n} steps, median +{_ms(p['median_excess_ns'])} ms; "
                   f"what-if step {_ms(p['what_if_step_ns'])} ms")
    return out


def step_table(model: Mapping[str, Any]) -> Table:
    rows = []
    for s in model["steps"]:
        st = s["straggler"]
        rows.append([s["step"], _ms(s["step_ns"]), who(st), "" if st is None else "+" + _ms(st["excess_ns"]),
                     waited(s["waited"]), _ms(s["what_if_step_ns"])])
    return Table(["step", "step_ms", "straggler", "excess_ms", "others waited", "what_if_ms"], rows,
                 droppable=["others waited"])


class StragglersRenderer(Renderer[Mapping[str, Any]]):
    kind = "stragglers"


class StragglersTableRenderer(StragglersRenderer):
    name = "table"

    def render(self, model: Mapping[str, Any]) -> str:
        table = TableRenderer(terminal=self.terminal).render(step_table(model))
        return "\n".join(head_lines(model)) + "\n" + table + "\n".join(persistent_lines(model)) + "\n"


class StragglersJsonRenderer(StragglersRenderer):
    name = "json"

    def render(self, model: Mapping[str, Any]) -> str:
        return json.dumps(dict(model), indent=2) + "\n"


_CSV = ["step", "step_ns", "kind", "rank", "fqn", "phase", "excess_ns", "ratio", "waited_outside_ns", "waited_fqn",
        "waited_phase", "waited_ns", "what_if_step_ns"]


class StragglersCsvRenderer(StragglersRenderer):
    name = "csv"

    def render(self, model: Mapping[str, Any]) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(_CSV)
        for s in model["steps"]:
            st = s["straggler"] or {}
            w = s["waited"] or {}
            inside = w.get("inside") or {}
            row = [s["step"], s["step_ns"], st.get("kind"), st.get("rank"), st.get("fqn"), st.get("phase"),
                   st.get("excess_ns"), st.get("ratio"), w.get("outside_ns"), inside.get("fqn"), inside.get("phase"),
                   inside.get("ns"), s["what_if_step_ns"]]
            writer.writerow(["" if v is None else v for v in row])
        return buf.getvalue()


class StragglersMarkdownRenderer(StragglersRenderer):
    name = "markdown"

    def render(self, model: Mapping[str, Any]) -> str:
        from modtrace.renderers.rows import MarkdownRenderer

        out = [f"{line}  " for line in head_lines(model)]
        out.append("")
        out.append(MarkdownRenderer().render(step_table(model)))
        out.extend(f"- {line}" for line in persistent_lines(model))
        return "\n".join(out) + "\n"
