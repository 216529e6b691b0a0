"""Renderers of ``modtrace diff``: one document (``diff_document``), four formats.

The table, markdown and csv renderers read only the document; a
``DiffView`` is the document and whether unchanged modules are listed too.
"""

from __future__ import annotations

import json
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from modtrace.renderers.base import Renderer
from modtrace.renderers.rows import CsvRenderer, MarkdownRenderer, Table, TableRenderer
from modtrace.renderers.steps import step_lines


@dataclass(frozen=True)
class DiffView:
    doc: dict[str, Any]  # diff_document.document
    show_all: bool = False  # also list unchanged modules (table and markdown)
    explain: tuple[str, ...] = ()  # modules whose every check is listed, blamed or not (--explain)


# -- text helpers ---------------------------------------------------------------


def fmt_time(us: float | None, *, signed: bool = False) -> str:
    if us is None:
        return ""
    sign = "+" if signed and us > 0 else ("-" if us < 0 else "")
    v = abs(us)
    if v >= 1_000_000:
        text = f"{v / 1_000_000:.3g} s"
    elif v >= 1000:
        text = f"{v / 1000:.3g} ms"
    else:
        text = f"{v:.3g} us"
    return sign + text


def fmt_ratio(ratio: float | None) -> str:
    if ratio is None:
        return "new"
    return f"{(ratio - 1) * 100:+.1f}%"


def fmt_p(p: float | None) -> str:
    if p is None:
        return ""
    return "<1e-6" if p < 1e-6 else f"{p:.2g}"


def _ci(stats: dict[str, Any]) -> str:
    lo, hi = stats["ci_low_us"], stats["ci_high_us"]
    if lo is None or hi is None:
        return ""
    return f"[{fmt_time(lo, signed=True)}, {fmt_time(hi, signed=True)}]"


def _side(doc: dict[str, Any], side: str) -> str:
    info = doc[side]
    rank = "" if info.get("rank") is None else f" rank {info['rank']}"
    history = info.get("history")
    if history and len(history) > 1:
        chosen = f"{info['selector']}, " if info.get("selector") else ""
        runs = ", ".join(repr(h["run"]) for h in history)
        per_run = [h["step_us"] for h in history]
        return (f"history of {len(history)} runs ({chosen}newest first: {runs}{rank}; {info['steps']} steps; "
                f"median step time per run {fmt_time(min(per_run))} to {fmt_time(max(per_run))})")
    return f"{info['run']!r} (run {info['run_id']}{rank}, {info['steps']} steps, median step time {fmt_time(info['step_us'])})"


# Checks passed by a value below their bar (p-values); history_runs by one at or above it.
_BELOW = ("steps", "p_holm", "step_p")


def _ordinal(pct: float) -> str:
    n = f"{pct:g}"
    if not n.isdigit():
        return n
    suffix = "th" if 10 <= int(n) % 100 <= 20 else {"1": "st", "2": "nd", "3": "rd"}.get(n[-1], "th")
    return n + suffix


def fmt_check(check: dict[str, Any], mark: bool = False) -> str:
    """``name value > bar`` as the rule judged it; ``mark``: followed by pass or FAIL."""
    name, value, bar, passed = check["name"], check["value"], check["bar"], check["passed"]
    if name == "history_runs":
        above = True
    elif name in _BELOW:
        above = False
    else:
        above = bar is not None and bar >= (0 if name.endswith("_us") else 1)

    def num(v: float | None) -> str:
        if v is None:
            return "n/a"
        if name in _BELOW:
            return fmt_p(v)
        if name.endswith("_us"):
            return f"{v:+,.0f}" if abs(v) >= 100 else f"{v:+.3g}"
        return f"{v:.3g}" if name == "history_runs" else f"{v:.3f}"

    if name == "history_runs":
        op = ">=" if passed else "<"
    elif passed:
        op = ">" if above else "<"
    else:
        op = "<=" if above else ">="
    text = f"{name} {num(value)} {op} {num(bar)}"
    return f"{text} {'pass' if passed else 'FAIL'}" if mark else text


