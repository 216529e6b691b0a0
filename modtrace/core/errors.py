"""Errors modtrace reports to users as one line.

Every error a user can cause (bad input, a database we will not touch, an
unknown run) is a ``ModtraceError``: the CLI prints its message on one line
and exits with its ``exit_code`` (2 for usage errors, 1 for failures).
"""

from __future__ import annotations

from modtrace.core.secrets import mask


class ModtraceError(Exception):
    """A failure to report as one line, without a traceback.

    The message speaks of the Python API (its parameters: ``step_on='root'``); ``cli``, when
    given, is the same error in the command line's words (its options: ``--step-on root``),
    which the CLI prints instead."""

    exit_code = 1

    def __init__(self, message: str = "", *, cli: str | None = None) -> None:
        super().__init__(message)
        self.cli = cli


class UsageError(ModtraceError):
    """The command was given something it cannot use."""

    exit_code = 2


class StoreError(ModtraceError):
    """The database cannot be used as asked."""


class RunNotFound(UsageError):
    """A run reference matches no run."""


class RunNameTaken(UsageError):
    """A new run was given the name of a run that exists."""


class Terminated(BaseException):
    """Raised in the main thread when SIGTERM arrives during a recording."""


def one_line(exc: BaseException) -> str:
    """The first line of an exception's message (a database error's own
    message, not SQLAlchemy's wrapping), or its type's name; secrets masked."""
    text = str(getattr(exc, "orig", None) or exc).strip()
    return mask(text.splitlines()[0]) if text else type(exc).__name__
