"""``modtrace stragglers``: which rank and module held each step of a multi-rank run back."""

from __future__ import annotations

import click

from modtrace.cli._options import db_option, format_option, stdout_terminal


@click.command()
@click.argument("run")
@db_option
@click.option("--step-kind", default=None, metavar="KIND",
              help="Only the steps whose root call has this kind on every rank (e.g. input_ids=8x128).")
@click.option("--skip-steps", type=click.IntRange(min=0), default=0, show_default=True, metavar="N",
              help="Leave out the first N steps (warm-up).")
@format_option("table", "json", "csv", "markdown")
def stragglers(run: str, db: str | None, step_kind: str | None, skip_steps: int, fmt: str) -> None:
    """Per step of RUN (two ranks or more): the rank and module that held it back.

    The straggler of a step is the (rank, module, phase) whose own time exceeds
    the other ranks' median by the most, beyond their noise; a rank slower in
    most modules alike is named as a slow rank with its ratio.  Each step shows
    where the other ranks waited (outside every module, or in one) and the step
    time had the straggler run at the others' median (what_if).  Persistent
    stragglers are those named in half the steps or more.  The rule is in
    docs/ranks.md ("Stragglers").  Steps not every rank recorded are left out,
    and said.
    """
    import modtrace.api
    from modtrace.renderers import get_renderer

    with modtrace.api.open(db) as database:
        ref = database.run(run)
        found = database.stragglers(ref, step_kind=step_kind, skip_steps=skip_steps)
    model = {"run": ref.name, **found.to_dict()}
    terminal = stdout_terminal() if fmt == "table" else None
    click.echo(get_renderer("stragglers", fmt, terminal=terminal).render(model), nl=False)