def module_checks_line(row: dict[str, Any]) -> str:
    """"fqn phase: check, check, ...": the checks that blamed a module."""
    return f"{row['fqn']} {row['phase']}: " + ", ".join(fmt_check(c) for c in row["checks"])


_MEASURES = {
    "raw": "step time",
    "wall": "step time at the history's machine speed",
    "cpu": "CPU time per step at the history's machine speed",
    "cpu_raw": "CPU time per step as measured",
}


def step_line(doc: dict[str, Any]) -> str | None:
    """The step verdict in one line, with the check that decided it (all of them for a step-wide
    change); None for one base run when the step's own checks did not all pass (nothing to say)."""
    step = doc["step"]
    verdict, checks = step["verdict"], step["checks"]
    if not checks:
        return None
    measure = _MEASURES[step["measure"]]
    if step["measure"] == "raw":  # judged at the level, not the median the cand line shows
        measure = f"step time's {_ordinal(doc['options']['level_pct'])} percentile"
    what = f"{measure} {fmt_ratio(step['ratio'])}"
    if verdict in ("regression", "improvement"):
        return f"step: a step-wide {verdict}, {what}: " + ", ".join(fmt_check(c) for c in checks)
    failed = [c for c in checks if not c["passed"]]
    if verdict == "unknown":
        if len(failed) > 1:
            return None  # one base run, and the step did not move beyond it either
        return (f"step: unknown, {what}: {fmt_check(failed[0])} (one base run cannot tell a step-wide change from "
                "machine load; judge against a history: modtrace diff 'tag:KEY=VALUE' CAND)")
    return f"step: unchanged, {what}: {fmt_check(failed[0])}"


def _few_steps(doc: dict[str, Any]) -> str | None:
    """A warning when the runs have too few steps for the rule to blame anything (check steps)."""
    s, o = doc["summary"], doc["options"]
    p = s["min_p_value"]
    if p is None or not s["compared"]:
        return None
    n_b, n_c = doc["base"]["steps"], doc["cand"]["steps"]
    if p >= o["alpha"]:
        need = s["min_steps"]
        return (f"warning: too few steps ({n_b} and {n_c} compared): the smallest p the test can reach is "
                f"{fmt_p(p)}, not below alpha {o['alpha']:g}, so no module can be blamed; record at least "
                f"{need + o['skip_steps']} steps per run ({need} compared after --skip-steps {o['skip_steps']})")
    if o.get("absolute") and p * s["compared"] >= o["alpha"]:
        return (f"warning: few steps ({n_b} and {n_c}) for {s['compared']} comparisons: with --absolute only a "
                "change seen in every step can be significant after Holm; record more steps")
    return None


def headline(doc: dict[str, Any]) -> list[str]:
    s, o = doc["summary"], doc["options"]
    ratio = s["step_ratio"]
    lines = [
        f"base {_side(doc, 'base')}",
        f"cand {_side(doc, 'cand')}" + ("" if ratio is None else f": step time {fmt_ratio(ratio)}"),
        (
            f"{_count(s['regressions'], 'regression')}, {_count(s['improvements'], 'improvement')}, "
            f"{_count(s['structure_changes'], 'structure change')} "
            f"({s['compared']} module/phase pairs compared"
            + ("; absolute times" if o.get("absolute") else "")
            + f"; first {o['skip_steps']} step(s) skipped; {doc['base'].get('clock', 'host')} clock; "
            "the rule: docs/diff.md)"
        ),
    ]
    lines.extend(step_lines(doc["base"], doc["cand"]))
    if doc.get("counters") is not None:
        lines.append(f"{_count(s.get('counter_changes', 0), 'work counter change')} (FLOPs, bytes, ops and kept "
                     "memory per module and phase on the first counted step of each kind, exact)")
    step = step_line(doc)
    if step is not None:
        lines.append(step)
    if doc["step"].get("note"):
        lines.append(f"note: {doc['step']['note']}")
    if s.get("order_varies"):
        lines.append("note: call order varies from step to step within a run (data-dependent): order not compared")
    few = _few_steps(doc)
    if few is not None:
        lines.append(few)
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


