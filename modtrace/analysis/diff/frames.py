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
)

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


def phase_codes(phases: tuple[str, ...] | None) -> list[int] | None:
    """Phase names -> their codes; None (every phase) stays None."""
    return None if phases is None else [PHASES.index(p) for p in phases]


def of_phases(calls: pl.DataFrame, phases: tuple[str, ...] | None) -> pl.DataFrame:
    """The calls of ``phases`` (None: all)."""
    codes = phase_codes(phases)
    return calls if codes is None else calls.filter(pl.col("phase").is_in(codes))


# -- options and result --------------------------------------------------------------


@dataclass(frozen=True)
class DiffOptions:
    """What counts as a change.  ``threshold`` is relative (0.10 = 10%)."""

    threshold: float = 0.10
    min_delta_ns: int = 20_000
    alpha: float = 0.01
    skip_steps: int = 1
    phases: tuple[str, ...] | None = None  # None: every phase
    absolute: bool = False  # judge absolute times only (no share-of-step criterion)
    # A module's time in a run is judged at this quantile of its per-step times: load only adds
    # time (a preemption lands in whichever module runs), so a low quantile is the module's own.
    low_quantile: float = 0.10
    # How much a module's share must grow against the typical module's (0.5 = 1.5 times) to be
    # blamed: what separated run-to-run noise from a slower module on a loaded machine
    # (docs/performance.md, "Regression gate").
    share_threshold: float = 0.50
    excerpt_context: int = 3
    excerpt_changes: int = 8


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
    timing: pl.DataFrame  # TIMING_COLUMNS
    structure: pl.DataFrame  # STRUCTURE_SCHEMA
    divergence: Divergence | None
    summary: dict[str, object] = field(default_factory=dict)
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
        # against a history, a step time beyond the history's spread is a regression of its own
        regress = self._count("regressions") > 0 or self.summary.get("step_verdict") == "regression"
        structure = self._count("structure_changes") > 0
        counters = self._count("counter_changes") > 0
        return {"regression": regress, "structure": structure, "counters": counters,
                "any": regress or structure or counters, "never": False}[fail_on]

    def _count(self, key: str) -> int:
        value = self.summary.get(key, 0)
        return value if isinstance(value, int) else 0

    def exit_code(self, fail_on: str) -> int:
        """1 when ``failed(fail_on)``, else 0."""
        return 1 if self.failed(fail_on) else 0
