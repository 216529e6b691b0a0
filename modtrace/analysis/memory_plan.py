"""What activation checkpointing would buy: a counted step's memory timeline replayed with some
module calls checkpointed (non-reentrant ``torch.utils.checkpoint``), and the cheapest set of
modules whose checkpointing brings the step's peak under a budget.

Pure polars and numpy; ``modtrace.api._memory`` reads the frames.  The inputs, per counted step
(one rank's counted range) and device:

- ``storages``: ``sid, nbytes, alloc_seq, free_seq`` (the recorder's ``mem_storages``): a
  storage allocated or freed at position p was so after event seq p-1 and before event seq p;
  ``alloc_seq`` null: alive when the step began, ``free_seq`` null: not freed in it.
- ``spans``: the step's spans (``span_id``, the seq of the enter event, ``exit_seq``,
  ``parent_span_id``, ``fqn``, ``phase``, ``call_id``, ``duration_ns``); a backward span has
  its forward call's ``call_id``.
- ``returns``: ``call_id, sid``: the storages each forward call returned.

The model (docs/memory.md, "The what-if model").  Let L(p) be the live bytes after the memory
operations at position p (the step's timeline, parameters, gradients and optimizer state
included).  For a checkpointed forward call c, entered at e, exited at x, whose backward span
begins at r:

- K(c): the storages allocated in c's forward (e < alloc <= x) still alive at its exit
  (free > x or never) and not among what c returned.  Under checkpointing c keeps none of them
  after its exit: from x+1 to r the timeline is lower by the bytes of K(c) still alive there.
- P(c): c's forward transient peak (the most live bytes in its forward above the level at its
  entry).  At r the recompute runs c's forward again: the level just before r, with K(c) and
  every other checkpointed call's savings taken off, plus P(c).  From r on the timeline is the
  measured one (the recompute brought back what the backward reads).
- Inside c's forward the measured timeline is kept: an upper bound (a checkpointed forward frees
  what it would have saved as soon as its own ops are done with it; when is not recorded).
- Only the outermost matching calls count (a checkpoint inside a checkpointed call changes
  nothing in this model).  A call with no backward span in the step is left as measured.

The predicted peak is the most of the replayed timeline and of every recompute's peak; the
predicted step time is the measured step time plus the checkpointed calls' measured forward time
(the recompute runs them again).
"""

from __future__ import annotations

import fnmatch
import itertools
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import polars as pl

# Up to this many candidate modules the budget search tries every subset; beyond, the greedy rule.
EXACT_CANDIDATES = 12

_NEVER = np.iinfo(np.int64).max


def matches(fqn: str, patterns: Iterable[str]) -> bool:
    """Whether a module name matches one of the globs (``fnmatch``, ``*`` crossing dots), as its
    full name (``Net.blocks.0``) or as its name under the root module (``blocks.0``)."""
    under_root = fqn.split(".", 1)[1] if "." in fqn else None
    return any(fnmatch.fnmatchcase(fqn, p) or (under_root is not None and fnmatch.fnmatchcase(under_root, p))
               for p in patterns)


@dataclass(frozen=True)
class CallMemory:
    """One forward call of a counted step, as the what-if sees it."""

    call_id: int
    span_id: int
    exit_seq: int
    fqn: str
    ancestors: frozenset[str]  # the fqns of its enclosing forward calls
    backward_seq: int | None  # the enter seq of its first backward span in the step
    kept_bytes: int  # allocated in its forward, alive at its exit (returned included)
    freed_bytes: int  # of kept_bytes, what it did not return: what checkpointing it frees
    forward_peak_bytes: int  # the most live bytes in its forward above the level at its entry
    forward_ns: int
    kept_free: np.ndarray = field(repr=False, compare=False)  # K(c)'s frees as timeline indices, sorted (_NEVER: none)
    kept_cum: np.ndarray = field(repr=False, compare=False)  # running sums of their bytes, from 0


