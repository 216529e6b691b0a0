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
        s = doc["summary"]
        chosen = f"{info['selector']}, " if info.get("selector") else ""
        runs = ", ".join(repr(h["run"]) for h in history)
        return (f"history of {len(history)} runs ({chosen}newest first: {runs}{rank}; {info['steps']} steps; "
                f"median step time per run {fmt_time(s.get('history_step_low_us'))} to "
                f"{fmt_time(s.get('history_step_high_us'))})")
    return f"{info['run']!r} (run {info['run_id']}{rank}, {info['steps']} steps, median step time {fmt_time(info['step_us'])})"


def _ordinal(pct: float) -> str:
    n = f"{pct:g}"
    if not n.isdigit():
        return n
    suffix = "th" if 10 <= int(n) % 100 <= 20 else {"1": "st", "2": "nd", "3": "rd"}.get(n[-1], "th")
    return n + suffix


def headline(doc: dict[str, Any]) -> list[str]:
    s, o = doc["summary"], doc["options"]
    ratio = s["step_ratio"]
    history = bool(doc["base"].get("history")) and len(doc["base"]["history"]) > 1
    q = f"the {_ordinal(o['level_pct'])} percentile of self time per step"
    if o.get("absolute"):
        rule = (f"blame on {q}: > {o['threshold_pct']:g}% and > {o['min_delta_us']:g} us, "
                f"Mann-Whitney p < {o['alpha']:g} after Holm")
    else:
        base = "the base runs' median" if history else "the base's"
        shares = "every base run's" if history else "the base's"
        rule = (f"blame on {q}: > {o['min_delta_us']:g} us above {base}, its share of the step > "
                f"{o['threshold_pct']:g}% beyond {shares} and > {o['share_threshold_pct']:g}% beyond the "
                "typical module's" + ("" if history else f", its median > {o['threshold_pct']:g}% beyond the base's"))
    lines = [
        f"base {_side(doc, 'base')}",
        f"cand {_side(doc, 'cand')}" + ("" if ratio is None else f": step time {fmt_ratio(ratio)}"),
        (
            f"{_count(s['regressions'], 'regression')}, {_count(s['improvements'], 'improvement')}, "
            f"{_count(s['structure_changes'], 'structure change')} "
            f"({s['compared']} module/phase pairs compared; {rule}; "
            f"first {o['skip_steps']} step(s) skipped; {doc['base'].get('clock', 'host')} clock)"
        ),
    ]
    lines.extend(step_lines(doc["base"], doc["cand"]))
    if doc.get("counters") is not None:
        lines.append(f"{_count(s.get('counter_changes', 0), 'work counter change')} (FLOPs, bytes, ops per module "
                     "and phase on the first counted step of each kind, exact)")
    verdict = s.get("step_verdict")
    spreads = s.get("step_spreads") or {}
    if s.get("step_adjusted"):
        what = ("step times judged as the program's CPU time per step" if s.get("step_measure") == "cpu"
                else "step times judged")
        lines.append(
            f"{what} at the history's machine speed (the speed probe before each step): the candidate's "
            f"probe time {fmt_ratio(s['cand_speed_ratio'])}, its step time at the history's speed "
            f"{fmt_ratio(s['adjusted_step_ratio'])}" + _spread_note(spreads))
    elif s.get("step_measure") == "cpu_raw":
        lines.append(
            "step times judged as the program's CPU time per step, as measured: across the history's runs "
            "it held closer together than over the speed probe" + _spread_note(spreads)
            + f"; the candidate's CPU time per step {fmt_ratio(s['cpu_step_ratio'])}, its probe time "
            f"{fmt_ratio(s['cand_speed_ratio'])}, its step time at the history's speed "
            f"{fmt_ratio(s['adjusted_step_ratio'])}")
    if s.get("step_measure"):
        ratio = judged_step_ratio(s)
    if history and s.get("step_bounds") and verdict not in ("regression", "improvement") \
            and not s.get("step_unconfirmed"):
        lines.append(_bounds_line(s["step_bounds"], bool(s.get("step_measure")), o))
    if s.get("step_unconfirmed"):
        other = s["adjusted_step_ratio"] if s.get("step_measure") == "cpu_raw" else s["cpu_step_ratio"]
        lines.append(
            f"note: the step time {fmt_ratio(ratio)} lay beyond the history's range, but "
            f"{'over the probe' if s.get('step_measure') == 'cpu_raw' else 'as measured'} it moved "
            f"{fmt_ratio(other)}, within {o['threshold_pct']:g}% of the history's median: not judged a "
            "step-wide change (the machine's speed, or the probe's noise)")
    if s.get("speed_note"):
        lines.append(f"note: {s['speed_note']}")
    if verdict in ("regression", "improvement") and s.get("step_measure"):
        at = "CPU time per step" if s["step_measure"] == "cpu_raw" else "step time at the history's speed"
        lines.append(
            f"{at} {fmt_ratio(ratio)}: its median {'above' if verdict == 'regression' else 'below'} "
            f"the history's range by more than the range's own width or {o['threshold_pct']:g}%, whichever is "
            "larger: "
            f"a step-wide {verdict}"
            + ("" if s["regressions"] or s["improvements"] else " (every module's share of the step alike)")
            + _unconfirmable_note(s)
        )
    elif verdict in ("regression", "improvement"):
        lines.append(
            f"step time {fmt_ratio(ratio)}: its {_ordinal(o['level_pct'])} percentile {'above' if verdict == 'regression' else 'below'} "
            f"the history's range by the range's own width and more than {o['threshold_pct']:g}%: "
            f"a step-wide {verdict}"
            + ("" if s["regressions"] or s["improvements"] else " (every module's share of the step alike)")
        )
    elif verdict is None and s.get("step_changed") and not o.get("absolute") and not s["regressions"] \
            and not s["improvements"]:
        lines.append(
            f"note: the step time changed ({fmt_ratio(ratio)}) but no module's share of the step did: "
            "everything slowed or sped up alike, and with one base run a step-wide change cannot be told from "
            "machine load; judge it against a history of baseline runs (modtrace diff 'tag:KEY=VALUE' CAND), "
            "or --absolute judges absolute times only"
        )
    if s.get("order_varies"):
        lines.append("note: call order varies from step to step within a run (data-dependent): order not compared")
    if s["min_p_value"] is not None and s["compared"] and s["min_p_value"] * s["compared"] >= o["alpha"]:
        lines.append(
            f"warning: few steps ({doc['base']['steps']} and {doc['cand']['steps']}) for {s['compared']} "
            "comparisons: only a change seen in every step can be significant; record more steps"
        )
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


