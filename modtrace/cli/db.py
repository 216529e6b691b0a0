"""``modtrace db``: schema upgrade, current revision, check."""

from __future__ import annotations

import click

from modtrace.cli._options import db_option


@click.group()
def db() -> None:
    """Manage the database schema."""


@db.command()
@db_option
def upgrade(db: str | None) -> None:
    """Create the database, or upgrade its schema to this modtrace's head."""
    from modtrace.store.engine import open_store
    from modtrace.store.migrate import upgrade as do_upgrade

    store = open_store(db, create=True, check=False)
    try:
        before, after = do_upgrade(store)
    finally:
        store.dispose()
    if store.created:
        click.echo(f"{store.label}: created at {after}")
    elif before == after:
        click.echo(f"{store.label}: already at head ({after})")
    else:
        click.echo(f"{store.label}: upgraded {before or 'empty'} -> {after}")


@db.command()
@db_option
def current(db: str | None) -> None:
    """Print the database's schema revision and this modtrace's head."""
    from modtrace.store.engine import open_store, read_revision
    from modtrace.store.schema import HEAD, REVISIONS

    store = open_store(db, check=False)
    try:
        rev, _ = read_revision(store.engine)
    finally:
        store.dispose()
    if rev == HEAD:
        state = "head"
    elif rev in REVISIONS:
        state = "behind head; run `modtrace db upgrade`"
    else:
        state = "newer than this modtrace; upgrade modtrace"
    click.echo(f"{rev} ({state}; this modtrace's head is {HEAD})")


@db.command()
@db_option
def check(db: str | None) -> None:
    """Exit 0 when the database is at head; otherwise say what to do and exit 1."""
    from modtrace.store.engine import open_store

    store = open_store(db)
    store.dispose()
    click.echo(f"{store.label}: schema is at head")
