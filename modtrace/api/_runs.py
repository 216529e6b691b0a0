"""Which runs ``Database.runs``, ``modtrace runs`` and ``modtrace gc`` take: their filter, parsed
from what a caller or the command line gives."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from modtrace.store.runs import RunFilter


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