@dataclass(frozen=True)
class StepModel:
    """One counted step's timeline on one device and its forward calls."""

    rank: int
    step: int
    first_seq: int
    device: str
    base_bytes: int  # alive when the step began
    pos: np.ndarray = field(repr=False, compare=False)  # each memory operation's position, in order
    level: np.ndarray = field(repr=False, compare=False)  # live bytes after it
    calls: tuple[CallMemory, ...] = ()

    @property
    def peak_bytes(self) -> int:
        return int(max(self.base_bytes, int(self.level.max()) if self.level.size else 0))

    def level_at(self, p: int) -> int:
        """Live bytes once the operations at positions up to ``p`` are done (just before event p)."""
        i = int(np.searchsorted(self.pos, p, side="right"))
        return int(self.level[i - 1]) if i else self.base_bytes

    def chosen(self, fqns: frozenset[str]) -> list[CallMemory]:
        """The outermost calls of modules in ``fqns`` that have a backward span."""
        return [c for c in self.calls if c.fqn in fqns and not (c.ancestors & fqns) and c.backward_seq is not None]

    def predict(self, fqns: frozenset[str]) -> int:
        """The step's peak had the modules ``fqns`` been checkpointed (the module docstring's model)."""
        return self.predict_calls(self.chosen(fqns))

    def predict_calls(self, calls: Sequence[CallMemory]) -> int:
        if not calls:
            return self.peak_bytes
        level = self.level.astype(np.int64, copy=True)
        for c in calls:
            assert c.backward_seq is not None
            i0 = int(np.searchsorted(self.pos, c.exit_seq + 1, side="left"))
            i1 = int(np.searchsorted(self.pos, c.backward_seq, side="right"))
            if i1 > i0:
                level[i0:i1] -= _alive_after(c, np.arange(i0, i1))
        peak = max(self.base_bytes, int(level.max()) if level.size else 0)
        for c in calls:
            assert c.backward_seq is not None
            r = c.backward_seq
            last = int(np.searchsorted(self.pos, r, side="right")) - 1  # the last operation before event r
            before = self.level_at(r) - sum(int(_alive_after(o, np.array([last]))[0]) for o in calls
                                            if o.backward_seq is not None and o.exit_seq < r <= o.backward_seq)
            peak = max(peak, before + c.forward_peak_bytes)
        return peak


def _alive_after(c: CallMemory, rows: np.ndarray) -> np.ndarray:
    """Bytes of K(c) not yet freed once each of the timeline's operations ``rows`` (indices) is done."""
    freed = np.searchsorted(c.kept_free, rows, side="right")
    alive: np.ndarray = c.kept_cum[-1] - c.kept_cum[freed]
    return alive


def _ops(storages: pl.DataFrame) -> tuple[int, np.ndarray, np.ndarray, dict[int, int]]:
    """(base bytes, positions, levels, sid -> the index of its free) of one device's storages:
    every allocation and free in the order the recorder saw them (its memory counter: ``sid``
    at the allocation, ``free_order`` at the free), which is position order.  Without
    ``free_order`` a position's allocations come first (the high side: all counted live)."""
    base = int(storages.filter(pl.col("alloc_seq").is_null())["nbytes"].sum() or 0)
    allocs = storages.filter(pl.col("alloc_seq").is_not_null()).select(
        pl.col("alloc_seq").alias("pos"), pl.lit(0).alias("kind"), pl.col("sid").alias("order"), "sid",
        pl.col("nbytes").alias("delta"))
    free_order = pl.col("free_order") if "free_order" in storages.columns else pl.lit(None, dtype=pl.Int64)
    frees = storages.filter(pl.col("free_seq").is_not_null()).select(
        pl.col("free_seq").alias("pos"), pl.lit(1).alias("kind"),
        free_order.fill_null(np.iinfo(np.int64).max).alias("order"), "sid", (-pl.col("nbytes")).alias("delta"))
    ops = pl.concat([allocs, frees]).cast({"pos": pl.Int64, "kind": pl.Int8, "order": pl.Int64, "sid": pl.Int64,
                                           "delta": pl.Int64})
    ops = ops.sort("pos", "order", "kind").with_row_index("i")
    pos = ops["pos"].to_numpy().astype(np.int64)
    level = base + np.cumsum(ops["delta"].to_numpy().astype(np.int64))
    freed = dict(ops.filter(pl.col("kind") == 1).select("sid", pl.col("i").cast(pl.Int64)).iter_rows())
    return base, pos, level, freed