TIMING_HEADERS = (
    "module", "phase", "base", "cand", "delta", "change", "CI of delta", "p (Holm)", "share of step", "impact/step",
)


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
    """Terminal output: a headline, then one table per kind of finding."""

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
                out.append(f"\n{title}\n" + table.render(Table(TIMING_HEADERS, rows, row_styles=styles)))
        if doc["structure"]:
            rows = [[s["kind"], s["fqn"] or "", s["phase"] or "", s["message"]] for s in doc["structure"]]
            out.append("\nStructure\n" + table.render(Table(("change", "module", "phase", "detail"), rows)))
        if doc.get("counters"):
            out.append("\nWork counters (exact, self)\n" + table.render(Table(COUNTER_HEADERS, counter_rows(doc))))
        if doc.get("calls_per_step"):
            out.append(f"\n{CALLS_TITLE}\n" + table.render(Table(CALLS_HEADERS, calls_rows(doc))))
        if doc["order"] is not None:
            out.append(f"\n{order_title(doc)}\n" + "\n".join(order_lines(doc)) + "\n")
        if not any(doc["summary"].get(k) for k in ("regressions", "improvements", "structure_changes", "counter_changes")) \
                and doc["summary"].get("step_verdict") in (None, "unchanged"):
            out.append("\nno changes found\n")
        return "".join(out)


def _spread_note(spreads: dict[str, float | None]) -> str:
    """" (the history's runs spread 3.1% on CPU time, 8.0% over the probe)": what the choice of
    measure weighed (``summary.step_spreads``); "" when it weighed fewer than two."""
    names = {"cpu": "over the probe", "cpu_raw": "on CPU time"}
    parts = [f"{v * 100:.1f}% {names[m]}" for m, v in sorted(spreads.items(), key=lambda kv: kv[0] != "cpu_raw")
             if m in names and v is not None]
    return f" (the history's runs spread {', '.join(parts)})" if len(parts) > 1 else ""


def _bounds_line(bounds: list[float], median: bool, o: dict[str, Any]) -> str:
    """What the history can tell (``summary.step_bounds``): the step-wide changes beyond its noise.
    ``median``: the step verdict judged medians (a probe-based measure), else the history's
    ``level_pct`` percentiles."""
    low, high = bounds
    level = "median" if median else f"median {_ordinal(o['level_pct'])} percentile step time"
    widened = ("its own spread or " if median else "its own width and ") + f"{o['threshold_pct']:g}%"
    return (f"a step-wide change is told only beyond {fmt_ratio(high)} or {fmt_ratio(low)} of the history's {level} "
            f"(its range widened by {widened}{', whichever is larger' if median else ''}): a smaller one lies "
            "within the spread of its runs")


def _unconfirmable_note(s: dict[str, Any]) -> str:
    """"; the other CPU measure ... too wide to confirm or deny it" when a step verdict stood on the
    judged measure alone (``summary.step_confirming`` null beside two measures), else ""."""
    spreads = {m: v for m, v in (s.get("step_spreads") or {}).items() if m in ("cpu", "cpu_raw") and v is not None}
    judged = s.get("step_measure")
    if s.get("step_confirming") or not isinstance(judged, str) or judged not in spreads or len(spreads) < 2:
        return ""
    other = next(m for m in spreads if m != judged)
    names = {"cpu": "over the probe", "cpu_raw": "as measured"}
    return (f"; the CPU time {names[other]} spread {spreads[other] * 100:.1f}% across the history against "
            f"{spreads[judged] * 100:.1f}% {names[judged]}: too wide to confirm or deny it")


def judged_step_ratio(s: dict[str, Any]) -> float | None:
    """The candidate's step time over the history's on the measure the step verdict judged."""
    if s.get("step_adjusted"):
        return s.get("adjusted_step_ratio")
    if s.get("step_measure") == "cpu_raw":
        return s.get("cpu_step_ratio")
    return s.get("step_ratio")


def verdict_line(doc: dict[str, Any]) -> str:
    """The verdict in one line, what a pull request's reader sees first: pass or fail (per
    ``--fail-on``), the regressions, then the structure changes, then the candidate against what."""
    s = doc["summary"]
    mark = "❌" if s["failed"] else "✅"
    counts = [_count(s["regressions"], "regression") if s["regressions"] else "no regression",
              _count(s["structure_changes"], "structure change") if s["structure_changes"] else "no structure change"]
    if s.get("step_verdict") == "regression":  # judged against a history: the whole step is blamed
        ratio = judged_step_ratio(s)
        step = f"step-wide regression (step time {fmt_ratio(ratio)})"
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
        if doc["structure"]:
            rows = [[*r, x["message"]] for r, x in zip(structure_rows(doc), doc["structure"], strict=True)]
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
