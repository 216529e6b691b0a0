"""Diff: the calls of base runs and a candidate -> what changed, and which module to blame.

Pure functions of frames; the API reads the runs from the store and a renderer shows the
result.  The stages, one module each, in the order a diff runs them: ``frames`` (the contracts,
options and typed result), ``samples`` (compared steps and per-step samples), ``stats``,
``speed`` (step times at a common machine speed), ``verdicts`` (the modules' checks), ``step``
(the step's), ``structure`` and ``order``; ``run`` puts them together (``diff_history``; one base
run is a history of one).  The rule is stated once, in docs/diff.md ("The rule").
"""

from __future__ import annotations

from modtrace.analysis.diff.frames import (
    CALL_SCHEMA,
    STRUCTURE_SCHEMA,
    Check,
    DiffOptions,
    DiffResult,
    DiffSummary,
    ModuleVerdict,
    RunCalls,
    StepVerdict,
)
from modtrace.analysis.diff.run import diff_history, diff_spans
from modtrace.analysis.diff.samples import calls_of_spans

__all__ = [
    "CALL_SCHEMA", "STRUCTURE_SCHEMA", "Check", "DiffOptions", "DiffResult", "DiffSummary", "ModuleVerdict", "RunCalls",
    "StepVerdict", "calls_of_spans", "diff_history", "diff_spans",
]
