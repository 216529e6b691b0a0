"""Reads of what a run's steps can be made of: its step rule and its root calls.

``modtrace.analysis.steps`` decides the steps from these; this module only
reads them (plain rows, no analysis import).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, func, select

from modtrace.store.engine import Store
from modtrace.store.schema import events, root_calls, run_ranks, runs


@dataclass(frozen=True)
class StepBasis:
    """A run's (or some ranks') step rule as recorded, whether its recorded
    step counter ever advanced, and its root calls (rank, seq, thread_id, kind; the thread of a
    root call whose enter event is gone is None)."""

    step_on: str
    made_steps: bool
    roots: list[tuple[int, int, int | None, str | None]]


def read_step_basis(store: Store, run_id: int, ranks: Sequence[int] | None = None) -> StepBasis:
    with store.engine.connect() as conn:
        step_on = conn.execute(select(runs.c.step_on).where(runs.c.id == run_id)).scalar()
        counted = select(func.max(run_ranks.c.step_count)).where(run_ranks.c.run_id == run_id)
        rows = _root_rows(run_id)
        if ranks is not None:
            counted = counted.where(run_ranks.c.rank.in_(list(ranks)))
            rows = rows.where(root_calls.c.rank.in_(list(ranks)))
        made = conn.execute(counted).scalar()
        roots = _roots(conn.execute(rows.order_by(root_calls.c.rank, root_calls.c.seq)))
    return StepBasis(str(step_on or "optimizer"), bool(made), roots)


def _root_rows(run_id: int) -> Select[Any]:
    """The run's root calls as ``StepBasis.roots`` holds them: rank, seq, thread, kind.
    root_calls keeps no thread: its enter event has it (a key lookup per root call)."""
    return (select(root_calls.c.rank, root_calls.c.seq, events.c.thread_id, root_calls.c.kind)
            .select_from(root_calls.outerjoin(events, (events.c.run_id == root_calls.c.run_id)
                                              & (events.c.rank == root_calls.c.rank)
                                              & (events.c.seq == root_calls.c.seq)))
            .where(root_calls.c.run_id == run_id))


def _roots(rows: Iterable[Any]) -> list[tuple[int, int, int | None, str | None]]:
    return [(int(r), int(s), None if t is None else int(t), k) for r, s, t, k in rows]


def read_roots_between(store: Store, run_id: int, rank: int, after: int | None,
                       upto: int) -> list[tuple[int, int, int | None, str | None]]:
    """The rank's root calls with ``after < seq <= upto`` (``after`` None: from the first), in
    ``StepBasis.roots``' form, by seq: a rank's roots read part by part while it is recorded."""
    rows = _root_rows(run_id).where(root_calls.c.rank == rank, root_calls.c.seq <= upto)
    if after is not None:
        rows = rows.where(root_calls.c.seq > after)
    with store.engine.connect() as conn:
        return _roots(conn.execute(rows.order_by(root_calls.c.seq)))


def step_rule_so_far(store: Store, run_id: int, rank: int) -> tuple[str, bool]:
    """(the run's recorded step rule, whether the rank's step counter has advanced so far)."""
    with store.engine.connect() as conn:
        step_on = conn.execute(select(runs.c.step_on).where(runs.c.id == run_id)).scalar()
        made = conn.execute(select(run_ranks.c.step_count).where(run_ranks.c.run_id == run_id,
                                                                  run_ranks.c.rank == rank)).scalar()
    return str(step_on or "optimizer"), bool(made)


def root_call_counts(store: Store, run_ids: Sequence[int] | None = None) -> dict[tuple[int, int], int]:
    """Root calls per (run_id, rank)."""
    q = select(root_calls.c.run_id, root_calls.c.rank, func.count()).group_by(root_calls.c.run_id, root_calls.c.rank)
    if run_ids is not None:
        q = q.where(root_calls.c.run_id.in_(list(run_ids)))
    with store.engine.connect() as conn:
        return {(int(a), int(b)): int(n) for a, b, n in conn.execute(q)}
