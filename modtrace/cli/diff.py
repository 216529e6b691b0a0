"""``modtrace diff``: what got slower or changed between two runs, and which module to blame."""

from __future__ import annotations

import contextlib

import click

from modtrace.cli._options import (
    clock_option,
    db_option,
    format_option,
    rank_option,
    stdout_terminal,
)
from modtrace.cli._steps import step_kind_option, step_on_option
from modtrace.core.contracts import PHASES


@click.command()
@click.argument("refs", metavar="BASE... CAND", nargs=-1)
@db_option
@click.option("--cand-db", metavar="DB", default=None, help="Database of CAND when it is not BASE's.")
@click.option("--phase", "phases", multiple=True, type=click.Choice(PHASES),
              help="Compare only this phase (repeatable; default: all).")
@rank_option("Restrict both runs to this rank (RUN:RANK sets one side's rank).")
@click.option("--threshold", "threshold_pct", type=click.FloatRange(min=0), default=10.0, show_default=True,
              metavar="PCT", help="How far a module's share of the step must lie beyond every base run's (with --absolute: its time beyond the base's), in percent.")
@click.option("--share-threshold", "share_threshold_pct", type=click.FloatRange(min=0), default=50.0,
              show_default=True, metavar="PCT",
              help="How much slower than the typical module of the step a module must get to be blamed, in percent.")
@click.option("--min-delta-us", type=click.FloatRange(min=0), default=20.0, show_default=True, metavar="N",
              help="Smallest change of a module's time per step (its 10th percentile) that counts, in microseconds.")
@click.option("--alpha", type=click.FloatRange(min=0, max=1, min_open=True, max_open=True), default=0.01,
              show_default=True, help="Significance level of the Mann-Whitney test over steps.")
@click.option("--skip-steps", type=click.IntRange(min=0), default=1, show_default=True, metavar="N",
              help="Leave out the first N steps of each rank (warm-up).")
@click.option("--absolute", is_flag=True,
              help="Judge absolute times only: do not also require a module's share of the step to change "
                   "(for runs recorded on an equally quiet machine).")
@step_on_option
@step_kind_option("the kind most steps of both runs share, when they have more than one")
@clock_option
@format_option("table", "json", "csv", "markdown")
@click.option("--fail-on", type=click.Choice(("regression", "structure", "counters", "any", "never")),
              default="regression", show_default=True,
              help="Which findings make the exit status 1 (counters: a module's FLOPs, bytes or ops on a "
                   "counted step of the same kind differ; any: every kind of finding).")
@click.option("--all", "show_all", is_flag=True, help="Also list unchanged modules (table and markdown).")
@click.option("--window", type=click.IntRange(min=1), default=10, show_default=True, metavar="N",
              help="With tag:KEY=VALUE as BASE: how many of the newest matching runs form the history.")
def diff(
    refs: tuple[str, ...], db: str | None, cand_db: str | None, phases: tuple[str, ...], rank: int | None,
    threshold_pct: float, share_threshold_pct: float, min_delta_us: float, alpha: float, skip_steps: int, absolute: bool,
    step_on: str | None, step_kind: str | None, clock: str | None, fmt: str, fail_on: str, show_all: bool,
    window: int,
) -> None:
    """Compare run CAND against run BASE, or against a history of baseline runs: structure
    changes and timing regressions per module.

    BASE and CAND are run references (name, id, @, @~N), optionally with
    :RANK to pick one rank, so `modtrace diff RUN:0 RUN:1` compares two ranks
    of one run (stragglers). A module's time in a run is the 10th percentile
    of its self time per step (load only adds time). It is blamed when that
    grew by more than --min-delta-us, its share of the step grew by more
    than --threshold percent beyond the base's, and by more than
    --share-threshold percent beyond the typical module's (so a machine that
    got busier between the runs blames nobody), and, against one base run,
    its median self time per step grew by more than --threshold percent too. Steps follow --step-on; when the runs' steps come in several kinds
    (a generate() loop's prompt and its decode steps), steps of one kind are
    compared (--step-kind). Both runs are read on one --clock: device time
    by default when both have it, else host time.

    A history as the base: `modtrace diff 'tag:branch=main' CAND` takes the
    newest --window completed runs whose tags match (several tag:KEY=VALUE
    terms are AND-ed; CAND is left out), or list the runs: `modtrace diff
    B1 B2 B3 CAND`. What varies between the base runs is noise: a module's
    share must lie beyond every base run's, and the step time's 10th
    percentile beyond the history's range by the range's own width and
    --threshold (significantly) is a step-wide regression. Exit status: 0
    clean, 1 findings (per --fail-on), 2 usage error.
    """
    import modtrace.api
    from modtrace.api import DiffOptions
    from modtrace.core.errors import UsageError
    from modtrace.renderers import get_renderer
    from modtrace.renderers.diff import DiffView
    from modtrace.renderers.diff_document import document

    if len(refs) < 2:
        raise UsageError("give the base (a run, several runs, or tag:KEY=VALUE) and then the candidate run: "
                         "modtrace diff BASE... CAND")
    *bases, cand = refs
    options = DiffOptions(
        threshold=threshold_pct / 100.0,
        min_delta_ns=int(round(min_delta_us * 1000)),
        alpha=alpha,
        skip_steps=skip_steps,
        absolute=absolute,
        share_threshold=share_threshold_pct / 100.0,
        phases=tuple(p for p in PHASES if p in phases) if phases else None,
    )
    with contextlib.ExitStack() as opened:
        database = opened.enter_context(modtrace.api.open(db))
        other = opened.enter_context(modtrace.api.open(cand_db)) if cand_db is not None else None
        result = database.diff(bases[0] if len(bases) == 1 else bases, cand, options, cand_db=other, rank=rank,
                               step_on=step_on, step_kind=step_kind, clock=clock, window=window)
    for note in result.notes:
        click.echo(f"modtrace: note: {note}", err=True)
    assert result.sides is not None
    base_info, cand_info = result.sides
    for side, info in (("base_steps", base_info), ("cand_steps", cand_info)):
        if not result.summary[side]:
            raise UsageError(
                f"run {info['run']!r} has no steps left to compare after skipping {skip_steps} "
                "(use --skip-steps 0)"
            )
    doc = document(result, base_info, cand_info, options, fail_on)
    click.echo(get_renderer("diff", fmt, terminal=stdout_terminal()).render(DiffView(doc, show_all)), nl=False)
    code = result.exit_code(fail_on)
    if code:
        raise click.exceptions.Exit(code)
