"""What a diff reads and returns: its frame contracts, options and result.

A run enters as ``RunCalls``: its closed calls (``CALL_SCHEMA``, integer
codes) and its module and device lookups.  Modules are matched between the
runs by name: every module name of both runs gets an integer ``mkey``
(``samples.module_keys``), and every (module, phase) one ``key``, packed by
``pack_key``; names come back only on the few result rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypeVar

import polars as pl

from modtrace.core import contracts
from modtrace.core.contracts import CALL_FRAME

PHASES: tuple[str, ...] = contracts.PHASES  # index = phase code (codes.Phase)
VERDICTS: tuple[str, ...] = ("regression", "improvement", "inherited", "unchanged")
STRUCTURE_KINDS: tuple[str, ...] = (
    "module_removed", "module_added", "phase_removed", "phase_added",
    "calls_changed", "device_changed", "stream_changed", "order_changed",
)
METRICS: tuple[str, ...] = ("self", "incl")
SHARE_METRICS: tuple[str, ...] = ("self_share", "incl_share")
PPB = 1_000_000_000  # shares are computed in parts per billion

# One closed span, as a diff reads it: codes, no names.
CALL_SCHEMA: dict[str, pl.DataType] = CALL_FRAME.polars()

# Per-step samples: ``key`` names (fqn, phase) in both runs (``pack_key``).
SAMPLE_SCHEMA: dict[str, pl.DataType] = {
    "rank": pl.Int32(),
    "step": pl.Int32(),
    "key": pl.Int64(),
    "calls": pl.Int64(),
    "incl_ns": pl.Int64(),
    "self_ns": pl.Int64(),
}

STRUCTURE_SCHEMA: dict[str, pl.DataType] = {
    "kind": pl.String(),
    "fqn": pl.String(),
    "phase": pl.String(),
    "base": pl.String(),
    "cand": pl.String(),
    "message": pl.String(),
}

EXCERPT_SCHEMA: dict[str, pl.DataType] = {
    "op": pl.String(),  # = same, - base only, + candidate only, ~ differs
    "base_pos": pl.Int64(),
    "cand_pos": pl.Int64(),
    "base": pl.String(),
    "cand": pl.String(),
}

STAT_COLUMNS: tuple[str, ...] = ("base", "cand", "delta", "ratio", "ci_low", "ci_high", "p_value", "p_adjusted")
_TIME_STATS = tuple(c if c in ("ratio", "p_value", "p_adjusted") else f"{c}_ns" for c in STAT_COLUMNS)
TIMING_COLUMNS: tuple[str, ...] = (
    "fqn", "phase", "verdict", "impact_ns", "impact_pct", "n_base", "n_cand", "calls_base", "calls_cand",
    *(f"{m}_{c}" for m in METRICS for c in _TIME_STATS),
    # shares of the step as fractions (0.25 = a quarter of the step); delta and CI in fractions too
    *(f"{m}_{c}" for m in SHARE_METRICS for c in STAT_COLUMNS),
    "self_vs_rest", "incl_vs_rest", "self_vs_typical", "incl_vs_typical",
    "self_noise_p_adjusted", "incl_noise_p_adjusted",
    # against a history of base runs (``history``): the lowest and highest of the base runs'
    # medians; null in a diff of two runs
    *(f"{m}_history_{b}_ns" for m in METRICS for b in ("low", "high")),
    *(f"self_share_history_{b}" for b in ("low", "high")),
    # each base run's median self time per step, in the history's order (newest first): a list
    "self_history_ns",
    # the rule's checks of the self time (they decide regression and improvement) and of the
    # inclusive time (inherited): lists of CHECK_TYPE
    "checks", "inclusive_checks",
)

# One check of the rule, as the timing frame holds it (``Check``).
CHECK_TYPE = pl.Struct({"name": pl.String(), "value": pl.Float64(), "bar": pl.Float64(), "passed": pl.Boolean()})

# Calls per step of the modules whose count varies from step to step in a run (data-dependent:
# routing, early exit): their distribution on each side, and whether it changed
# (``structure.calls_per_step``).
CALLS_SCHEMA: dict[str, pl.DataType] = {
    "fqn": pl.String(),
    "phase": pl.String(),
    **{f"{side}_{q}": pl.Float64() for side in ("base", "cand") for q in ("min", "median", "max")},
    "changed": pl.Boolean(),
}

# -- (module, phase) keys ------------------------------------------------------------

# A key packs a module number and a phase code: key = mkey * PHASE_SLOTS + phase.
PHASE_SLOTS = 4
assert len(PHASES) <= PHASE_SLOTS

K = TypeVar("K", int, pl.Expr, pl.Series)


def pack_key(mkey: K, phase: K) -> K:
    """The key of (module ``mkey``, phase code ``phase``)."""
    key: K = mkey * PHASE_SLOTS + phase
    return key


def key_module(key: K) -> K:
    """The ``mkey`` of a key (``pack_key``)."""
    return key // PHASE_SLOTS


def key_phase(key: K) -> K:
    """The phase code of a key (``pack_key``)."""
    return key % PHASE_SLOTS


def key_fqn(key: pl.Expr, names: pl.DataFrame) -> pl.Expr:
    """The module name of each key, from ``names`` (``samples.module_keys``)."""
    return pl.lit(names["fqn"]).gather(key_module(key))


def key_phase_name(key: pl.Expr) -> pl.Expr:
    """The phase name of each key."""
    return pl.lit(pl.Series(PHASES)).gather(key_phase(key))


def of_phases(calls: pl.DataFrame, phases: tuple[str, ...] | None) -> pl.DataFrame:
    """The calls of ``phases`` (None: all)."""
    return calls if phases is None else calls.filter(pl.col("phase").is_in([PHASES.index(p) for p in phases]))


# -- options and result --------------------------------------------------------------


@dataclass(frozen=True)
class DiffOptions:
    """The rule's knobs, one per role (docs/diff.md, "The rule", names each check they set).

    Margins are relative (0.10 = 10%); a margin left None takes ``threshold``, the shorthand
    ``--threshold`` sets.
    """

    threshold: float = 0.10
    share_margin: float | None = None  # check share_ratio
    median_margin: float | None = None  # check median_ratio
    level_margin: float | None = None  # check level_ratio (absolute)
    step_margin: float | None = None  # check beyond_history
    confirm_margin: float | None = None  # check confirmed
    share_threshold: float = 0.50  # check vs_typical
    min_delta_ns: int = 20_000  # check level_delta_us
    alpha: float = 0.01  # checks steps, p_holm, step_p
    low_quantile: float = 0.10  # a module's (and a raw step's) level
    confirm_spread: float = 3.0  # when the CPU time as measured may confirm (check confirmed)
    min_history: int = 2  # check history_runs: base runs the step verdict needs
    skip_steps: int = 1
    phases: tuple[str, ...] | None = None  # None: every phase
    absolute: bool = False  # judge absolute times: p_holm and level_ratio instead of the shares
    # Checks left out of the rule (still computed, not judged or shown): to measure what each
    # one earns on stored recordings (benchmarks/gate_power.py --without).
    skip_checks: frozenset[str] = frozenset()
    excerpt_context: int = 3
    excerpt_changes: int = 8

    def margin(self, role: str) -> float:
        """The margin of ``role`` (share, median, level, step, confirm)."""
        value: float | None = getattr(self, f"{role}_margin")
        return self.threshold if value is None else value


@dataclass(frozen=True)
class Check:
    """One condition of the rule: the ``value`` measured, the ``bar`` it had to clear (above it
    for a slower time, below it for a faster one, as the check's name says in docs/diff.md) and
    whether it did.  A verdict is a regression or an improvement exactly when all its checks
    passed."""

    name: str
    value: float | None
    bar: float | None
    passed: bool

    def as_dict(self) -> dict[str, object]:
        return {"name": self.name, "value": self.value, "bar": self.bar, "passed": self.passed}


STEP_VERDICTS: tuple[str, ...] = ("regression", "improvement", "unchanged", "unknown")
# Which step time the step verdict judged (docs/diff.md, "The step"): "raw" the steps' own times,
# "wall" at the history's machine speed, "cpu" the thread's CPU time per step at that speed,
# "cpu_raw" that CPU time as measured.
STEP_MEASURES: tuple[str, ...] = ("raw", "wall", "cpu", "cpu_raw")


@dataclass(frozen=True)
class StepVerdict:
    """The step time of the candidate against the base runs' (docs/diff.md, "The step")."""

    verdict: str  # STEP_VERDICTS
    measure: str  # STEP_MEASURES
    checks: tuple[Check, ...]
    ratio: float | None  # the candidate's level over the base runs' median level, on ``measure``
    p_value: float | None  # Mann-Whitney, the candidate's steps against the base runs' pooled
    bounds: tuple[float, float] | None  # (below, above) as ratios to the base runs' median level
    level_low_ns: float | None  # the lowest and highest base run's level on ``measure``
    level_high_ns: float | None
    spreads: dict[str, float] = field(default_factory=dict)  # per measure weighed, its history's spread
    confirming: str | None = None  # the measure that had to agree (check confirmed)
    adjusted_ratio: float | None = None  # the median step over the probe, cand / history ("cpu", "wall")
    cpu_ratio: float | None = None  # the median CPU time per step as measured, cand / history
    cand_speed_ratio: float | None = None  # the candidate's median probe over the history's
    speed_reference_ns: float | None = None  # the history's median probe
    note: str | None = None  # why the steps were not put at speed, when some run took probes

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    @property
    def deciding(self) -> Check | None:
        """The check that decided an unchanged or unknown verdict: the first that failed."""
        return next((c for c in self.checks if not c.passed), None)


@dataclass(frozen=True)
class DiffSummary:
    """What a diff found, counted."""

    base_steps: int  # compared (rank, step) samples, the base runs' pooled
    cand_steps: int
    base_step_ns: float | None  # median step time (the median of the base runs' medians)
    cand_step_ns: float | None
    compared: int  # (module, phase) pairs in both
    regressions: int
    improvements: int
    inherited: int
    structure_changes: int
    min_p_value: float  # the smallest p the Mann-Whitney test can reach with these step counts
    min_steps: int  # the fewest compared steps per run for which it can reach p < alpha
    order_varies: bool  # a run's call order varies from step to step: order not compared
    history_runs: int  # base runs
    history_run_step_ns: tuple[float, ...] = ()  # each base run's median step time, newest first
    counter_changes: int = 0

    @property
    def step_ratio(self) -> float | None:
        """The candidate's median step time over the base's (as recorded)."""
        b, c = self.base_step_ns, self.cand_step_ns
        return c / b if b and c is not None else None


@dataclass(frozen=True)
class RunCalls:
    """One side of a diff: closed calls (``CALL_SCHEMA``) and the lookups that name them."""

    calls: pl.DataFrame
    modules: pl.DataFrame  # rank, module_id, fqn (events.MODULE_SCHEMA; other columns ignored)
    devices: pl.DataFrame  # rank, device_id, name (events.DEVICE_SCHEMA)
    # The speed probe's rows (store.speeds.SPEED_COLUMNS) on the calls' clock; None when the
    # run took none or the calls are on another clock (device).
    speeds: pl.DataFrame | None = None


@dataclass(frozen=True)
class Divergence:
    """Where the call sequences of two aligned steps first differ."""

    rank_base: int
    rank_cand: int
    step_base: int
    step_cand: int
    position: int  # 1-based position of the first differing call in the step
    excerpt: pl.DataFrame  # EXCERPT_SCHEMA


FAIL_ON: tuple[str, ...] = ("regression", "structure", "counters", "any", "never")


@dataclass(frozen=True)
class DiffResult:
    timing: pl.DataFrame  # TIMING_COLUMNS: a row per (module, phase), with its checks
    structure: pl.DataFrame  # STRUCTURE_SCHEMA
    divergence: Divergence | None
    summary: DiffSummary
    step: StepVerdict
    # What was compared: each side's description (run, database, rank, clock, step rule and
    # kinds), filled by the API that read the runs; and notes worth a line to the reader.
    sides: tuple[dict[str, Any], dict[str, Any]] | None = None
    notes: tuple[str, ...] = ()
    # Work counters that differ, exactly (analysis.diff.counters.COUNTER_CHANGE_SCHEMA); None
    # when a side counted no step.
    counters: pl.DataFrame | None = None
    calls: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=CALLS_SCHEMA))  # CALLS_SCHEMA

    def failed(self, fail_on: str) -> bool:
        """Whether the findings ``fail_on`` names are present (``FAIL_ON``): what makes
        ``modtrace diff`` exit 1.  ``never``: no finding fails."""
        if fail_on not in FAIL_ON:
            raise ValueError(f"fail_on must be one of {', '.join(FAIL_ON)}, not {fail_on!r}")
        s = self.summary
        regress = s.regressions > 0 or self.step.verdict == "regression"
        structure = s.structure_changes > 0
        counters = s.counter_changes > 0
        return {"regression": regress, "structure": structure, "counters": counters,
                "any": regress or structure or counters, "never": False}[fail_on]

    def exit_code(self, fail_on: str) -> int:
        """1 when ``failed(fail_on)``, else 0."""
        return 1 if self.failed(fail_on) else 0

    def module(self, fqn: str, phase: str | None = None) -> list[ModuleVerdict]:
        """The verdicts of module ``fqn`` (each phase, or ``phase``), with their checks."""
        rows = self.timing.filter(pl.col("fqn") == fqn)
        if phase is not None:
            rows = rows.filter(pl.col("phase") == phase)
        return [ModuleVerdict.of_row(r) for r in rows.iter_rows(named=True)]

    def modules(self) -> list[ModuleVerdict]:
        """Every compared (module, phase), in the timing frame's order."""
        return [ModuleVerdict.of_row(r) for r in self.timing.iter_rows(named=True)]


@dataclass(frozen=True)
class ModuleVerdict:
    """One (module, phase): its verdict and the checks of its self time (``checks``) and of its
    inclusive time (``inclusive_checks``, what makes it ``inherited``)."""

    fqn: str
    phase: str
    verdict: str  # VERDICTS
    impact_ns: float | None  # change of median self time per step
    checks: tuple[Check, ...]
    inclusive_checks: tuple[Check, ...]

    @staticmethod
    def of_row(row: dict[str, Any]) -> ModuleVerdict:
        def checks(values: list[dict[str, Any]] | None) -> tuple[Check, ...]:
            return tuple(Check(c["name"], c["value"], c["bar"], bool(c["passed"])) for c in values or ())

        return ModuleVerdict(row["fqn"], row["phase"], row["verdict"], row["impact_ns"],
                             checks(row["checks"]), checks(row["inclusive_checks"]))
