"""Alembic environment for modtrace.

modtrace drives Alembic from code (``modtrace.store.migrate``) and hands over
an open connection; running ``alembic`` by hand with ``-x db=URL`` works too.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from modtrace.store.schema import metadata

config = context.config


def run_migrations() -> None:
    connection = config.attributes.get("connection")
    if connection is None:
        url = context.get_x_argument(as_dictionary=True).get("db")
        if not url:
            raise SystemExit("pass -x db=URL, or use `modtrace db upgrade`")
        engine = create_engine(url)
        with engine.begin() as conn:
            _configure_and_run(conn)
        return
    _configure_and_run(connection)


def _configure_and_run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations()
