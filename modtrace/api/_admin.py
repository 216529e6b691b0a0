"""The database itself: schema revision, upgrade, and read-only SQL queries."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from modtrace.store.query import Query, Result


@dataclass(frozen=True)
class Upgraded:
    """What ``upgrade`` did: the database, whether it was created, the revisions before and after."""

    label: str
    created: bool
    before: str | None
    after: str


@dataclass(frozen=True)
class Revision:
    """The database's schema revision against this modtrace's head."""

    revision: str | None
    head: str
    state: str  # head | behind | newer


def upgrade(db: str | None = None) -> Upgraded:
    """Create the database, or upgrade its schema to this modtrace's head."""
    from modtrace.store.engine import open_store
    from modtrace.store.migrate import upgrade as do_upgrade

    store = open_store(db, create=True, check=False)
    try:
        before, after = do_upgrade(store)
    finally:
        store.dispose()
    return Upgraded(store.label, store.created, before, after)


def current_revision(db: str | None = None) -> Revision:
    """The database's schema revision (the database is not changed)."""
    from modtrace.store.engine import open_store, read_revision
    from modtrace.store.schema import HEAD, REVISIONS

    store = open_store(db, check=False)
    try:
        rev, _ = read_revision(store.engine)
    finally:
        store.dispose()
    state = "head" if rev == HEAD else "behind" if rev in REVISIONS else "newer"
    return Revision(rev, HEAD, state)


def check_schema(db: str | None = None) -> str:
    """The database's label when its schema is at head; raises ``StoreError`` otherwise."""
    from modtrace.store.engine import open_store

    store = open_store(db)
    store.dispose()
    return store.label


def query_library() -> list[Query]:
    """The queries shipped in ``queries/``, with their purpose and parameters."""
    from modtrace.store.query import library

    return library()


def resolve_query(arg: str) -> Query:
    """A library query NAME, a .sql PATH or the text of one statement -> the query."""
    from modtrace.store.query import resolve_query as resolve

    return resolve(arg)


def query(db: str | None, sql: str | Query, params: Mapping[str, str] | None = None) -> Result:
    """Run a read-only query (a ``Query`` or anything ``resolve_query`` takes) on ``db``;
    ``params`` are strings as from the command line (run parameters take run references)."""
    from modtrace.store.query import run_query

    chosen = resolve_query(sql) if isinstance(sql, str) else sql
    return run_query(db, chosen, params or {})