def _forward_calls(spans: pl.DataFrame) -> list[dict[str, Any]]:
    """The step's forward spans as dicts with their ancestors' fqns and first backward seq."""
    rows = spans.select(
        pl.col("span_id").cast(pl.Int64), pl.col("exit_seq").cast(pl.Int64), pl.col("parent_span_id").cast(pl.Int64),
        pl.col("fqn").cast(pl.String), pl.col("phase").cast(pl.String), pl.col("call_id").cast(pl.Int64),
        pl.col("duration_ns").cast(pl.Int64),
    ).sort("span_id").to_dicts()
    backward: dict[int, int] = {}
    for r in rows:
        if r["phase"] == "backward" and r["call_id"] not in backward:
            backward[r["call_id"]] = r["span_id"]
    by_id = {r["span_id"]: r for r in rows if r["phase"] == "forward"}
    out = []
    for r in by_id.values():
        if r["exit_seq"] is None:
            continue
        names = []
        parent = by_id.get(r["parent_span_id"]) if r["parent_span_id"] is not None else None
        while parent is not None:
            names.append(parent["fqn"])
            parent = by_id.get(parent["parent_span_id"]) if parent["parent_span_id"] is not None else None
        out.append({**r, "ancestors": frozenset(names), "backward_seq": backward.get(r["call_id"])})
    return out


def step_model(storages: pl.DataFrame, spans: pl.DataFrame, returns: pl.DataFrame, *, rank: int, step: int,
               first_seq: int, device: str) -> StepModel:
    """The what-if's view of one counted step on one device (see the module docstring for the
    frames); ``storages`` only that device's."""
    base, pos, level, freed_at = _ops(storages)
    # By allocation, so each call reads only the storages allocated in its forward (a slice).
    by_alloc = storages.sort(pl.col("alloc_seq").fill_null(-1), "sid")
    alloc = by_alloc["alloc_seq"].fill_null(-1).cast(pl.Int64).to_numpy()
    free_all = by_alloc["free_seq"].fill_null(_NEVER).cast(pl.Int64).to_numpy()
    sids_all = by_alloc["sid"].cast(pl.Int64).to_numpy()
    index_all = np.array([freed_at.get(int(sid), _NEVER) for sid in sids_all.tolist()], dtype=np.int64)
    nbytes_all = by_alloc["nbytes"].cast(pl.Int64).to_numpy()
    returned: dict[int, set[int]] = {}
    for call_id, sid in returns.select(pl.col("call_id").cast(pl.Int64), pl.col("sid").cast(pl.Int64)).iter_rows():
        returned.setdefault(call_id, set()).add(sid)
    calls = []
    for r in _forward_calls(spans):
        e, x = r["span_id"], r["exit_seq"]
        lo, hi = int(np.searchsorted(alloc, e + 1, side="left")), int(np.searchsorted(alloc, x, side="right"))
        free, free_index = free_all[lo:hi], index_all[lo:hi]
        nbytes, sids = nbytes_all[lo:hi], sids_all[lo:hi]
        kept = free > x
        back = returned.get(r["call_id"], set())
        mine = kept & ~np.isin(sids, np.fromiter(back, dtype=np.int64, count=len(back)))
        order = np.argsort(free_index[mine], kind="stable")
        kept_free = free_index[mine][order]
        kept_cum = np.concatenate([[0], np.cumsum(nbytes[mine][order])]).astype(np.int64)
        i0 = int(np.searchsorted(pos, e + 1, side="left"))
        i1 = int(np.searchsorted(pos, x, side="right"))
        entry = int(level[i0 - 1]) if i0 else base
        peak = max(0, int(level[i0:i1].max()) - entry) if i1 > i0 else 0
        calls.append(CallMemory(
            call_id=r["call_id"], span_id=e, exit_seq=x, fqn=r["fqn"], ancestors=r["ancestors"],
            backward_seq=r["backward_seq"], kept_bytes=int(nbytes[kept].sum()), freed_bytes=int(kept_cum[-1]),
            forward_peak_bytes=peak, forward_ns=int(r["duration_ns"] or 0), kept_free=kept_free, kept_cum=kept_cum,
        ))
    return StepModel(rank=rank, step=step, first_seq=first_seq, device=device, base_bytes=base, pos=pos, level=level,
                     calls=tuple(calls))


# -- time -------------------------------------------------------------------------------------


