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
    import modtrace.api

    done = modtrace.api.upgrade(db)
    if done.created:
        click.echo(f"{done.label}: created at {done.after}")
    elif done.before == done.after:
        click.echo(f"{done.label}: already at head ({done.after})")
    else:
        click.echo(f"{done.label}: upgraded {done.before or 'empty'} -> {done.after}")


@db.command()
@db_option
def current(db: str | None) -> None:
    """Print the database's schema revision and this modtrace's head."""
    import modtrace.api

    found = modtrace.api.current_revision(db)
    state = {
        "head": "head",
        "behind": "behind head; run `modtrace db upgrade`",
        "newer": "newer than this modtrace; upgrade modtrace",
    }[found.state]
    click.echo(f"{found.revision} ({state}; this modtrace's head is {found.head})")


@db.command()
@db_option
def check(db: str | None) -> None:
    """Exit 0 when the database is at head; otherwise say what to do and exit 1."""
    import modtrace.api

    click.echo(f"{modtrace.api.check_schema(db)}: schema is at head")
