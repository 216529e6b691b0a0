"""Renderers of ``modtrace diff``: one document, four formats.

``document`` turns a ``DiffResult`` into the JSON document below (plain
values, times in microseconds).  Its keys are stable: new keys may be added,
existing ones are not renamed or removed without bumping ``format``.

    format        "modtrace.diff/1"
    base, cand    {run, run_id, db, rank (null: all ranks), steps (compared
                  (rank, step) samples), step_us (median time in root spans
                  per step)}
    options       {threshold_pct, min_delta_us, alpha, skip_steps, phases
                  (null: all), fail_on, absolute (true: shares of the step
                  were not required to move)}
    summary       {compared, regressions, improvements, inherited,
                  structure_changes, step_ratio (cand/base median step
                  time), step_p_value (Mann-Whitney over the step times),
                  step_changed (step time changed significantly by more
                  than the threshold), min_p_value (smallest p the test can
                  reach with these step counts), failed (bool, per
                  fail_on), exit_code}
    timing        [{fqn, phase, verdict (regression | improvement |
                  inherited | unchanged), impact_us (change of median self
                  time per step), impact_pct (of the base step time),
                  steps_base, steps_cand, calls_base, calls_cand (median
                  calls per step), self: STATS, inclusive: STATS,
                  self_share: SHARE, inclusive_share: SHARE}], sorted
                  regressions first by impact, then improvements,
                  inherited, unchanged
                  STATS = {base_us, cand_us (median per step), delta_us,
                  ratio (null when base is 0), ci_low_us, ci_high_us
                  (interval of delta_us at 1 - alpha), p_value (Mann-Whitney
                  U, two-sided), p_adjusted (Holm over every compared
                  module and phase; the verdict uses this one)}
                  SHARE = the module's time as a share of its step's time
                  (time in root spans), per step: {base_pct, cand_pct
                  (median, percent of the step), delta_pct (percentage
                  points), ratio (cand/base share; null when base is 0),
                  vs_rest_ratio (cand/base of share / (1 - share): how much
                  the module slowed relative to the rest of the step; 1
                  when everything slowed alike), vs_typical_ratio
                  (vs_rest_ratio over the median vs_rest_ratio of all the
                  modules compared), noise_p_adjusted (how likely so large
                  a vs_typical_ratio is as run-to-run noise, from the spread
                  of all the modules' ratios, Laplace, Holm), ci_low_pct,
                  ci_high_pct, p_value, p_adjusted}.  Unless
                  options.absolute, a regression (improvement) also needs
                  the self share's p_adjusted < alpha, vs_typical_ratio above
                  1 + threshold (below 1 - threshold) and noise_p_adjusted <
                  alpha; inherited, the same of the inclusive share (or a
                  descendant that is a regression or improvement).
    structure     [{kind, fqn, phase, base, cand, message}]; kind is one of
                  module_removed, module_added, phase_removed, phase_added,
                  calls_changed, device_changed, stream_changed,
                  order_changed
    order         null, or {rank_base, rank_cand, step_base, step_cand,
                  position (1-based call of the step where the sequences
                  first differ), excerpt: [{op ("=" same, "-" base only,
                  "+" candidate only, "~" differs), base_pos, cand_pos,
                  base, cand}]}

The table, markdown and csv renderers read only this document.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from modtrace.renderers import MarkdownRenderer, TableRenderer
from modtrace.renderers.steps import step_lines

if TYPE_CHECKING:
    from modtrace.analysis.diff import DiffOptions, DiffResult

FORMAT = "modtrace.diff/1"
_STATS = ("base", "cand", "delta", "ratio", "ci_low", "ci_high", "p_value")


def _us(ns: float | None) -> float | None:
    return None if ns is None else round(float(ns) / 1000.0, 3)


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else float(f"{float(value):.{digits}g}")


def _stats(row: dict[str, Any], metric: str) -> dict[str, Any]:
    return {
        "base_us": _us(row[f"{metric}_base_ns"]),
        "cand_us": _us(row[f"{metric}_cand_ns"]),
        "delta_us": _us(row[f"{metric}_delta_ns"]),
        "ratio": _round(row[f"{metric}_ratio"], 6),
        "ci_low_us": _us(row[f"{metric}_ci_low_ns"]),
        "ci_high_us": _us(row[f"{metric}_ci_high_ns"]),
        "p_value": _round(row[f"{metric}_p_value"]),
        "p_adjusted": _round(row[f"{metric}_p_adjusted"]),
    }


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else round(float(fraction) * 100, 4)


def _share(row: dict[str, Any], metric: str) -> dict[str, Any]:
    m = f"{metric}_share"
    return {
        "base_pct": _pct(row[f"{m}_base"]),
        "cand_pct": _pct(row[f"{m}_cand"]),
        "delta_pct": _pct(row[f"{m}_delta"]),
        "ratio": _round(row[f"{m}_ratio"], 6),
        "vs_rest_ratio": _round(row[f"{metric}_vs_rest"], 6),
        "vs_typical_ratio": _round(row[f"{metric}_vs_typical"], 6),
        "noise_p_adjusted": _round(row[f"{metric}_noise_p_adjusted"]),
        "ci_low_pct": _pct(row[f"{m}_ci_low"]),
        "ci_high_pct": _pct(row[f"{m}_ci_high"]),
        "p_value": _round(row[f"{m}_p_value"]),
        "p_adjusted": _round(row[f"{m}_p_adjusted"]),
    }


def failed(summary: dict[str, Any], fail_on: str) -> bool:
    regress = int(summary["regressions"]) > 0
    structure = int(summary["structure_changes"]) > 0
    return {"regression": regress, "structure": structure, "any": regress or structure}.get(fail_on, False)


def document(
    result: DiffResult,
    base: dict[str, Any],
    cand: dict[str, Any],
    options: DiffOptions,
    fail_on: str,
) -> dict[str, Any]:
    """The JSON document of a diff (see the module docstring for its keys)."""
    s = result.summary
    summary = {
        "compared": s["compared"],
        "regressions": s["regressions"],
        "improvements": s["improvements"],
        "inherited": s["inherited"],
        "structure_changes": s["structure_changes"],
        "step_ratio": _round(s["step_ratio"], 6),  # type: ignore[arg-type]
        "step_p_value": _round(s["step_p_value"]),  # type: ignore[arg-type]
        "step_changed": s["step_changed"],
        "min_p_value": _round(s["min_p_value"]),  # type: ignore[arg-type]
    }
    is_failed = failed(summary, fail_on)
    summary["failed"] = is_failed
    summary["exit_code"] = 1 if is_failed else 0
    timing = [
        {
            "fqn": r["fqn"],
            "phase": r["phase"],
            "verdict": r["verdict"],
            "impact_us": _us(r["impact_ns"]),
            "impact_pct": _round(r["impact_pct"]),
            "steps_base": r["n_base"],
            "steps_cand": r["n_cand"],
            "calls_base": r["calls_base"],
            "calls_cand": r["calls_cand"],
            "self": _stats(r, "self"),
            "inclusive": _stats(r, "incl"),
            "self_share": _share(r, "self"),
            "inclusive_share": _share(r, "incl"),
        }
        for r in result.timing.iter_rows(named=True)
    ]
    order = None
    if result.divergence is not None:
        d = result.divergence
        order = {
            "rank_base": d.rank_base,
            "rank_cand": d.rank_cand,
            "step_base": d.step_base,
            "step_cand": d.step_cand,
            "position": d.position,
            "excerpt": d.excerpt.to_dicts(),
        }
    return {
        "format": FORMAT,
        "base": {**base, "steps": s["base_steps"], "step_us": _us(s["base_step_ns"])},  # type: ignore[arg-type]
        "cand": {**cand, "steps": s["cand_steps"], "step_us": _us(s["cand_step_ns"])},  # type: ignore[arg-type]
        "options": {
            "threshold_pct": round(options.threshold * 100, 6),
            "min_delta_us": round(options.min_delta_ns / 1000, 6),
            "alpha": options.alpha,
            "skip_steps": options.skip_steps,
            "phases": list(options.phases) if options.phases is not None else None,
            "fail_on": fail_on,
            "absolute": options.absolute,
        },
        "summary": summary,
        "timing": timing,
        "structure": result.structure.to_dicts(),
        "order": order,
    }


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
    return f"{info['run']!r} (run {info['run_id']}{rank}, {info['steps']} steps, median step {fmt_time(info['step_us'])})"


def headline(doc: dict[str, Any]) -> list[str]:
    s, o = doc["summary"], doc["options"]
    ratio = s["step_ratio"]
    share = "" if o.get("absolute") else (
        f" and, as a share of the step, > {o['threshold_pct']:g}% beyond the typical module and its noise"
    )
    lines = [
        f"base {_side(doc, 'base')}",
        f"cand {_side(doc, 'cand')}" + ("" if ratio is None else f": step time {fmt_ratio(ratio)}"),
        (
            f"{_count(s['regressions'], 'regression')}, {_count(s['improvements'], 'improvement')}, "
            f"{_count(s['structure_changes'], 'structure change')} "
            f"({s['compared']} module/phase pairs compared; blame on self time: > {o['threshold_pct']:g}% "
            f"and > {o['min_delta_us']:g} us per step{share}, Mann-Whitney p < {o['alpha']:g} after Holm; "
            f"first {o['skip_steps']} step(s) skipped)"
        ),
    ]
    lines.extend(step_lines(doc["base"], doc["cand"]))
    if s.get("step_changed") and not o.get("absolute") and not s["regressions"] and not s["improvements"]:
        lines.append(
            f"note: the step time changed ({fmt_ratio(ratio)}) but no module's share of the step did: "
            "everything slowed or sped up alike (machine load?); --absolute judges absolute times only"
        )
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


class DiffRenderer:
    name: ClassVar[str]

    def render(self, doc: dict[str, Any], *, show_all: bool = False) -> str:
        raise NotImplementedError


class DiffTableRenderer(DiffRenderer):
    """Terminal output: a headline, then one table per kind of finding."""

    name = "table"

    def render(self, doc: dict[str, Any], *, show_all: bool = False) -> str:
        table = TableRenderer()
        out = ["\n".join(headline(doc)) + "\n"]
        for verdict, metric, title in SECTIONS:
            if verdict == "unchanged" and not show_all:
                continue
            rows = timing_rows(doc, verdict, metric)
            if rows:
                out.append(f"\n{title}\n" + table.render(TIMING_HEADERS, rows))
        if doc["structure"]:
            rows = [[s["kind"], s["fqn"] or "", s["phase"] or "", s["message"]] for s in doc["structure"]]
            out.append("\nStructure\n" + table.render(("change", "module", "phase", "detail"), rows))
        if doc["order"] is not None:
            out.append(f"\n{order_title(doc)}\n" + "\n".join(order_lines(doc)) + "\n")
        if not any(doc["summary"][k] for k in ("regressions", "improvements", "structure_changes")):
            out.append("\nno changes found\n")
        return "".join(out)


class DiffMarkdownRenderer(DiffRenderer):
    """A pull-request comment: summary, tables, the call-order excerpt in a diff block."""

    name = "markdown"

    def render(self, doc: dict[str, Any], *, show_all: bool = False) -> str:
        md = MarkdownRenderer()
        s = doc["summary"]
        status = "❌" if s["failed"] else "✅"
        out = [f"## {status} modtrace diff: {doc['base']['run']} → {doc['cand']['run']}\n\n"]
        out.append("\n".join(f"- {line}" for line in headline(doc)) + "\n")
        for verdict, metric, title in SECTIONS:
            if verdict == "unchanged" and not show_all:
                continue
            rows = timing_rows(doc, verdict, metric)
            if rows:
                out.append("\n" + md.render(TIMING_HEADERS, rows, title=title))
        if doc["structure"]:
            out.append("\n" + md.render(("change", "module", "phase", "base", "cand", "detail"),
                                        [[*r, x["message"]] for r, x in zip(structure_rows(doc), doc["structure"], strict=True)],
                                        title="Structure"))
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
        return "".join(out)


class DiffJsonRenderer(DiffRenderer):
    name = "json"

    def render(self, doc: dict[str, Any], *, show_all: bool = False) -> str:
        return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


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

    def render(self, doc: dict[str, Any], *, show_all: bool = False) -> str:
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
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for row in rows:
            writer.writerow(["" if v is None else v for v in row])
        return buf.getvalue()


DIFF_RENDERERS: dict[str, type[DiffRenderer]] = {
    r.name: r for r in (DiffTableRenderer, DiffJsonRenderer, DiffCsvRenderer, DiffMarkdownRenderer)
}


def get_diff_renderer(name: str) -> DiffRenderer:
    return DIFF_RENDERERS[name]()
