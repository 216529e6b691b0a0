"""The document of ``modtrace diff``: what its four renderers (``renderers.diff``) read.

``document`` turns a ``DiffResult`` into the JSON document (plain values, times in
microseconds); every key is documented once, in docs/diff.md ("The JSON document"), and
``tests/renderers/test_diff_document.py`` fails on a key that is not.  Keys are stable: new keys
may be added, existing ones are not renamed or removed without bumping ``format``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from modtrace.analysis.diff import Check, DiffOptions, DiffResult, StepVerdict

FORMAT = "modtrace.diff/2"


def _us(ns: float | None) -> float | None:
    return None if ns is None else round(float(ns) / 1000.0, 3)


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else float(f"{float(value):.{digits}g}")


def _pct(fraction: float | None) -> float | None:
    return None if fraction is None else round(float(fraction) * 100, 4)


def checks(values: Iterable[Check]) -> list[dict[str, Any]]:
    """Checks as the document holds them: {name, value, bar, passed}, six significant digits."""
    return [{"name": c.name, "value": _round(c.value, 6), "bar": _round(c.bar, 6), "passed": c.passed}
            for c in values]


def _row_checks(values: Sequence[dict[str, Any]] | None) -> list[dict[str, Any]]:
    return [{"name": c["name"], "value": _round(c["value"], 6), "bar": _round(c["bar"], 6),
             "passed": bool(c["passed"])} for c in values or ()]


def _stats(row: dict[str, Any], metric: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "base_us": _us(row[f"{metric}_base_ns"]),
        "cand_us": _us(row[f"{metric}_cand_ns"]),
        "delta_us": _us(row[f"{metric}_delta_ns"]),
        "ratio": _round(row[f"{metric}_ratio"], 6),
        "ci_low_us": _us(row[f"{metric}_ci_low_ns"]),
        "ci_high_us": _us(row[f"{metric}_ci_high_ns"]),
        "p_value": _round(row[f"{metric}_p_value"]),
        "p_adjusted": _round(row[f"{metric}_p_adjusted"]),
        "history_low_us": _us(row[f"{metric}_history_low_ns"]),
        "history_high_us": _us(row[f"{metric}_history_high_ns"]),
    }
    if metric == "self":
        runs = row["self_history_ns"]
        out["history_us"] = None if runs is None else [_us(v) for v in runs]
    return out


def _share(row: dict[str, Any], metric: str) -> dict[str, Any]:
    m = f"{metric}_share"
    out: dict[str, Any] = {
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
    if metric == "self":
        out["history_low_pct"] = _pct(row["self_share_history_low"])
        out["history_high_pct"] = _pct(row["self_share_history_high"])
    return out


def step_document(step: StepVerdict) -> dict[str, Any]:
    """The step verdict as the document holds it."""
    return {
        "verdict": step.verdict,
        "measure": step.measure,
        "checks": checks(step.checks),
        "ratio": _round(step.ratio, 6),
        "p_value": _round(step.p_value),
        "bounds": None if step.bounds is None else [_round(v, 6) for v in step.bounds],
        "level_low_us": _us(step.level_low_ns),
        "level_high_us": _us(step.level_high_ns),
        "spreads": {m: _round(v, 6) for m, v in step.spreads.items()},
        "confirming": step.confirming,
        "adjusted_ratio": _round(step.adjusted_ratio, 6),
        "cpu_ratio": _round(step.cpu_ratio, 6),
        "cand_speed_ratio": _round(step.cand_speed_ratio, 6),
        "speed_reference_us": _us(step.speed_reference_ns),
        "note": step.note,
    }


def options_document(options: DiffOptions, fail_on: str) -> dict[str, Any]:
    def pct(x: float) -> float:
        return round(x * 100, 6)

    return {
        "threshold_pct": pct(options.threshold),
        **{f"{role}_margin_pct": pct(options.margin(role)) for role in ("share", "median", "level", "step", "confirm")},
        "share_threshold_pct": pct(options.share_threshold),
        "level_pct": pct(options.low_quantile),
        "min_delta_us": round(options.min_delta_ns / 1000, 6),
        "alpha": options.alpha,
        "confirm_spread": options.confirm_spread,
        "min_history": options.min_history,
        "skip_steps": options.skip_steps,
        "phases": list(options.phases) if options.phases is not None else None,
        "fail_on": fail_on,
        "absolute": options.absolute,
        "skip_checks": sorted(options.skip_checks),
    }


def document(
    result: DiffResult,
    base: dict[str, Any],
    cand: dict[str, Any],
    options: DiffOptions,
    fail_on: str,
) -> dict[str, Any]:
    """The JSON document of a diff (docs/diff.md, "The JSON document")."""
    s = result.summary
    summary = {
        "compared": s.compared,
        "regressions": s.regressions,
        "improvements": s.improvements,
        "inherited": s.inherited,
        "structure_changes": s.structure_changes,
        "counter_changes": s.counter_changes,
        "step_ratio": _round(s.step_ratio, 6),
        "min_p_value": _round(s.min_p_value),
        "min_steps": s.min_steps,
        "history_runs": s.history_runs,
        "order_varies": s.order_varies,
        "failed": result.failed(fail_on),
        "exit_code": result.exit_code(fail_on),
    }
    timing = [
        {
            "fqn": r["fqn"],
            "phase": r["phase"],
            "verdict": r["verdict"],
            "checks": _row_checks(r["checks"]),
            "inclusive_checks": _row_checks(r["inclusive_checks"]),
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
        "base": {"history": None, "selector": None, **base, "steps": s.base_steps, "step_us": _us(s.base_step_ns)},
        "cand": {**cand, "steps": s.cand_steps, "step_us": _us(s.cand_step_ns)},
        "options": options_document(options, fail_on),
        "summary": summary,
        "step": step_document(result.step),
        "timing": timing,
        "structure": result.structure.to_dicts(),
        "counters": None if result.counters is None else result.counters.to_dicts(),
        "calls_per_step": [
            {"fqn": r["fqn"], "phase": r["phase"], "base": {q: r[f"base_{q}"] for q in ("min", "median", "max")},
             "cand": {q: r[f"cand_{q}"] for q in ("min", "median", "max")}, "changed": r["changed"]}
            for r in result.calls.iter_rows(named=True)
        ],
        "order": order,
    }
