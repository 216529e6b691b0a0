"""The PostgreSQL test server, defined once: its URL, and a fresh schema per use.

Under ``CI=true`` a missing or unreachable server fails the test that needs it;
elsewhere it skips, so a laptop without PostgreSQL still runs the SQLite suite.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import pytest

PG_URL = os.environ.get("MODTRACE_TEST_PG_URL")


def unavailable(why: str) -> NoReturn:
    """Fail under CI (PostgreSQL tests must run there), skip elsewhere."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why} under CI; PostgreSQL tests must run")
    pytest.skip(why)


def server_url() -> str:
    if not PG_URL:
        unavailable("MODTRACE_TEST_PG_URL is not set")
    return PG_URL


def schema_url(base: str, schema: str) -> str:
    """``base`` with ``schema`` as the connection's search path."""
    return f"{base}{'&' if '?' in base else '?'}options=-csearch_path%3D{schema}"


@contextmanager
def fresh_schema() -> Iterator[str]:
    """A URL for a new, empty schema on the test server, dropped afterwards."""
    import sqlalchemy as sa

    base = server_url()
    schema = f"mt_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base, poolclass=sa.pool.NullPool)
    try:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'CREATE SCHEMA "{schema}"')
    except sa.exc.OperationalError as exc:
        admin.dispose()
        unavailable(f"PostgreSQL at {base} is unreachable ({exc.orig})")
    try:
        yield schema_url(base, schema)
    finally:
        with admin.begin() as conn:
            conn.exec_driver_sql(f'DROP SCHEMA "{schema}" CASCADE')
        admin.dispose()
