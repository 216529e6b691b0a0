"""``Database.stragglers``: the ranks' times reduced in the database (``store.stragglers``), the
rule applied to the reduced table (``analysis.stragglers``)."""

from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from modtrace.core.errors import ModtraceError, UsageError

if TYPE_CHECKING:
    from modtrace.analysis.stragglers import Stragglers
    from modtrace.store.engine import Store


class NotAnalysed(ModtraceError):
    """The run's analysis (its steps) is not stored."""


def stragglers(store: Store, run_id: int, run_name: str, *, step_kind: str | None = None,
               skip_steps: int = 0, stored: bool) -> Stragglers:
    from modtrace.analysis.stragglers import find_stragglers
    from modtrace.store.stragglers import recorded_steps, reduce_ranks

    if skip_steps < 0:
        raise UsageError(f"skip_steps={skip_steps}: steps count from 0", cli=f"--skip-steps {skip_steps}: not below 0")
    if not stored:
        raise NotAnalysed(f"run {run_name!r} has no stored analysis, and stragglers reads its steps from it; "
                          f"store it first: modtrace analyze {shlex.quote(run_name)}")
    by_rank = recorded_steps(store, run_id)
    if len(by_rank) < 2:
        raise UsageError(f"run {run_name!r} has {len(by_rank)} rank(s) with steps: stragglers compares ranks, "
                         "so it needs two or more")
    every = set().union(*map(set, by_rank.values()))
    shared = set.intersection(*map(set, by_rank.values()))
    left_out = sorted(s for s in every - shared if s >= skip_steps)
    tables = reduce_ranks(store, run_id, len(by_rank), skip_steps=skip_steps, step_kind=step_kind)
    if tables.ranks.height == 0:
        what = f" of kind {step_kind!r}" if step_kind is not None else ""
        raise UsageError(f"run {run_name!r}: no step{what} that every rank recorded"
                         + (f" from step {skip_steps} on" if skip_steps else ""))
    result = find_stragglers(tables.modules, tables.ranks, world=len(by_rank), left_out=left_out)
    from dataclasses import replace

    return replace(result, skipped=skip_steps)