TIMING_HEADERS = (
    "module", "phase", "base", "cand", "delta", "change", "CI of delta", "p (Holm)", "share of step", "impact/step",
)
# On a narrow terminal the timing tables leave these out first, in this order (the checks under
# the table say what was judged; a pipe keeps every column).
TIMING_DROPS = ("CI of delta", "p (Holm)", "delta", "share of step")


def fmt_share(share: dict[str, Any]) -> str:
    b, c = share["base_pct"], share["cand_pct"]
    if b is None or c is None:
        return ""
    return f"{b:.3g}% -> {c:.3g}%"


def timing_rows(doc: dict[str, Any], verdict: str, metric: str = "self") -> list[list[Any]]:
    rows = []
    for r in doc["timing"]:
        if r["verdict"] != verdict:
            continue
        st = r["self" if metric == "self" else "inclusive"]
        sh = r["self_share" if metric == "self" else "inclusive_share"]
        impact = r["impact_us"] if metric == "self" else st["delta_us"]
        pct = r["impact_pct"]
        rows.append([
            r["fqn"], r["phase"], fmt_time(st["base_us"]), fmt_time(st["cand_us"]),
            fmt_time(st["delta_us"], signed=True), fmt_ratio(st["ratio"]), _ci(st), fmt_p(st["p_adjusted"]),
            fmt_share(sh), fmt_time(impact, signed=True) + ("" if pct is None or metric != "self" else f" ({pct:+.1f}%)"),
        ])
    return rows


SECTIONS = (
    ("regression", "self", "Regressions (self time got slower; sorted by impact on step time)"),
    ("improvement", "self", "Improvements (self time got faster)"),
    ("inherited", "incl", "Inherited (inclusive time changed through a descendant: context, not blame)"),
    ("unchanged", "self", "Unchanged"),
)

STRUCTURE_HEADERS = ("change", "module", "phase", "base", "cand")

CALLS_TITLE = "Calls per step that vary from step to step (data-dependent: compared as ranges, min / median / max)"
CALLS_HEADERS = ("module", "phase", "base", "cand", "changed")


def _calls_text(d: dict[str, float]) -> str:
    return " / ".join(f"{d[q]:g}" for q in ("min", "median", "max"))


def calls_rows(doc: dict[str, Any]) -> list[list[Any]]:
    return [[c["fqn"], c["phase"], _calls_text(c["base"]), _calls_text(c["cand"]), "yes" if c["changed"] else "no"]
            for c in doc.get("calls_per_step", [])]


def structure_rows(doc: dict[str, Any]) -> list[list[Any]]:
    return [[s["kind"], s["fqn"] or "", s["phase"] or "", s["base"], s["cand"]] for s in doc["structure"]]


def order_lines(doc: dict[str, Any]) -> list[str]:
    order = doc["order"]
    if order is None:
        return []
    rows = order["excerpt"]
    width = max([len(r["base"] or "") for r in rows] + [4])
    out = []
    for r in rows:
        pos_b = "" if r["base_pos"] is None else str(r["base_pos"])
        pos_c = "" if r["cand_pos"] is None else str(r["cand_pos"])
        out.append(f"{r['op']} {pos_b:>5} {(r['base'] or ''):<{width}} | {pos_c:>5} {r['cand'] or ''}".rstrip())
    return out


def order_title(doc: dict[str, Any]) -> str:
    o = doc["order"]
    step = f"step {o['step_base']}" + ("" if o["step_cand"] == o["step_base"] else f" (candidate step {o['step_cand']})")
    return f"Call order differs: {step}, first at call {o['position']} (base | candidate)"


# -- renderers ------------------------------------------------------------------


class DiffRenderer(Renderer[DiffView]):
    kind = "diff"


# How a finding stands out on a terminal that takes colour.
VERDICT_STYLE = {"regression": "bold red", "improvement": "green"}

HEADLINE_WIDTH = 100


