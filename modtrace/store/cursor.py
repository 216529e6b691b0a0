"""The store's driver cursors and bound-parameter mark, for reads that bypass SQLAlchemy's
statement layer (bulk rows, COPY).

Kept apart from ``store.reader`` (which builds polars frames) so that a read of a
few rows -- ``tree`` from a stored tree, whether a run has device times -- imports
no dataframe library.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from modtrace.store.base import Store


@contextmanager
def driver_cursor(store: Store, name: str | None = None) -> Iterator[Any]:
    """A DBAPI cursor of the store's driver, rolled back after; with ``name``,
    server-side on PostgreSQL so rows stream in chunks."""
    raw = store.engine.raw_connection()
    try:
        driver = raw.driver_connection
        assert driver is not None
        if name is not None and store.dialect == "postgresql":
            cur = driver.cursor(name=name)
        else:
            cur = driver.cursor()
        try:
            yield cur
        finally:
            cur.close()
            raw.rollback()
    finally:
        raw.close()


def mark(store: Store) -> str:
    """The driver's bound-parameter mark."""
    return "?" if store.engine.dialect.paramstyle == "qmark" else "%s"
