"""Reading a database's rows in a test: the one reader, for SQLite files and PostgreSQL alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.pool import NullPool


def db_rows(db: str | Path, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """``sql``'s rows from the database ``db`` names (a SQLite file's path or a URL), its
    ``:name`` placeholders bound from ``params``.

    Read through a plain SQLAlchemy engine, not modtrace's store, so that what a test
    asserts does not rest on the code it tests (nor on the schema revision being head).
    The statement's transaction is committed, so a test can also change the database
    with it (a statement that returns no rows gives ``[]``).
    """
    target = str(db)
    engine = sa.create_engine(target if "://" in target else f"sqlite:///{target}", poolclass=NullPool)
    try:
        with engine.begin() as conn:
            result = conn.execute(sa.text(sql), params)
            return [tuple(r) for r in result] if result.returns_rows else []
    finally:
        engine.dispose()