def wrap_headline(lines: list[str], width: int | None) -> list[str]:
    """On a terminal ``width`` columns wide, the headline's sentences folded at word boundaries
    to that width (at most ``HEADLINE_WIDTH``), the continuation indented; in a pipe (``width``
    None) whole lines, so that ``grep`` finds each sentence."""
    if width is None:
        return lines
    out = []
    for line in lines:
        out.extend(textwrap.wrap(line, min(width, HEADLINE_WIDTH), subsequent_indent="  ", break_long_words=False,
                                 break_on_hyphens=False) or [""])
    return out


COUNTER_HEADERS = ("module", "phase", "step kind", "counter", "base", "cand", "change")


def counter_rows(doc: dict[str, Any]) -> list[list[Any]]:
    """The counters that changed: a module's own count, exactly (``≥``: a lower bound)."""
    rows = []
    for c in doc.get("counters") or ():
        bound = "≥" if c["lower_bound"] and c["counter"] == "flops" else ""
        change = f"{c['cand'] / c['base']:.2f}x" if c["base"] else "new"
        rows.append([c["fqn"], c["phase"], c["kind"] or "", c["counter"], f"{bound}{c['base']:,}",
                     f"{bound}{c['cand']:,}", change])
    return rows


class DiffTableRenderer(DiffRenderer):
    """Terminal output: a headline, then one table per kind of finding; under the regressions and
    improvements, the checks that blamed each module; with ``explain``, every check of those
    modules."""

    name = "table"

    def render(self, model: DiffView) -> str:
        doc, show_all = model.doc, model.show_all
        table = TableRenderer(terminal=self.terminal)
        out = ["\n".join(wrap_headline(headline(doc), self.terminal.width)) + "\n"]
        for verdict, metric, title in SECTIONS:
            if verdict == "unchanged" and not show_all:
                continue
            rows = timing_rows(doc, verdict, metric)
            if rows:
                styles = [VERDICT_STYLE.get(verdict)] * len(rows)
                out.append(f"\n{title}\n" + table.render(Table(TIMING_HEADERS, rows, row_styles=styles,
                                                                 droppable=TIMING_DROPS)))
                if verdict in BLAMED:
                    lines = [module_checks_line(r) for r in doc["timing"] if r["verdict"] == verdict]
                    out.append("checks: " + "\n".join(wrap_headline(lines, self.terminal.width)) + "\n"
                               if len(lines) == 1 else
                               "checks:\n" + "\n".join(wrap_headline(["  " + x for x in lines], self.terminal.width)) + "\n")
        if doc["structure"]:
            rows = [[s["kind"], s["fqn"] or "", s["phase"] or "", structure_detail(s)] for s in doc["structure"]]
            out.append("\nStructure\n" + table.render(Table(("change", "module", "phase", "detail"), rows)))
        if doc.get("counters"):
            out.append("\nWork counters (exact, self)\n" + table.render(Table(COUNTER_HEADERS, counter_rows(doc))))
        if doc.get("calls_per_step"):
            out.append(f"\n{CALLS_TITLE}\n" + table.render(Table(CALLS_HEADERS, calls_rows(doc))))
        if doc["order"] is not None:
            out.append(f"\n{order_title(doc)}\n" + "\n".join(order_lines(doc)) + "\n")
        for fqn in model.explain:
            out.append("\n" + "\n".join(explain_lines(doc, fqn)) + "\n")
        if not any(doc["summary"].get(k) for k in ("regressions", "improvements", "structure_changes", "counter_changes")) \
                and doc["step"]["verdict"] not in ("regression", "improvement"):
            out.append("\nno changes found\n")
        return "".join(out)


BLAMED = ("regression", "improvement")


def explain_lines(doc: dict[str, Any], fqn: str) -> list[str]:
    """Every check of module ``fqn`` in each phase compared, blamed or not (``--explain``)."""
    rows = [r for r in doc["timing"] if r["fqn"] == fqn]
    if not rows:
        return [f"{fqn}: not compared (not called in both runs, or no such module)"]
    out = []
    for r in rows:
        out.append(f"{fqn} {r['phase']}: {r['verdict']}")
        out.append("  self time: " + ", ".join(fmt_check(c, mark=True) for c in r["checks"]))
        out.append("  inclusive time: " + ", ".join(fmt_check(c, mark=True) for c in r["inclusive_checks"]))
    return out


