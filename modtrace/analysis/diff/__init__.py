"""Diff: the calls of two runs -> what changed between them, and which module to blame.

Everything here is a pure function of frames; the CLI reads them from the
store (``modtrace.store.samples``) and hands the result to a renderer.  The
stages, one module each, in the order a diff runs them:

``frames``     the contracts: ``RunCalls`` (``CALL_SCHEMA`` and lookups), the
               (module, phase) key, ``DiffOptions``, ``Check``, ``StepVerdict``,
               ``ModuleVerdict``, ``DiffSummary``, ``DiffResult``
``samples``    a run's compared steps and per-step samples, with shares of
               the step
``stats``      Mann-Whitney U, Holm, order-statistic intervals, a Laplace
               noise null from the MAD
``speed``      step times at a common machine speed (the speed probe)
``verdicts``   per (module, phase) statistics and the rule's checks
``step``       the step verdict's measure and checks
``structure``  modules, phases, calls, devices and streams that changed
``order``      the first call-order divergence and its excerpt
``run``        ``diff_history``: all of it against one or more base runs, one
               ``DiffResult`` (``diff_runs``, ``diff_spans``: a history of one)

The rule is stated once, in docs/diff.md.

``DiffResult.exit_code(fail_on)`` is what ``modtrace diff`` exits with.
"""

from __future__ import annotations

from modtrace.analysis.diff.frames import (
    CALL_SCHEMA,
    CALLS_SCHEMA,
    CHECK_TYPE,
    EXCERPT_SCHEMA,
    FAIL_ON,
    METRICS,
    PHASES,
    PPB,
    SAMPLE_SCHEMA,
    SHARE_METRICS,
    STEP_MEASURES,
    STEP_VERDICTS,
    STRUCTURE_KINDS,
    STRUCTURE_SCHEMA,
    TIMING_COLUMNS,
    VERDICTS,
    Check,
    DiffOptions,
    DiffResult,
    DiffSummary,
    Divergence,
    ModuleVerdict,
    RunCalls,
    StepVerdict,
)
from modtrace.analysis.diff.order import call_sequences, first_divergence, order_varies
from modtrace.analysis.diff.run import diff_history, diff_runs, diff_spans
from modtrace.analysis.diff.samples import (
    calls_of_spans,
    compared_calls,
    compared_samples,
    fill_steps,
    module_keys,
    module_lookup,
    step_units,
    with_mkey,
)
from modtrace.analysis.diff.stats import (
    holm,
    mann_whitney,
    median_summary,
    min_p_value,
    normal_quantile,
    rank_sums,
    sort_within,
    two_sided_p,
)
from modtrace.analysis.diff.structure import (
    calls_per_step,
    collapse_subtrees,
    compare_structure,
    placement,
)
from modtrace.analysis.diff.verdicts import compare_timing

__all__ = [
    "CALLS_SCHEMA", "CALL_SCHEMA", "EXCERPT_SCHEMA", "FAIL_ON", "METRICS", "PHASES", "PPB", "SAMPLE_SCHEMA", "SHARE_METRICS",
    "STRUCTURE_KINDS", "STRUCTURE_SCHEMA", "TIMING_COLUMNS", "VERDICTS",
    "CHECK_TYPE", "STEP_MEASURES", "STEP_VERDICTS",
    "Check", "DiffOptions", "DiffResult", "DiffSummary", "Divergence", "ModuleVerdict", "RunCalls", "StepVerdict",
    "call_sequences", "calls_of_spans", "calls_per_step", "diff_history", "order_varies", "collapse_subtrees", "compare_structure", "compare_timing",
    "compared_calls", "compared_samples", "diff_runs", "diff_spans", "fill_steps", "first_divergence", "holm",
    "mann_whitney", "median_summary", "min_p_value", "module_keys", "module_lookup", "normal_quantile",
    "placement", "rank_sums", "sort_within", "step_units", "two_sided_p", "with_mkey",
]
