"""Reads for ``modtrace memory`` (``api._memory``) beyond ``store.memory``'s: the run's counted
ranges, every rank's, in order."""

from __future__ import annotations

from modtrace.store.base import Store
from modtrace.store.cursor import driver_cursor, mark


def counted_ranges(store: Store, run_id: int) -> list[tuple[int, int, int]]:
    """(rank, first_seq, last_seq) of the run's counted ranges, by rank and first_seq."""
    with driver_cursor(store) as cur:
        cur.execute(f"SELECT rank, first_seq, last_seq FROM counted_ranges WHERE run_id = {mark(store)} "
                    "ORDER BY rank, first_seq", (run_id,))
        return [(int(a), int(b), int(c)) for a, b, c in cur.fetchall()]
