"""``modtrace runs`` and ``modtrace show``."""

from __future__ import annotations

import json

import click

from modtrace.cli._options import db_option, format_option, stdout_terminal
from modtrace.cli._steps import rule_label


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


@click.command()
@db_option
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Show at most this many runs.")
@format_option("table", "json", "csv")
def runs(db: str | None, limit: int | None, fmt: str) -> None:
    """List recorded runs, newest first."""
    import modtrace.api
    from modtrace.api._cli import run_list
    from modtrace.renderers import Table, get_renderer

    with modtrace.api.open(db) as database:
        rows = run_list(database, limit)
    for r in rows:
        r["step_on"] = rule_label(r["step_on"], r.pop("step_rule"))
        if r.get("recorded_steps") is not None:  # a schedule: which of the steps are stored
            r["steps_shown"] = f"{r['steps']} (recorded {r['recorded_steps']})"
    columns = ["id", "name", "status", "started", "duration", "events", "steps", "step_on", "ranks", "analysis"]
    if fmt == "table":
        out = [
            [r["id"], r["name"], r["status"], r["started_at"], _duration(r["duration_s"]), r["events"],
             r.get("steps_shown", r["steps"]),
             r["step_on"], r["ranks"], r["analysis"]]
            for r in rows
        ]
        if not out:
            click.echo(f"no runs in {database.label}")
            return
    else:
        columns = ["id", "name", "status", "started_at", "ended_at", "duration_s", "events", "steps", "step_on", "ranks",
                   "analysis"]
        out = [[r[c] for c in columns] for r in rows]
    click.echo(get_renderer("rows", fmt, terminal=stdout_terminal()).render(Table(columns, out)), nl=False)


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
    if info.get("compiled_modules"):
        click.echo(f"note: {', '.join(info['compiled_modules'])} ran compiled (torch.compile): the module calls inside"
                   " are not recorded; `modtrace record --eager` records them")
