"""``Database.memory``: the counted steps' storages read (``store.memory_plan``), each step's
timeline and forward calls built and the what-if and budget asked of them
(``analysis.memory_plan``); times from the run's spans and steps."""

from __future__ import annotations

import shlex
import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from modtrace.core.errors import UsageError

if TYPE_CHECKING:
    import polars as pl

    from modtrace.analysis.memory_plan import MemoryReport, StepModel
    from modtrace.api._runs import Run
    from modtrace.store.engine import Store


def no_memory_line(name: str) -> str:
    return (f"run {name!r} has no counted step with memory: record it with work counters on "
            f"(modtrace record --counters first|every-step, Recorder(counters='first')), then: "
            f"modtrace memory {shlex.quote(name)}")


def memory(store: Store, ref: Run, spans_of: Callable[[], pl.DataFrame], steps_of: Callable[[], pl.DataFrame], *,
           checkpoint: str | Sequence[str] = (), budget: int | str | None = None,
           device: str | None = None) -> MemoryReport:
    """``Database.memory`` of run ``ref``: ``spans_of()`` gives its spans on the host clock,
    ``steps_of()`` its steps (``Database.steps``), each read only when the run has memory."""
    from dataclasses import replace

    import polars as pl

    from modtrace.analysis.memory_plan import (
        MemoryReport,
        budget_plan,
        chosen_modules,
        module_forward_ns,
        module_memory,
        outermost_names,
        recompute_ns,
        step_model,
        step_peaks,
        what_if,
    )
    from modtrace.core.sizes import parse_bytes
    from modtrace.store.memory import has_memory, read_returns, read_storages
    from modtrace.store.memory_plan import counted_ranges
    from modtrace.store.reader import read_devices

    patterns = [checkpoint] if isinstance(checkpoint, str) else list(checkpoint)
    if any(not p.strip() for p in patterns):
        raise UsageError("checkpoint: an empty pattern", cli="--checkpoint: an empty pattern")
    limit = None if budget is None else parse_bytes(budget)
    ranges = counted_ranges(store, ref.id)
    if not ranges or not has_memory(store, ref.id):
        raise UsageError(no_memory_line(ref.name))
    spans = spans_of()
    names = read_devices(store, ref.id).select(pl.col("rank").cast(pl.Int32), pl.col("device_id").cast(pl.Int32),
                                               pl.col("name").cast(pl.String))
    storages = read_storages(store, ref.id).join(
        names, left_on=["rank", "device"], right_on=["rank", "device_id"], how="left").with_columns(
        pl.col("name").fill_null(pl.col("device").cast(pl.String)).alias("device")).drop("name")
    returns = read_returns(store, ref.id)
    # Each counted range's spans: the ranges are disjoint, so one as-of join assigns them all.
    bounds = pl.DataFrame(ranges, schema={"rank": pl.Int32, "first_seq": pl.Int64, "last_seq": pl.Int64}, orient="row")
    ranged = (spans.with_columns(pl.col("rank").cast(pl.Int32), pl.col("span_id").cast(pl.Int64)).sort("rank", "span_id")
              .join_asof(bounds.sort("rank", "first_seq"), left_on="span_id", right_on="first_seq", by="rank",
                         strategy="backward", check_sortedness=False)
              .filter(pl.col("first_seq").is_not_null() & (pl.col("span_id") <= pl.col("last_seq"))))
    by_range = ranged.partition_by(["rank", "first_seq"], as_dict=True)
    by_storage = storages.partition_by(["rank", "first_seq"], as_dict=True)
    models: list[StepModel] = []
    for rank, first, _last in ranges:
        in_range = by_range.get((rank, first))
        mine = by_storage.get((rank, first))
        if in_range is None or mine is None:
            continue
        step = in_range.filter(pl.col("span_id") == first)["step"]
        if step.len() == 0 or step[0] is None:
            continue
        back = returns.filter(pl.col("rank") == rank)
        for dev in sorted(mine["device"].unique().to_list(), key=str):
            models.append(step_model(mine.filter(pl.col("device") == dev), in_range, back, rank=rank,
                                     step=int(step[0]), first_seq=first, device=str(dev)))
    if not models:
        raise UsageError(no_memory_line(ref.name))
    devices = sorted({m.device for m in models})
    if device is None:
        device = max(models, key=lambda m: m.peak_bytes).device
    elif device not in devices:
        raise UsageError(f"run {ref.name!r} tracked no memory on device {device!r}; its devices: {', '.join(devices)}")
    chosen = [m for m in models if m.device == device]
    steps = steps_of()
    # Times from the steps that were not counted: counting (and tracking storages) slows a step.
    counted = pl.DataFrame(sorted({(m.rank, m.step) for m in models}), schema={"rank": pl.Int32, "step": pl.Int32},
                           orient="row")
    timed = steps.with_columns(pl.col("rank").cast(pl.Int32), pl.col("step").cast(pl.Int32)).join(
        counted, on=["rank", "step"], how="anti")
    if timed.height == 0:
        timed = steps
    step_ns = int(statistics.median(timed["step_ns"].to_list())) if timed.height else 0
    forward_ns = module_forward_ns(spans, timed)
    report = MemoryReport(run=ref.name, device=device, steps=tuple(step_peaks(models)),
                          modules=tuple(module_memory(chosen, forward_ns)), step_ns=step_ns, timed_steps=timed.height)
    if patterns:
        fqns = chosen_modules(chosen, patterns)
        unmatched = [p for p in patterns if not chosen_modules(chosen, [p])]
        if unmatched:
            raise UsageError(f"checkpoint pattern {unmatched[0]!r} matches no module called forward in a counted step "
                             f"of run {ref.name!r} (patterns are globs on module names, e.g. 'blocks.*' or "
                             f"'*.mlp')", cli=f"--checkpoint {unmatched[0]!r} matches no module called forward in a "
                             f"counted step of run {ref.name!r} (a glob on module names, e.g. 'blocks.*' or '*.mlp')")
        added = recompute_ns(spans, outermost_names(chosen, fqns), timed)
        report = replace(report, what_if=what_if(chosen, patterns, step_ns=step_ns, added_ns=added))
    if limit is not None:
        plan = budget_plan(chosen, limit, forward_ns, step_ns=step_ns,
                           added_ns_of=lambda f: recompute_ns(spans, f, timed))
        report = replace(report, budget=plan)
    return report
