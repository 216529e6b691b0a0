"""A self-contained HTML report of a run: flame chart, per-step times, issues, diff.

``report_data`` turns a run's frames into a plain JSON-able dict (the
report's model); ``HtmlReportRenderer`` pours it into the template under
``assets/`` with the stylesheet and script inlined, so the file needs no
network to view -- it references no URL at all.  The page draws itself from
the embedded JSON (``<script type="application/json" id="modtrace-data">``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from importlib import resources
from typing import Any

import polars as pl

from modtrace.core import contracts
from modtrace.core.contracts import PHASES, is_attributed, source_of
from modtrace.core.errors import UsageError
from modtrace.renderers.base import Progress, Renderer
from modtrace.renderers.diff import base_history, headline
from modtrace.renderers.notes import compiled_note
from modtrace.renderers.tree import SOURCE_MARKS

# The flame chart's span statuses: the stored ones, and a span never exited.
STATUSES: tuple[str, ...] = (*contracts.STATUSES, "unclosed")
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}

# Caps that keep a report of a huge run small enough for a browser.
FLAME_SPAN_BUDGET = 60_000  # spans embedded for the flame chart, over all embedded steps
ISSUE_ROWS = 500
TIMING_ROWS = 300
TOP_MODULES = 30


def flame_depths(starts: Iterable[int], ends: Iterable[int], keys: Iterable[Any]) -> list[int]:
    """Row of each interval in a flame chart: how many earlier intervals of its key are still open.

    Intervals come sorted by (key, start, end descending); an interval that
    crosses an open one (never the case in a healthy record) is drawn below it.
    """
    out: list[int] = []
    stack: list[int] = []
    current: Any = object()
    for start, end, key in zip(starts, ends, keys, strict=True):
        if key != current:
            current, stack = key, []
        while stack and stack[-1] <= start:
            stack.pop()
        out.append(len(stack))
        stack.append(end)
    return out


def _clean(value: Any) -> Any:
    """JSON-safe scalars: NaN and infinities become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def _rows(frame: pl.DataFrame) -> list[dict[str, Any]]:
    return [{k: _clean(v) for k, v in row.items()} for row in frame.iter_rows(named=True)]


