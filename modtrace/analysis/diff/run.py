"""The whole diff: two runs' calls -> timing verdicts, structure findings, the first order divergence.

``diff_runs`` prepares each run (compared steps, filled samples, placement,
call sequence; the two runs side by side), then compares them: ``verdicts``
for timing, ``structure`` and ``order`` for the rest, and sums it up.
``diff_spans`` does the same from two spans frames.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from modtrace.analysis.diff.frames import (
    STRUCTURE_SCHEMA,
    DiffOptions,
    DiffResult,
    Divergence,
    RunCalls,
)
from modtrace.analysis.diff.order import (
    call_sequences,
    first_divergence,
    order_finding,
    order_varies,
)
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
from modtrace.analysis.diff.speed import probed_units
from modtrace.analysis.diff.stats import min_p_value, two_sample_p
from modtrace.analysis.diff.structure import calls_per_step, compare_structure, placement
from modtrace.analysis.diff.verdicts import compare_timing


@dataclass(frozen=True)
class _Side:
    units: pl.DataFrame  # rank, step, step_ns
    samples: pl.DataFrame  # filled samples with shares
    placed: pl.DataFrame  # mkey, device, stream
    sequence: pl.DataFrame  # call_sequences
    probed: pl.DataFrame | None = None  # units with probe_ns (speed.probed_units), when asked for


def _prepare(run: RunCalls, lookup: pl.DataFrame, names: pl.DataFrame, options: DiffOptions,
             probed: bool = False) -> _Side:
    """One side's compared steps, samples, placement and call sequence; with ``probed`` (a
    history's candidate, whose step verdict may use them) its units with their probes too."""
    compared = with_mkey(compared_calls(run.calls, options.skip_steps), lookup, names)
    units = step_units(compared)
    samples = fill_steps(compared_samples(compared, options.phases), units)
    return _Side(
        units=units,
        samples=samples,
        placed=placement(compared, run.devices, options.phases),
        sequence=call_sequences(compared, options.phases),
        probed=probed_units(compared, units, run.speeds) if probed else None,
    )


def diff_runs(base: RunCalls, cand: RunCalls, options: DiffOptions | None = None) -> DiffResult:
    """Two runs' calls -> timing comparison, structure findings, first order divergence, summary."""
    options = options or DiffOptions()
    lookup_b, lookup_c = module_lookup(base), module_lookup(cand)
    names = module_keys(lookup_b, lookup_c)
    b = _prepare(base, lookup_b, names, options)
    c = _prepare(cand, lookup_c, names, options)
    n_b, n_c = b.units.height, c.units.height
    step_b = _median(b.units["step_ns"])
    step_c = _median(c.units["step_ns"])
    timing = compare_timing(b.samples, c.samples, names, options, n_base=n_b, n_cand=n_c, step_ns=step_b)
    structure, divergence, calls, varies = compare_rest(b, c, names, options)
    counts = timing["verdict"].value_counts()
    by_verdict = dict(zip(counts["verdict"].to_list(), counts["count"].to_list(), strict=True))
    step_ratio = (step_c / step_b) if step_b and step_c is not None else None
    step_p = two_sample_p(b.units["step_ns"], c.units["step_ns"])
    summary: dict[str, object] = {
        "base_steps": n_b,
        "cand_steps": n_c,
        "base_step_ns": step_b,
        "cand_step_ns": step_c,
        "step_ratio": step_ratio,
        "step_p_value": step_p,
        "step_changed": bool(
            step_p is not None and step_p < options.alpha and step_ratio is not None
            and abs(step_ratio - 1) > options.threshold
        ),
        "compared": timing.height,
        "regressions": int(by_verdict.get("regression", 0)),
        "improvements": int(by_verdict.get("improvement", 0)),
        "inherited": int(by_verdict.get("inherited", 0)),
        "structure_changes": structure.height,
        "min_p_value": min_p_value(n_b, n_c),
        "order_varies": varies,
        "history_runs": 1,
        "step_verdict": None,  # judged against a history only (``history``)
    }
    return DiffResult(timing=timing, structure=structure, divergence=divergence, summary=summary, calls=calls)


def compare_rest(b: _Side, c: _Side, names: pl.DataFrame, options: DiffOptions
                 ) -> tuple[pl.DataFrame, Divergence | None, pl.DataFrame, bool]:
    """Structure findings, the first order divergence, the data-dependent calls per step, and
    whether either run's call order varies from step to step (then order is not compared: a
    divergence between the runs is what their own steps already do)."""
    structure = compare_structure(b.samples, c.samples, names, b.placed, c.placed)
    varies = order_varies(b.sequence) or order_varies(c.sequence)
    divergence = None if varies else first_divergence(b.sequence, c.sequence, names, options)
    if divergence is not None:
        structure = pl.concat([structure, pl.DataFrame([order_finding(divergence)], schema=STRUCTURE_SCHEMA)])
    return structure, divergence, calls_per_step(b.samples, c.samples, names), varies


def diff_spans(base_spans: pl.DataFrame, cand_spans: pl.DataFrame, options: DiffOptions | None = None) -> DiffResult:
    """``diff_runs`` of two spans frames."""
    return diff_runs(calls_of_spans(base_spans), calls_of_spans(cand_spans), options)


def _median(values: pl.Series) -> float | None:
    if values.len() == 0:
        return None
    m = values.median()
    return float(m) if m is not None else None  # type: ignore[arg-type]