def structure_detail(s: dict[str, Any]) -> str:
    """A structure finding's message without the module and phase its own columns show."""
    message = str(s["message"])
    for prefix in (f"{s['fqn']} {s['phase']}: ", f"{s['fqn']} ({s['phase']}): ", f"{s['fqn']}: ", f"{s['fqn']} "):
        if s["fqn"] and message.startswith(prefix):
            return message[len(prefix):]
    return message


def verdict_line(doc: dict[str, Any]) -> str:
    """The verdict in one line, what a pull request's reader sees first: pass or fail (per
    ``--fail-on``), the regressions, then the structure changes, then the candidate against what."""
    s = doc["summary"]
    mark = "❌" if s["failed"] else "✅"
    counts = [_count(s["regressions"], "regression") if s["regressions"] else "no regression",
              _count(s["structure_changes"], "structure change") if s["structure_changes"] else "no structure change"]
    if doc["step"]["verdict"] == "regression":  # judged against a history: the whole step is blamed
        step = f"step-wide regression ({_MEASURES[doc['step']['measure']]} {fmt_ratio(doc['step']['ratio'])})"
        counts[0] = step if not s["regressions"] else f"{step}, {counts[0]}"
    worst = [r for r in doc["timing"] if r["verdict"] == "regression"][:1]
    blamed = ""
    if worst:
        r = worst[0]
        more = s["regressions"] - 1
        blamed = (f" ({r['fqn']} {r['phase']} {fmt_ratio(r['self']['ratio'])}"
                  + (f", and {more} more" if more else "") + ")")
    return f"## {mark} modtrace diff: {counts[0]}{blamed}, {counts[1]}: {doc['cand']['run']} against {baseline_name(doc)}"


