"""Deleting runs: every row of every table keyed by run, in one transaction.

A history of baseline runs grows with every CI job; retention deletes the old
ones.  A run's rows live in every table of ``schema.metadata`` with a
``run_id`` column; they are deleted table by table (children first), not left
to ``ON DELETE CASCADE``: ``span_rows`` has no foreign key (a trigger deletes
them), and a connection that did not turn SQLite's foreign keys on would
cascade nothing.  Deleting each table's rows also counts them, which is what
the command prints.  A table added to the schema later is covered without
a change here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Connection, Table, delete, select, update

from modtrace.core.errors import RunNotFound, UsageError
from modtrace.store.engine import Store
from modtrace.store.runs import display_status
from modtrace.store.schema import metadata, run_ranks, runs


class RunInUse(UsageError):
    """A run still being recorded was asked to be deleted without ``force``."""


@dataclass(frozen=True)
class DeletedRun:
    """One deleted run: its id, name and status, and how many rows each table lost."""

    id: int
    name: str
    status: str
    rows: dict[str, int]

    @property
    def total(self) -> int:
        return sum(self.rows.values())


def run_tables() -> list[Table]:
    """Every table keyed by run, children before ``runs`` (the order to delete them in)."""
    keyed = [t for t in reversed(metadata.sorted_tables) if "run_id" in t.c]
    return [*keyed, runs]


def delete_runs(store: Store, run_ids: Sequence[int], *, force: bool = False) -> list[DeletedRun]:
    """Delete runs ``run_ids`` with all their rows, in one transaction: all or none.

    A run still recording (status running and a live process, see ``display_status``)
    is refused (``RunInUse``) unless ``force``; an id that is gone is ``RunNotFound``.
    """
    ids = sorted(set(int(i) for i in run_ids))
    if not ids:
        return []
    with store.engine.begin() as conn:
        _lock(conn, ids)
        found = {int(r[0]): (r[1], r[2]) for r in conn.execute(
            select(runs.c.id, runs.c.name, runs.c.status).where(runs.c.id.in_(ids)))}
        missing = [i for i in ids if i not in found]
        if missing:
            raise RunNotFound(f"no run with id {missing[0]} in {store.label} (deleted meanwhile?); nothing deleted")
        ranks: dict[int, list[tuple[str | None, int | None, str]]] = {}
        for run_id, host, pid, status in conn.execute(
            select(run_ranks.c.run_id, run_ranks.c.hostname, run_ranks.c.pid, run_ranks.c.status)
            .where(run_ranks.c.run_id.in_(ids))
        ):
            ranks.setdefault(int(run_id), []).append((host, pid, status))
        shown = {i: display_status(found[i][1], ranks.get(i, [])) for i in ids}
        live = [i for i in ids if shown[i] == "running"]
        if live and not force:
            names = ", ".join(f"{found[i][0]!r} (id {i})" for i in live)
            raise RunInUse(f"run {names} is still recording (status running, its process alive); "
                           "nothing deleted (force deletes it anyway)")
        tables = run_tables()
        out = []
        for run_id in ids:
            rows = {}
            for table in tables:
                key = table.c.id if table is runs else table.c.run_id
                rows[table.name] = int(conn.execute(delete(table).where(key == run_id)).rowcount or 0)
            out.append(DeletedRun(run_id, found[run_id][0], shown[run_id], rows))
    return out


def _lock(conn: Connection, ids: list[int]) -> None:
    """Hold the runs until the commit: no analysis may store rows for them meanwhile.

    PostgreSQL: the rows locked FOR UPDATE (an analysis holds FOR KEY SHARE while it writes,
    so one waits for the other).  SQLite: a write first, so this transaction holds the write
    lock before it reads (a read first could not become a write once another wrote).
    """
    if conn.dialect.name == "postgresql":
        conn.execute(select(runs.c.id).where(runs.c.id.in_(ids)).with_for_update())
    else:
        conn.execute(update(runs).where(runs.c.id.in_(ids)).values(status=runs.c.status))
