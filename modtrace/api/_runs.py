"""A run as the API names it (``Run``, ``RunLike``), and which runs ``Database.runs``, ``modtrace
runs`` and ``modtrace gc`` take: their filter, parsed from what a caller or the command line
gives."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from modtrace.store.runs import RunFilter


@dataclass(frozen=True)
class Run:
    """A resolved run: its id and name, and (from ``Database.run``) what ``modtrace show`` prints
    of it in ``details``: status, times, counts, steps under its own rule, tags, ranks."""

    id: int
    name: str
    details: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)


RunLike = str | int | Run


def run_filter(tags: Mapping[str, str] | Sequence[str] | None = None, status: str | None = None,
               older_than: timedelta | str | None = None) -> RunFilter:
    """The runs to take: ``tags`` a mapping or ``KEY=VALUE`` texts, ``older_than`` a timedelta or
    text (``30d``); malformed ones are usage errors."""
    from modtrace.core.contracts import RUN_STATUSES
    from modtrace.core.errors import UsageError
    from modtrace.store.runs import RunFilter, parse_age, parse_tags

    if status is not None and status not in (*RUN_STATUSES, "incomplete"):
        raise UsageError(f"status {status!r}: one of {', '.join((*RUN_STATUSES, 'incomplete'))}")
    chosen = {str(k): str(v) for k, v in tags.items()} if isinstance(tags, Mapping) else parse_tags(tags or ())
    age = parse_age(older_than) if isinstance(older_than, str) else older_than
    return RunFilter(chosen or None, status, age)