def outermost_forward(spans: pl.DataFrame, fqns: Iterable[str]) -> pl.DataFrame:
    """The forward spans of modules in ``fqns`` with no enclosing forward span of one of them:
    rank, step, span_id, fqn, duration_ns."""
    names = list(fqns)
    fw = spans.filter(pl.col("phase").cast(pl.String) == "forward").select(
        pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int32), pl.col("span_id").cast(pl.Int64),
        pl.col("parent_span_id").cast(pl.Int64), pl.col("depth").cast(pl.Int32), pl.col("fqn").cast(pl.String),
        pl.col("duration_ns").cast(pl.Int64),
    ).with_columns(pl.col("fqn").is_in(names).alias("hit"), pl.lit(False).alias("under"))
    max_depth = fw["depth"].max()
    for depth in range(1, int(max_depth) + 1 if isinstance(max_depth, int) else 1):
        up = fw.filter(pl.col("depth") == depth - 1).select(
            "rank", pl.col("span_id").alias("parent_span_id"), (pl.col("hit") | pl.col("under")).alias("up"))
        fw = fw.join(up, on=["rank", "parent_span_id"], how="left", maintain_order="left").with_columns(
            pl.when(pl.col("depth") == depth).then(pl.col("up").fill_null(False)).otherwise(pl.col("under"))
            .alias("under")).drop("up")
    return fw.filter(pl.col("hit") & ~pl.col("under")).select("rank", "step", "span_id", "fqn", "duration_ns")


def recompute_ns(spans: pl.DataFrame, fqns: Iterable[str], steps: pl.DataFrame) -> int:
    """The median over ``steps`` (rank, step) of the forward time of the outermost calls of
    ``fqns`` in the step (0 in a step without one): what recomputing them adds."""
    if steps.height == 0:
        return 0
    per = outermost_forward(spans, fqns).group_by("rank", "step").agg(pl.col("duration_ns").sum())
    sums = steps.select(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int32)).join(
        per, on=["rank", "step"], how="left")["duration_ns"].fill_null(0).to_list()
    return int(statistics.median(sums))


def module_forward_ns(spans: pl.DataFrame, steps: pl.DataFrame) -> dict[str, int]:
    """fqn -> the median over ``steps`` of its forward calls' summed time in the step (0 where it
    did not run), for each module that ran forward in one of them."""
    fw = spans.filter(pl.col("phase").cast(pl.String) == "forward").select(
        pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int32), pl.col("fqn").cast(pl.String),
        pl.col("duration_ns").cast(pl.Int64))
    picked = steps.select(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int32))
    per = fw.join(picked, on=["rank", "step"], how="semi").group_by("fqn", "rank", "step").agg(pl.col("duration_ns").sum())
    n = picked.height
    out: dict[str, int] = {}
    for fqn, values in per.group_by("fqn").agg(pl.col("duration_ns")).iter_rows():
        out[fqn] = int(statistics.median([*values, *([0] * (n - len(values)))])) if n else 0
    return out


# -- results ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepPeak:
    """The peak live tensor memory of one counted step on one device (parameters, gradients and
    optimizer state included), and what was alive as it began."""

    rank: int
    step: int
    device: str
    base_bytes: int
    peak_bytes: int


@dataclass(frozen=True)
class ModuleMemory:
    """One module's forward, over the counted steps: what it keeps (medians per step of its calls'
    sums), its largest forward transient peak, and its forward time per step (what recomputing it
    would cost; the median over the timed steps)."""

    fqn: str
    calls: int  # forward calls per counted step (the most)
    kept_bytes: int  # allocated in its forward and alive at its exit, returned included
    freed_bytes: int  # of those, what it did not return: what checkpointing it frees until its backward
    forward_peak_bytes: int
    forward_ns: int
    backward: bool  # whether its calls have a backward (checkpointing one without changes nothing)


@dataclass(frozen=True)
class WhatIf:
    """The predicted step peak and time had ``modules`` (the outermost matches of ``checkpoint``)
    been checkpointed; ``peak_bytes`` is the worst counted step's, ``measured_peak_bytes`` its
    measured peak."""

    checkpoint: tuple[str, ...]
    modules: tuple[str, ...]
    device: str
    peak_bytes: int
    measured_peak_bytes: int
    step_ns: int
    measured_step_ns: int
    added_ns: int

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["checkpoint"], out["modules"] = list(self.checkpoint), list(self.modules)
        return out