def base_history(doc: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The base runs of a history (two or more, newest first); None for one base run."""
    history = doc["base"].get("history")
    return history if history and len(history) > 1 else None


def baseline_name(doc: dict[str, Any]) -> str:
    """What the candidate was judged against, in a few words: the base run, or a history of runs."""
    history = base_history(doc)
    if history:
        chosen = f" ({doc['base']['selector']})" if doc["base"].get("selector") else ""
        return f"a history of {_count(len(history), 'run')}{chosen}"
    return f"the base run {doc['base']['run']}"


def baseline_lines(doc: dict[str, Any]) -> list[str]:
    """The baseline the verdict used: the base run, or each run of the history."""
    history = base_history(doc)
    if history:
        return [f"baseline: {baseline_name(doc)}, newest first: "
                + ", ".join(f"{h['run']!r} (run {h['run_id']})" for h in history)]
    return [f"baseline: the base run {doc['base']['run']!r} (run {doc['base']['run_id']}): one run, so a change of the "
            "whole step cannot be told from machine load"]


class DiffMarkdownRenderer(DiffRenderer):
    """A pull-request comment, verdict first: the verdict line, the regressions, the structure
    changes (the call-order excerpt in a diff block), then what was compared and the baseline
    used, and last the context (improvements, inherited, unchanged with ``show_all``)."""

    name = "markdown"

    def render(self, model: DiffView) -> str:
        doc, show_all = model.doc, model.show_all
        md = MarkdownRenderer()
        out = [verdict_line(doc) + "\n"]
        regressions = timing_rows(doc, "regression", "self")
        if regressions:
            out.append("\n" + md.render(Table(TIMING_HEADERS, regressions, SECTIONS[0][2])))
            out.append("\nWhy each was blamed (docs/diff.md):\n\n" + "".join(
                f"- {module_checks_line(r)}\n" for r in doc["timing"] if r["verdict"] == "regression"))
        if doc["structure"]:
            rows = [[*r, structure_detail(x)] for r, x in zip(structure_rows(doc), doc["structure"], strict=True)]
            out.append("\n" + md.render(Table(("change", "module", "phase", "base", "cand", "detail"), rows, "Structure")))
        if doc.get("counters"):
            out.append("\n" + md.render(Table(COUNTER_HEADERS, counter_rows(doc), "Work counters (exact, self)")))
        if doc.get("calls_per_step"):
            out.append("\n" + md.render(Table(CALLS_HEADERS, calls_rows(doc), CALLS_TITLE)))
        if doc["order"] is not None:
            out.append(f"\n### {order_title(doc)}\n\n```diff\n")
            for r in doc["order"]["excerpt"]:
                if r["op"] in ("=", "~", "-") and r["base"] is not None:
                    out.append(f"{' ' if r['op'] == '=' else '-'} {r['base']}\n")
                if r["op"] in ("~", "+") and r["cand"] is not None:
                    out.append(f"+ {r['cand']}\n")
                if r["op"] == "…":
                    out.append(f"  … {r['base']}\n")
            out.append("```\n")
        out.append("\n### What was compared\n\n")
        out.append("\n".join(f"- {line}" for line in headline(doc) + baseline_lines(doc)) + "\n")
        for verdict, metric, title in SECTIONS[1:]:
            if verdict == "unchanged" and not show_all:
                continue
            rows = timing_rows(doc, verdict, metric)
            if rows:
                out.append("\n" + md.render(Table(TIMING_HEADERS, rows, title)))
                if verdict in BLAMED:
                    out.append("\n" + "".join(f"- {module_checks_line(r)}\n" for r in doc["timing"]
                                               if r["verdict"] == verdict))
        for fqn in model.explain:
            out.append(f"\n### Checks of {fqn}\n\n" + "".join(f"- {line.strip()}\n" for line in explain_lines(doc, fqn)))
        return "".join(out)


class DiffJsonRenderer(DiffRenderer):
    name = "json"

    def render(self, model: DiffView) -> str:
        return json.dumps(model.doc, indent=2, ensure_ascii=False) + "\n"


CSV_COLUMNS: tuple[str, ...] = (
    "kind", "fqn", "phase", "impact_us", "impact_pct", "self_base_us", "self_cand_us", "self_delta_us",
    "self_ratio", "self_ci_low_us", "self_ci_high_us", "self_p_value", "self_p_adjusted", "incl_base_us",
    "incl_cand_us", "incl_delta_us", "incl_ratio", "incl_p_value", "incl_p_adjusted", "calls_base", "calls_cand",
    "base", "cand", "message",
    "self_share_base_pct", "self_share_cand_pct", "self_vs_rest_ratio", "self_share_p_adjusted",
    "incl_share_base_pct", "incl_share_cand_pct", "incl_vs_rest_ratio", "incl_share_p_adjusted",
)


class DiffCsvRenderer(DiffRenderer):
    """One row per compared (module, phase) (kind = its verdict) and per structure change (kind = the change)."""

    name = "csv"

    def render(self, model: DiffView) -> str:
        doc = model.doc
        rows: list[Sequence[Any]] = []
        for r in doc["timing"]:
            st, inc = r["self"], r["inclusive"]
            rows.append([
                r["verdict"], r["fqn"], r["phase"], r["impact_us"], r["impact_pct"],
                st["base_us"], st["cand_us"], st["delta_us"], st["ratio"], st["ci_low_us"], st["ci_high_us"],
                st["p_value"], st["p_adjusted"], inc["base_us"], inc["cand_us"], inc["delta_us"], inc["ratio"],
                inc["p_value"], inc["p_adjusted"],
                r["calls_base"], r["calls_cand"], None, None, None,
                *(x[k] for x in (r["self_share"], r["inclusive_share"])
                  for k in ("base_pct", "cand_pct", "vs_rest_ratio", "p_adjusted")),
            ])
        for s in doc["structure"]:
            rows.append([s["kind"], s["fqn"], s["phase"], *([None] * 18), s["base"], s["cand"], s["message"],
                         *([None] * 8)])
        for c in doc.get("counters") or ():
            rows.append(["counters_changed", c["fqn"], c["phase"], *([None] * 18), c["base"], c["cand"],
                         f"{c['counter']} of step kind {c['kind']}", *([None] * 8)])
        return CsvRenderer().render(Table(CSV_COLUMNS, rows))
