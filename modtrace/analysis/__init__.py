"""Offline analysis: pure functions from polars frames to polars frames.

The data flow, one module per step::

    events.normalize_events   event frame -> ordered rows with their stack
    spans.pair_events         ordered rows -> enter/exit pairs + structural issues
    spans.build_spans         pairs -> spans frame
    nesting.collect_issues    rows + pairs -> nesting issues frame
    aggregate.*               spans -> per-step samples, module tree

    stream.analyze_rounds     event chunks -> spans and issues, round by round
    diff.diff_history         base runs' and a candidate's calls -> what changed

Nothing here prints, plots, opens a database or imports ``modtrace.store``:
``modtrace.results.materialize`` reads the frames from the store and writes the
results back, and ``modtrace.api`` is the public way in.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from modtrace.analysis.events import normalize_events
from modtrace.analysis.nesting import ISSUE_FRAME_COLUMNS, collect_issues
from modtrace.analysis.spans import SPAN_COLUMNS, build_spans, pair_events, rebuild_spans
from modtrace.analysis.validate import validate

__all__ = [
    "ISSUE_FRAME_COLUMNS",
    "SPAN_COLUMNS",
    "Analysis",
    "analyze_events",
    "check_nesting",
    "rebuild_spans",
]


@dataclass(frozen=True)
class Analysis:
    spans: pl.DataFrame
    issues: pl.DataFrame


def analyze_events(
    events: pl.DataFrame, modules: pl.DataFrame, devices: pl.DataFrame, *, complete: bool = True
) -> Analysis:
    """Event, module and device frames -> spans and nesting issues, sharing one pairing."""
    events, invalid = validate(events, modules)
    ev = normalize_events(events, modules)
    pairing = pair_events(ev)
    issues = _with(invalid, collect_issues(ev, pairing, modules, complete=complete))
    del ev  # the spans need only the pairs: free the normalised rows first
    return Analysis(spans=build_spans(pairing.pairs, modules, devices, pairing.child_ns), issues=issues)


def check_nesting(events: pl.DataFrame, modules: pl.DataFrame, *, complete: bool = True) -> pl.DataFrame:
    """Event and module frames -> nesting issues frame."""
    events, invalid = validate(events, modules)
    ev = normalize_events(events, modules)
    return _with(invalid, collect_issues(ev, pair_events(ev), modules, complete=complete))


def _with(invalid: pl.DataFrame, issues: pl.DataFrame) -> pl.DataFrame:
    if not invalid.height:
        return issues
    return pl.concat([invalid, issues]).sort("rank", "seq", "kind")