@dataclass(frozen=True)
class BudgetPlan:
    """The cheapest set of modules (by recompute time) whose checkpointing brings the predicted
    peak to ``budget_bytes`` or under; ``found`` False when none does (``lowest_peak_bytes``: the
    lowest predicted peak the search met).  ``search``: ``exact`` (every subset of the
    ``candidates``) or ``greedy`` (docs/memory.md, "--budget")."""

    budget_bytes: int
    found: bool
    search: str
    candidates: int
    modules: tuple[str, ...]
    peak_bytes: int
    added_ns: int
    step_ns: int
    lowest_peak_bytes: int

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["modules"] = list(self.modules)
        return out


def step_peaks(models: Sequence[StepModel]) -> list[StepPeak]:
    return [StepPeak(m.rank, m.step, m.device, m.base_bytes, m.peak_bytes) for m in models]


def module_memory(models: Sequence[StepModel], forward_ns: dict[str, int]) -> list[ModuleMemory]:
    """Every module that ran forward in a counted step, by kept bytes, most first."""
    per: dict[str, list[tuple[int, int, int, int, bool]]] = {}
    for m in models:
        sums: dict[str, list[int]] = {}
        for c in m.calls:
            acc = sums.setdefault(c.fqn, [0, 0, 0, 0, 0])
            acc[0] += 1
            acc[1] += c.kept_bytes
            acc[2] += c.freed_bytes
            acc[3] = max(acc[3], c.forward_peak_bytes)
            acc[4] |= c.backward_seq is not None
        for fqn, acc in sums.items():
            per.setdefault(fqn, []).append((acc[0], acc[1], acc[2], acc[3], bool(acc[4])))
    out = [
        ModuleMemory(fqn=fqn, calls=max(v[0] for v in vals), kept_bytes=int(statistics.median(v[1] for v in vals)),
                     freed_bytes=int(statistics.median(v[2] for v in vals)),
                     forward_peak_bytes=max(v[3] for v in vals), forward_ns=forward_ns.get(fqn, 0),
                     backward=any(v[4] for v in vals))
        for fqn, vals in per.items()
    ]
    return sorted(out, key=lambda m: (-m.kept_bytes, m.fqn))


def chosen_modules(models: Sequence[StepModel], patterns: Sequence[str]) -> frozenset[str]:
    """The modules the globs match among the counted steps' forward calls."""
    return frozenset(c.fqn for m in models for c in m.calls if matches(c.fqn, patterns))


def outermost_names(models: Sequence[StepModel], fqns: frozenset[str]) -> tuple[str, ...]:
    """The modules of ``fqns`` that have an outermost call with a backward in some step."""
    return tuple(sorted({c.fqn for m in models for c in m.chosen(fqns)}))


def predicted_peak(models: Sequence[StepModel], fqns: frozenset[str]) -> int:
    """The worst counted step's predicted peak had ``fqns`` been checkpointed."""
    return max((m.predict(fqns) for m in models), default=0)


def what_if(models: Sequence[StepModel], patterns: Sequence[str], *, step_ns: int, added_ns: int) -> WhatIf:
    """The what-if for the globs ``patterns``; ``step_ns`` the measured step time, ``added_ns`` the
    forward time of the outermost matched calls per step (``recompute_ns``)."""
    fqns = chosen_modules(models, patterns)
    worst = max(models, key=lambda m: m.peak_bytes)
    return WhatIf(checkpoint=tuple(patterns), modules=outermost_names(models, fqns), device=worst.device,
                  peak_bytes=predicted_peak(models, fqns), measured_peak_bytes=max(m.peak_bytes for m in models),
                  step_ns=step_ns + added_ns, measured_step_ns=step_ns, added_ns=added_ns)


def budget_candidates(models: Sequence[StepModel]) -> list[str]:
    """Modules whose checkpointing can lower the peak: a forward call that keeps something it does
    not return, with a backward in the step."""
    return sorted({c.fqn for m in models for c in m.calls if c.freed_bytes > 0 and c.backward_seq is not None})


def _cost(fqns: frozenset[str], forward_ns: dict[str, int]) -> int:
    # Outermost by name: a module under another of the set is recomputed inside it, at no extra cost.
    return sum(forward_ns.get(f, 0) for f in fqns if not any(f.startswith(o + ".") for o in fqns if o != f))


