"""The open-database handle and the schema version check.

Below both ``engine`` (which opens databases and, for a new one, runs the
migrations) and ``migrate`` (which runs them on a ``Store``), so that
neither imports the other at module level.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine, text

from modtrace.core.errors import StoreError
from modtrace.store.schema import HEAD, REVISIONS, VERSION_TABLE


class SchemaTooOld(StoreError):
    """The database's schema revision is older than this modtrace's head (upgrade it)."""


class SchemaTooNew(StoreError):
    """The database's schema revision is newer than this modtrace knows (upgrade modtrace)."""


@dataclass
class Store:
    """An open, version-checked database."""

    engine: Engine
    label: str  # what to call the database in messages (path, or URL without password)
    path: Path | None  # the SQLite file, when there is one
    created: bool = False  # this open created the schema

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @property
    def is_sqlite(self) -> bool:
        return self.dialect == "sqlite"

    def dispose(self) -> None:
        self.engine.dispose()


def read_revision(engine: Engine) -> tuple[str | None, bool]:
    """(alembic revision or None, whether the database has any other table)."""
    from sqlalchemy import inspect

    with engine.connect() as conn:
        names = set(inspect(conn).get_table_names())
        if VERSION_TABLE not in names:
            return None, bool(names)
        rev = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalar()
        return rev, True


def check_revision(rev: str | None, label: str) -> None:
    """Raise ``SchemaTooOld`` or ``SchemaTooNew`` unless ``rev`` is head."""
    if rev == HEAD:
        return
    if rev in REVISIONS:
        raise SchemaTooOld(
            f"{label} uses schema revision {rev}, older than this modtrace's {HEAD}; "
            f"run `modtrace db upgrade --db {label}`"
        )
    raise SchemaTooNew(
        f"{label} uses schema revision {rev}, newer than this modtrace knows (head {HEAD}); "
        "upgrade modtrace"
    )
