"""Options shared by several commands, as reusable decorators."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def db_option(fn: F) -> F:
    return click.option(
        "--db",
        metavar="DB",
        default=None,
        help="Database file or SQLAlchemy URL (default: $MODTRACE_DB, else ./modtrace.db).",
    )(fn)


def format_option(*choices: str, default: str = "table") -> Callable[[F], F]:
    def deco(fn: F) -> F:
        return click.option(
            "--format",
            "fmt",
            type=click.Choice(choices),
            default=default,
            show_default=True,
            help="Output format.",
        )(fn)

    return deco