def cheapest(models: Sequence[StepModel], budget: int, forward_ns: dict[str, int]) -> tuple[str, frozenset[str] | None, int, int]:
    """(search, the cheapest set found or None, number of candidates, the lowest predicted peak met).

    Exact with up to ``EXACT_CANDIDATES`` candidates: every subset, the cheapest whose predicted
    peak is within ``budget`` (ties: the lower peak, then fewer modules).  Beyond: greedy -- from
    no module, add the candidate that lowers the predicted peak the most per nanosecond of
    recompute time until the peak is within budget or no candidate lowers it; then drop, most
    expensive first, every chosen module the budget holds without."""
    names = budget_candidates(models)
    measured = predicted_peak(models, frozenset())
    if measured <= budget:
        return ("exact" if len(names) <= EXACT_CANDIDATES else "greedy"), frozenset(), len(names), measured
    if len(names) <= EXACT_CANDIDATES:
        best: tuple[int, int, int, frozenset[str]] | None = None
        lowest = measured
        for n in range(1, len(names) + 1):
            for combo in itertools.combinations(names, n):
                trial = frozenset(combo)
                peak = predicted_peak(models, trial)
                lowest = min(lowest, peak)
                if peak <= budget:
                    key = (_cost(trial, forward_ns), peak, n, trial)
                    if best is None or key[:3] < best[:3]:
                        best = key
        return "exact", (best[3] if best is not None else None), len(names), lowest
    chosen: frozenset[str] = frozenset()
    peak = measured
    lowest = measured
    while peak > budget:
        pick: tuple[float, str, int] | None = None
        for name in names:
            if name in chosen or any(name.startswith(o + ".") for o in chosen):
                continue
            trial_peak = predicted_peak(models, chosen | {name})
            drop = peak - trial_peak
            if drop <= 0:
                continue
            rate = drop / max(_cost(chosen | {name}, forward_ns) - _cost(chosen, forward_ns), 1)
            if pick is None or rate > pick[0]:
                pick = (rate, name, trial_peak)
        if pick is None:
            return "greedy", None, len(names), lowest
        chosen, peak = chosen | {pick[1]}, pick[2]
        lowest = min(lowest, peak)
    for name in sorted(chosen, key=lambda f: -forward_ns.get(f, 0)):
        without = chosen - {name}
        if predicted_peak(models, without) <= budget:
            chosen = without
    return "greedy", chosen, len(names), lowest


def budget_plan(models: Sequence[StepModel], budget: int, forward_ns: dict[str, int], *,
                step_ns: int, added_ns_of: Callable[[frozenset[str]], int]) -> BudgetPlan:
    """``cheapest`` as a ``BudgetPlan``; ``added_ns_of(fqns)`` measures a set's recompute time
    (``recompute_ns`` over the timed steps, outermost by the recorded calls)."""
    search, found, n, lowest = cheapest(models, budget, forward_ns)
    if found is None:
        return BudgetPlan(budget, False, search, n, (), lowest, 0, step_ns, lowest)
    modules = outermost_names(models, found) if found else ()
    added = int(added_ns_of(frozenset(modules))) if modules else 0
    return BudgetPlan(budget, True, search, n, modules, predicted_peak(models, found), added, step_ns + added,
                      lowest)


@dataclass(frozen=True)
class MemoryReport:
    """``Database.memory``'s answer: the peak of each counted step (``steps``, every device), the
    modules by what their forward keeps beside their forward time (``modules``, on ``device``:
    the device of the largest peak unless one was asked for), the what-if for the modules asked
    to checkpoint (``what_if``, None when none was) and the budget's cheapest set (``budget``,
    None when no budget was given).  ``timed_steps``: the steps the times are medians over (the
    uncounted ones when there are any: counting slows a step).  ``to_dict()`` is the JSON."""

    run: str
    device: str
    steps: tuple[StepPeak, ...]
    modules: tuple[ModuleMemory, ...]
    step_ns: int
    timed_steps: int
    what_if: WhatIf | None = None
    budget: BudgetPlan | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "run": self.run, "device": self.device, "step_ns": self.step_ns, "timed_steps": self.timed_steps,
            "steps": [asdict(s) for s in self.steps],
            "modules": [asdict(m) for m in self.modules],
            "what_if": None if self.what_if is None else self.what_if.to_dict(),
            "budget": None if self.budget is None else self.budget.to_dict(),
        }
