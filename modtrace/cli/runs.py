"""``modtrace runs`` and ``modtrace show``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, TypeVar

import click

from modtrace.cli._options import db_option, format_option, stdout_terminal
from modtrace.cli._steps import rule_label

F = TypeVar("F", bound=Callable[..., Any])

# Statuses as runs shows them (core.contracts.RUN_STATUSES and incomplete); kept here so that
# the options build without importing more than click.
SHOWN_STATUSES = ("running", "completed", "failed", "interrupted", "incomplete")


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f}s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{int(minutes)}m{int(sec):02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{int(hours)}h{int(minutes):02d}m"


# What each runs.analysis state short of stored means (docs/schema.md).
_ANALYSIS_HINT = {
    "none": "not analysed yet",
    "partial": "only some ranks are analysed",
    "stale": "analysed before the recording ended",
}


def _tag_text(tags: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(tags.items()))


def tag_option(help: str) -> Callable[[F], F]:  # noqa: A002 -- click's own name for it
    def deco(fn: F) -> F:
        return click.option("--tag", "tags", multiple=True, metavar="KEY=VALUE", help=help)(fn)

    return deco


def status_option(help: str) -> Callable[[F], F]:  # noqa: A002
    def deco(fn: F) -> F:
        return click.option("--status", type=click.Choice(SHOWN_STATUSES), default=None, help=help)(fn)

    return deco


@click.command()
@db_option
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Show at most this many runs.")
@tag_option("Only runs with this tag (repeatable: every one must match).")
@status_option("Only runs of this status.")
@format_option("table", "json", "csv")
def runs(db: str | None, limit: int | None, tags: tuple[str, ...], status: str | None, fmt: str) -> None:
    """List recorded runs, newest first."""
    import modtrace.api
    from modtrace.api._cli import run_filter, run_list
    from modtrace.renderers import Table, get_renderer

    which = run_filter(tags, status)
    with modtrace.api.open(db) as database:
        rows = run_list(database, limit, which)
    for r in rows:
        r["step_on"] = rule_label(r["step_on"], r.pop("step_rule"))
        if r.get("recorded_steps") is not None:  # a schedule: which of the steps are stored
            r["steps_shown"] = f"{r['steps']} (recorded {r['recorded_steps']})"
    columns = ["id", "name", "status", "started", "duration", "events", "steps", "step_on", "ranks", "analysis", "tags"]
    if fmt == "table":
        out = [
            [r["id"], r["name"], r["status"], r["started_at"], _duration(r["duration_s"]), r["events"],
             r.get("steps_shown", r["steps"]),
             r["step_on"], r["ranks"], r["analysis"], _tag_text(r["tags"])]
            for r in rows
        ]
        if not out:
            click.echo(f"no runs in {database.label}" if which.empty else f"no runs with {which.describe()} in {database.label}")
            return
    else:
        columns = ["id", "name", "status", "started_at", "ended_at", "duration_s", "events", "steps", "step_on", "ranks",
                   "analysis", "tags"]
        out = [[r[c] if c != "tags" or fmt == "json" else _tag_text(r[c]) for c in columns] for r in rows]
    table = Table(columns, out, droppable=_NARROW_DROPS if fmt == "table" else ())
    click.echo(get_renderer("rows", fmt, terminal=stdout_terminal()).render(table), nl=False)


# What a terminal too narrow for the runs table goes without, first to last: id, name, status
# and steps say which run is which and how it ended; the rest is in `modtrace show RUN`.
_NARROW_DROPS = ("step_on", "ranks", "analysis", "events", "tags", "duration", "started")


@click.command()
@click.argument("refs", metavar="[RUN]...", nargs=-1)
@db_option
@click.option("--older-than", metavar="AGE", default=None,
              help="Runs started longer ago than AGE (30d, 12h, 2w, 90m), with --tag and --status as filters.")
@tag_option("Only runs with this tag (repeatable: every one must match).")
@status_option("Only runs of this status.")
@click.option("-y", "--yes", is_flag=True, help="Delete without asking (needed when stdin is not a terminal).")
@click.option("--force", is_flag=True, help="Also delete a run that is still recording.")
def delete(refs: tuple[str, ...], db: str | None, older_than: str | None, tags: tuple[str, ...], status: str | None,
           yes: bool, force: bool) -> None:
    """Delete runs with every row that belongs to them, in one transaction.

    RUN... names the runs (name, id, @, @~N); or select them with --older-than,
    --tag and --status (every condition must hold), e.g. `modtrace delete
    --older-than 30d --tag branch=main --yes` for retention. Asks first on a
    terminal; elsewhere --yes is required. A run still recording is refused
    unless --force.
    """
    import sys

    import modtrace.api
    from modtrace.api._cli import run_filter, run_list
    from modtrace.core.errors import UsageError

    which = run_filter(tags, status, older_than)
    if refs and not which.empty:
        raise UsageError("give runs (RUN...) or filters (--older-than, --tag, --status), not both")
    if not refs and which.empty:
        raise UsageError("name the runs to delete (RUN...) or select them with --older-than, --tag or --status")
    with modtrace.api.open(db) as database:
        if refs:
            chosen = [database.run(ref) for ref in refs]
            picked = [(r.id, r.name, str(r.details.get("status"))) for r in chosen]
        else:
            picked = [(int(r["id"]), str(r["name"]), str(r["status"])) for r in run_list(database, None, which)]
        picked = list({p[0]: p for p in picked}.values())
        if not picked:
            click.echo(f"modtrace: no run matches {which.describe()} in {database.label}; nothing deleted", err=True)
            return
        listing = ", ".join(f"{name!r} (id {rid}, {st})" for rid, name, st in picked)
        if not yes:
            if not sys.stdin.isatty():
                raise UsageError(f"deleting {_count(len(picked), 'run')} needs --yes when stdin is not a terminal")
            click.echo(f"about to delete {_count(len(picked), 'run')} from {database.label}: {listing}", err=True)
            if not click.confirm("delete them, with every row they have?", default=False, err=True):
                click.echo("modtrace: nothing deleted", err=True)
                raise click.exceptions.Exit(1)
        deleted = database.delete([f"id:{rid}" for rid, _, _ in picked], force=force)
    for run in deleted:
        counted = sorted(((n, t) for t, n in run.rows.items() if n and t != "runs"), key=lambda x: (-x[0], x[1]))
        detail = ", ".join(f"{n:,} {table}" for n, table in counted)
        click.echo(f"deleted run {run.name!r} (id {run.id}, {run.status}): {run.total:,} rows"
                   + (f" ({detail})" if detail else ""))


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


@click.command()
@click.argument("run")
@db_option
@format_option("table", "json")
def show(run: str, db: str | None, fmt: str) -> None:
    """Show RUN's metadata, status and counts.

    RUN is a run name, a numeric id, @ (the newest run) or @~N.
    """
    import modtrace.api
    from modtrace.api._cli import details
    from modtrace.renderers import Table, get_renderer
    from modtrace.renderers.notes import compiled_note

    with modtrace.api.open(db) as database:
        info = details(database, run)
    if fmt == "json":
        click.echo(json.dumps(info, indent=2, default=str))
        return
    if info.get("analysis") not in (None, "stored"):
        state = info["analysis"]
        info["analysis"] = f"{state} ({_ANALYSIS_HINT.get(state, 'not stored')}; `modtrace analyze` stores it)"
    rows = [[k, json.dumps(v) if isinstance(v, (dict, list)) else v] for k, v in info.items()]
    click.echo(get_renderer("rows", "table", terminal=stdout_terminal()).render(Table(["field", "value"], rows)), nl=False)
    note = compiled_note(info)
    if note:
        click.echo(f"note: {note}")