def default_step(steps: pl.DataFrame) -> int | None:
    """The step of median wall time among those with forward and backward (else among all)."""
    if steps.height == 0:
        return None
    full = steps.filter((pl.col("forward_ns") > 0) & (pl.col("backward_ns") > 0))
    pool = full if full.height else steps
    ordered = pool.sort("wall_ns", "step")
    return int(ordered["step"][(ordered.height - 1) // 2])


def flame_steps(spans: pl.DataFrame, rank: int, first: int, budget: int = FLAME_SPAN_BUDGET) -> dict[str, Any]:
    """Flame-chart data for ``first`` and the steps nearest it on ``rank``, within ``budget`` spans."""
    sp = spans.filter(pl.col("rank") == rank)
    counts = sp.group_by("step").agg(pl.len().alias("n")).with_columns(
        (pl.col("step") - first).abs().alias("_dist")
    ).sort("_dist", "step")
    chosen: list[int] = []
    used = 0
    for step, n, _ in counts.iter_rows():
        if chosen and used + n > budget:
            break
        chosen.append(int(step))
        used += n
    sp = sp.filter(pl.col("step").is_in(chosen))
    end = pl.col("end_ns").fill_null(pl.max_horizontal(pl.col("end_ns").max(), pl.col("start_ns").max()).over("step"))
    sp = sp.with_columns(
        end.alias("_end"),
        pl.when(pl.col("phase").cast(pl.String) == "forward").then(0).otherwise(1).alias("_band"),
        pl.col("fqn").cast(pl.String),
        pl.col("status").cast(pl.String).fill_null("unclosed"),
    ).sort("step", "thread_id", "_band", "start_ns", "_end", "depth", descending=[False, False, False, False, True, False])
    rows = flame_depths(
        sp["start_ns"].to_list(), sp["_end"].to_list(), sp.select("step", "thread_id", "_band").iter_rows()
    )
    sp = sp.with_columns(pl.Series("_row", rows, dtype=pl.Int32))
    names = sorted(set(sp["fqn"].drop_nulls().to_list()))
    index = {n: i for i, n in enumerate(names)}
    phase_ix = {p: i for i, p in enumerate(PHASES)}
    status_ix = {s: i for i, s in enumerate(STATUSES)}
    out: list[tuple[int, dict[str, Any]]] = []
    for (step,), part in sp.group_by("step", maintain_order=True):
        t0 = int(part["start_ns"].min())  # type: ignore[arg-type]
        t1 = int(part["_end"].max())  # type: ignore[arg-type]
        items = [
            [s - t0, e - s, row, band, th, index.get(f, -1), phase_ix.get(str(p), 0), status_ix.get(st, 0),
             selfns, call]
            for s, e, row, band, th, f, p, st, selfns, call in part.select(
                "start_ns", "_end", "_row", "_band", "thread_id", "fqn", pl.col("phase").cast(pl.String), "status",
                "self_ns", "call_id",
            ).iter_rows()
        ]
        out.append((int(step), {"step": int(step), "duration_ns": t1 - t0, "spans": items}))
    out.sort(key=lambda s: s[0])
    return {"names": names, "steps": [s for _, s in out]}


def top_modules(spans: pl.DataFrame, rank: int, limit: int = TOP_MODULES, peak_tflops: float | None = None) -> list[dict[str, Any]]:
    """(fqn, phase) of ``rank`` by total self time, with ``modtrace tree``'s numbers under its JSON keys
    (source too: hooks, kernels or mixed).

    calls and the totals sum every step; ``self_median_ns`` / ``inclusive_median_ns`` (the report's
    and the tree's "self/step" and "incl/step") are the median, over the steps the module ran in, of
    its time summed over its calls in the step.  With the spans' work counters (``Database.spans``)
    each row has the tree's work keys (``core.work.WORK_KEYS``), per module and phase, and with
    their memory columns the tree's ``core.memory_nodes.MEMORY_KEYS``.
    """
    from modtrace.core.work import derived

    sp = spans.filter((pl.col("rank") == rank) & pl.col("duration_ns").is_not_null())
    keys = (pl.col("fqn").cast(pl.String), pl.col("module_type").cast(pl.String), pl.col("phase").cast(pl.String))
    counted = "flops" in sp.columns
    work = [
        pl.when(pl.col("flops").is_not_null().any()).then(pl.col(c).sum()).alias(f"_{c}")
        for c in ("flops", "bytes", "unknown_ops")
    ] if counted else []
    # Memory as the tree has it (core.memory_nodes): kept summed per step, its median; the largest peak.
    held = "kept_mem_bytes" in sp.columns
    if held:
        work += [pl.when(pl.col("kept_mem_bytes").is_not_null().any()).then(pl.col("kept_mem_bytes").sum())
                 .alias("_kept"), pl.col("peak_mem_bytes").max().alias("_peak_mem")]
    per_step = sp.group_by(*keys, "step").agg(
        pl.len().alias("calls"),
        pl.col("self_ns").sum().alias("_self"),
        pl.col("duration_ns").sum().alias("_incl"),
        is_attributed().sum().alias("_attributed"),
        *work,
    )
    work_out = [
        pl.col("_flops").count().alias("counted_steps"),
        *(pl.col(f"_{c}").median().alias(f"{c}_per_step") for c in ("flops", "bytes", "unknown_ops")),
    ] if counted else []
    if held:
        work_out += [pl.col("_kept").median().alias("kept_mem_per_step"),
                     pl.col("_peak_mem").max().alias("peak_mem_bytes")]
    table = (
        per_step.group_by("fqn", "module_type", "phase")
        .agg(
            pl.col("calls").sum().alias("calls"),
            pl.len().alias("steps"),
            pl.col("_self").median().alias("self_median_ns"),
            pl.col("_incl").median().alias("inclusive_median_ns"),
            pl.col("_self").sum().alias("self_total_ns"),
            pl.col("_incl").sum().alias("inclusive_total_ns"),
            source_of(pl.col("_attributed").sum(), pl.col("calls").sum()).alias("source"),
            *work_out,
        )
        .sort("self_total_ns", "fqn", "phase", descending=[True, False, False])
        .head(limit)
    )
    rows = _rows(table)
    for row in rows:
        steps = row.pop("counted_steps", None)
        row.update(derived({**row, "counted_steps": steps} if steps else None, row["inclusive_median_ns"], peak_tflops))
    return rows


def issue_data(issues: pl.DataFrame, limit: int = ISSUE_ROWS) -> dict[str, Any]:
    iss = issues.with_columns(pl.col("phase").cast(pl.String))
    counts = (
        iss.group_by("severity", "kind").agg(pl.len().alias("n"))
        .with_columns(pl.col("severity").replace_strict(SEVERITY_ORDER, default=9, return_dtype=pl.Int8).alias("_o"))
        .sort("_o", "kind").drop("_o")
    )
    ordered = iss.with_columns(
        pl.col("severity").replace_strict(SEVERITY_ORDER, default=9, return_dtype=pl.Int8).alias("_o")
    ).sort("_o", "rank", "seq").drop("_o")
    return {
        "total": iss.height,
        "counts": _rows(counts),
        "rows": _rows(ordered.head(limit).select("rank", "seq", "severity", "kind", "fqn", "phase", "step", "thread_id", "message")),
    }


def diff_data(doc: Mapping[str, Any], limit: int = TIMING_ROWS) -> dict[str, Any]:
    """``modtrace diff``'s JSON document (``renderers.diff_document``), its timing rows capped at
    ``limit``: every changed row, then unchanged ones (the document lists them in that order)."""
    timing = list(doc["timing"])
    changed = [r for r in timing if r["verdict"] != "unchanged"]
    shown = changed if len(changed) >= limit else timing[:limit]
    return {**doc, "timing": shown}


TREND_MODULES = 12  # blamed modules charted, by impact
# A step-wide regression's chart: the median step time of each run, where a module's would be.
STEP_SERIES = {"fqn": "step time", "phase": "whole step"}


def trend_data(doc: Mapping[str, Any], limit: int = TREND_MODULES) -> dict[str, Any] | None:
    """Each blamed module's self time per step across the baseline runs and the candidate: the
    report's trend charts, one point per run, the baseline's oldest first and the candidate last.

    With one base run that is two points.  Against a history (``base.history``: its runs
    newest first, as ``renderers.diff.baseline_lines`` reads it) N + 1: each row then carries
    ``self.history_us``, the module's median self time per step in each history run, in the
    order of ``history``.  A step-wide regression (``step.verdict``) is charted first,
    as the median step time of each run (``STEP_SERIES``).  Returns None when nothing was blamed.
    """
    blamed = [r for r in doc["timing"] if r["verdict"] == "regression"][:limit]
    history = base_history(doc) or []
    step_wide = doc.get("step", {}).get("verdict") == "regression" and bool(history)
    if not blamed and not step_wide:
        return None
    baseline = list(reversed(history)) if history else [doc["base"]]
    runs = [{"run": b["run"], "run_id": b["run_id"], "role": "base"} for b in baseline]
    runs.append({"run": doc["cand"]["run"], "run_id": doc["cand"]["run_id"], "role": "cand"})
    series = []
    if step_wide:
        step_us = doc["cand"]["step_us"] - doc["base"]["step_us"] if doc["base"].get("step_us") is not None else None
        series.append({**STEP_SERIES, "impact_us": _clean(step_us),
                       "self_us": [_clean(v) for v in [*(b.get("step_us") for b in baseline), doc["cand"]["step_us"]]]})
    for r in blamed:
        before = list(reversed(r["self"]["history_us"])) if history else [r["self"]["base_us"]]
        series.append({"fqn": r["fqn"], "phase": r["phase"], "impact_us": r["impact_us"],
                       "self_us": [_clean(v) for v in [*before, r["self"]["cand_us"]]]})
    return {"runs": runs, "series": series}


_INFO_KEYS = (
    "id", "name", "status", "started_at", "ended_at", "duration_s", "command", "hostname", "world_size",
    "ranks", "steps", "events", "modules", "python_version", "torch_version", "modtrace_version", "git_commit", "tags",
    "clock",
    "compiled_modules",
)


def report_data(
    info: Mapping[str, Any],
    spans: pl.DataFrame,
    issues: pl.DataFrame,
    *,
    steps: pl.DataFrame,
    step: int | None = None,
    rank: int | None = None,
    diff: Mapping[str, Any] | None = None,
    progress: Progress | None = None,
    peak_tflops: float | None = None,
    stragglers: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The report's model: run metadata, per-step times, flame chart data, top modules, issues, diff.

    ``steps`` is ``modtrace.analysis.step_time.step_table(spans)``: step time, its phases and wall time.
    ``diff`` is the document ``modtrace diff BASE RUN --format json`` prints (``diff_document.document``),
    so the report's diff shows the same numbers under the same names.  ``peak_tflops``: the
    device's peak, for each module's ``peak_percent``.  ``stragglers``: a multi-rank run's
    ``Stragglers.to_dict()`` (``modtrace stragglers``), for its section.
    """
    from modtrace._version import __version__

    ranks = sorted(set(spans["rank"].unique().to_list())) if spans.height else []
    if rank is None:
        rank = ranks[0] if ranks else 0
    if progress is not None:
        progress(spans.height // 2)
    mine = steps.filter(pl.col("rank") == rank)
    if step is not None and step not in set(mine["step"].to_list()):
        raise UsageError(f"--step {step}: run {info.get('name')!r} has no spans in step {step} on rank {rank}")
    first = step if step is not None else default_step(mine)
    flame = flame_steps(spans, rank, first) if first is not None else {"names": [], "steps": []}
    if progress is not None:
        progress(spans.height - spans.height // 2)
    return {
        "modtrace_version": __version__,
        "run": {**{k: _clean(info.get(k)) for k in _INFO_KEYS}, "compiled_note": compiled_note(info)},
        "ranks": ranks,
        "rank": rank,
        "span_count": spans.height,
        "default_step": first,
        "steps": _rows(steps),
        "flame": flame,
        "phases": list(PHASES),
        "statuses": list(STATUSES),
        "source_marks": {source: list(mark) for source, mark in SOURCE_MARKS.items()},
        "top_modules": top_modules(spans, rank, peak_tflops=peak_tflops) if spans.height else [],
        "peak_tflops": peak_tflops,
        "issues": issue_data(issues),
        "diff": diff_data(diff) if diff is not None else None,
        "diff_headline": headline(dict(diff)) if diff is not None else None,
        "trend": trend_data(diff) if diff is not None else None,
        "stragglers": dict(stragglers) if stragglers is not None else None,
    }


def _asset(name: str) -> str:
    return resources.files("modtrace.renderers").joinpath("assets").joinpath(name).read_text(encoding="utf-8")


def embed_json(data: Any) -> str:
    """JSON safe inside a ``<script>`` element: no ``<`` can close it or open a comment."""
    text = json.dumps(data, allow_nan=False, separators=(",", ":"), default=str)
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def _html_text(value: Any) -> str:
    return str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


class HtmlReportRenderer(Renderer[Mapping[str, Any]]):
    """Renders ``report_data``'s model as one HTML document with everything inlined."""

    kind = "report"
    name = "html"

    def render(self, model: Mapping[str, Any]) -> str:
        data = model
        template = _asset("report.html")
        title = f"modtrace report: {data['run'].get('name')}"
        if data.get("diff"):
            title += f" vs {data['diff']['base'].get('run')}"
        # Placeholders are replaced in one pass each, data last: nothing inserted is scanned again.
        page = template.replace("{{TITLE}}", _html_text(title), 1)
        page = page.replace("/*{{CSS}}*/", _asset("report.css"), 1)
        page = page.replace("/*{{JS}}*/", _asset("report.js"), 1)
        head, sep, tail = page.partition("{{DATA}}")
        if not sep:  # pragma: no cover - the template ships with the placeholder
            raise RuntimeError("report template lacks its data placeholder")
        return head + embed_json(data) + tail
