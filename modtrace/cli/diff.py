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
              metavar="PCT", help="Every margin below left unset, in percent (a shorthand).")
@click.option("--share-margin", "share_margin_pct", type=click.FloatRange(min=0), default=None, metavar="PCT",
              help="Check share_ratio: how far a module's share of the step must lie beyond every base run's.")
@click.option("--share-threshold", "share_threshold_pct", type=click.FloatRange(min=0), default=50.0,
              show_default=True, metavar="PCT",
              help="Check vs_typical: how much more of the step than the typical module's a module must take.")
@click.option("--median-margin", "median_margin_pct", type=click.FloatRange(min=0), default=None, metavar="PCT",
              help="Check median_ratio: how far a module's median self time per step must move.")
@click.option("--level-margin", "level_margin_pct", type=click.FloatRange(min=0), default=None, metavar="PCT",
              help="Check level_ratio (--absolute): how far a module's level must move.")
@click.option("--step-margin", "step_margin_pct", type=click.FloatRange(min=0), default=None, metavar="PCT",
              help="Check beyond_history: how far beyond the base runs' range the step's level must lie.")
@click.option("--confirm-margin", "confirm_margin_pct", type=click.FloatRange(min=0), default=None, metavar="PCT",
              help="Check confirmed: how far the other CPU measure of the step must move the same way.")
@click.option("--min-delta-us", type=click.FloatRange(min=0), default=20.0, show_default=True, metavar="N",
              help="Check level_delta_us: the smallest change of a module's level that counts, in "
                   "microseconds.")
@click.option("--level-pct", type=click.FloatRange(min=0, max=100, min_open=True), default=10.0, show_default=True,
              metavar="PCT", help="A module's level: this percentile of its time per step.")
@click.option("--alpha", type=click.FloatRange(min=0, max=1, min_open=True, max_open=True), default=0.01,
              show_default=True, help="Checks steps, step_p, p_holm: the significance level.")
@click.option("--skip-steps", type=click.IntRange(min=0), default=1, show_default=True, metavar="N",
              help="Leave out the first N steps of each rank (warm-up).")
@click.option("--absolute", is_flag=True,
              help="Judge absolute times: checks p_holm and level_ratio instead of the shares' (runs recorded on "
                   "an equally quiet machine).")
@step_on_option
@step_kind_option("the kind most steps of both runs share, when they have more than one")
@clock_option
@format_option("table", "json", "csv", "markdown")
@click.option("--fail-on", type=click.Choice(("regression", "structure", "counters", "any", "never")),
              default="regression", show_default=True,
              help="Which findings make the exit status 1 (counters: a module's FLOPs, bytes or ops on a "
                   "counted step of the same kind differ; any: every kind of finding).")
@click.option("--all", "show_all", is_flag=True, help="Also list unchanged modules (table and markdown).")
@click.option("--explain", "explain", multiple=True, metavar="FQN",
              help="List every check of this module, blamed or not (repeatable; table and markdown).")
@click.option("--window", type=click.IntRange(min=1), default=10, show_default=True, metavar="N",
              help="With tag:KEY=VALUE as BASE: how many of the newest matching runs form the history.")
def diff(
    refs: tuple[str, ...], db: str | None, cand_db: str | None, phases: tuple[str, ...], rank: int | None,
    threshold_pct: float, share_margin_pct: float | None, share_threshold_pct: float, median_margin_pct: float | None,
    level_margin_pct: float | None, step_margin_pct: float | None, confirm_margin_pct: float | None,
    min_delta_us: float, level_pct: float, alpha: float, skip_steps: int, absolute: bool,
    step_on: str | None, step_kind: str | None, clock: str | None, fmt: str, fail_on: str, show_all: bool,
    explain: tuple[str, ...], window: int,
) -> None:
    """Compare run CAND against run BASE, or against a history of baseline runs: structure
    changes and timing regressions per module.

    BASE and CAND are run references (name, id, @, @~N), optionally with
    :RANK to pick one rank (`modtrace diff RUN:0 RUN:1` compares two ranks).
    A history as the base: `modtrace diff 'tag:branch=main' CAND` takes the
    newest --window completed runs whose tags match (terms are AND-ed), or
    list the runs: `modtrace diff B1 B2 B3 CAND`.

    A module is blamed when every check of the rule passes; each verdict
    shows its checks, and --explain FQN shows a module's when it was not
    blamed. The rule, its checks and their options: docs/diff.md. Exit
    status: 0 clean, 1 findings (per --fail-on), 2 usage error.
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
    def pct(value: float | None) -> float | None:
        return None if value is None else value / 100.0

    options = DiffOptions(
        threshold=threshold_pct / 100.0,
        share_margin=pct(share_margin_pct),
        median_margin=pct(median_margin_pct),
        level_margin=pct(level_margin_pct),
        step_margin=pct(step_margin_pct),
        confirm_margin=pct(confirm_margin_pct),
        low_quantile=level_pct / 100.0,
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
        if not getattr(result.summary, side):
            raise UsageError(
                f"run {info['run']!r} has no steps left to compare after skipping {skip_steps} "
                "(use --skip-steps 0)"
            )
    doc = document(result, base_info, cand_info, options, fail_on)
    click.echo(get_renderer("diff", fmt, terminal=stdout_terminal()).render(DiffView(doc, show_all, explain)), nl=False)
    code = result.exit_code(fail_on)
    if code:
        raise click.exceptions.Exit(code)
