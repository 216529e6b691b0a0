"""``modtrace diff``: what got slower or changed between two runs, and which module to blame."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from modtrace.cli._options import db_option, format_option

if TYPE_CHECKING:
    import polars as pl

    from modtrace.store.engine import Store

PHASE_CHOICES = ("forward", "backward", "recompute")


def _split_ref(store: Store, ref: str) -> tuple[Any, int | None]:
    """RUN or RUN:RANK -> (run, rank or None); a run whose name contains ':' still resolves whole."""
    from modtrace.errors import RunNotFound
    from modtrace.store.runs import resolve_run

    try:
        return resolve_run(store, ref), None
    except RunNotFound:
        head, sep, tail = ref.rpartition(":")
        if not sep or not head or not tail.isdigit():
            raise
    return resolve_run(store, head), int(tail)


def _load(db: str | None, ref: str, rank: int | None) -> tuple[pl.DataFrame, dict[str, Any]]:
    """Open DB, resolve RUN[:RANK] and return its spans (one rank's when asked) and its description."""
    import polars as pl

    from modtrace.errors import UsageError
    from modtrace.store.engine import open_store

    store = open_store(db)
    try:
        run, ref_rank = _split_ref(store, ref)
        if ref_rank is not None:
            rank = ref_rank
        spans = _spans(store, run.id)
        label = store.label
    finally:
        store.dispose()
    if spans.height == 0:
        raise UsageError(f"run {run.name!r} has no module calls to compare")
    if rank is not None:
        ranks = sorted(spans["rank"].unique().to_list())
        if rank not in ranks:
            raise UsageError(f"run {run.name!r} has no rank {rank} (ranks: {', '.join(map(str, ranks))})")
        spans = spans.filter(pl.col("rank") == rank)
    return spans, {"run": run.name, "run_id": run.id, "db": label, "rank": rank}


def _spans(store: Store, run_id: int) -> pl.DataFrame:
    """The run's stored spans; rebuilt in memory (nothing written) for a run never analysed."""
    from modtrace.analysis.materialize import compute
    from modtrace.store.analysis_store import read_analysis

    stored = read_analysis(store, run_id)
    if stored is not None:
        return stored[0]
    return compute(store, run_id).spans


@click.command()
@click.argument("base", metavar="BASE")
@click.argument("cand", metavar="CAND")
@db_option
@click.option("--cand-db", metavar="DB", default=None, help="Database of CAND when it is not BASE's.")
@click.option("--phase", "phases", multiple=True, type=click.Choice(PHASE_CHOICES),
              help="Compare only this phase (repeatable; default: all).")
@click.option("--rank", type=click.IntRange(min=0), default=None,
              help="Restrict both runs to this rank (RUN:RANK sets one side's rank).")
@click.option("--threshold", "threshold_pct", type=click.FloatRange(min=0), default=10.0, show_default=True,
              metavar="PCT", help="Smallest relative change of median self time that counts, in percent.")
@click.option("--min-delta-us", type=click.FloatRange(min=0), default=20.0, show_default=True, metavar="N",
              help="Smallest absolute change of median self time per step that counts, in microseconds.")
@click.option("--alpha", type=click.FloatRange(min=0, max=1, min_open=True, max_open=True), default=0.01,
              show_default=True, help="Significance level of the Mann-Whitney test over steps.")
@click.option("--skip-steps", type=click.IntRange(min=0), default=1, show_default=True, metavar="N",
              help="Leave out the first N steps of each rank (warm-up).")
@format_option("table", "json", "csv", "markdown")
@click.option("--fail-on", type=click.Choice(("regression", "structure", "any", "never")), default="regression",
              show_default=True, help="Which findings make the exit status 1.")
@click.option("--all", "show_all", is_flag=True, help="Also list unchanged modules (table and markdown).")
def diff(
    base: str, cand: str, db: str | None, cand_db: str | None, phases: tuple[str, ...], rank: int | None,
    threshold_pct: float, min_delta_us: float, alpha: float, skip_steps: int, fmt: str, fail_on: str,
    show_all: bool,
) -> None:
    """Compare run CAND against run BASE: structure changes and timing regressions per module.

    BASE and CAND are run references (name, id, @, @~N), optionally with
    :RANK to pick one rank, so `modtrace diff RUN:0 RUN:1` compares two ranks
    of one run (stragglers). A module is blamed when its own self time per
    step got slower by more than --threshold percent and --min-delta-us, and
    a Mann-Whitney test over the steps gives p < --alpha. Exit status: 0
    clean, 1 findings (per --fail-on), 2 usage error.
    """
    from modtrace.analysis.diff import DiffOptions, diff_spans
    from modtrace.errors import UsageError
    from modtrace.renderers.diff import document, get_diff_renderer

    options = DiffOptions(
        threshold=threshold_pct / 100.0,
        min_delta_ns=int(round(min_delta_us * 1000)),
        alpha=alpha,
        skip_steps=skip_steps,
        phases=tuple(p for p in PHASE_CHOICES if p in phases) if phases else None,
    )
    base_spans, base_info = _load(db, base, rank)
    cand_spans, cand_info = _load(cand_db if cand_db is not None else db, cand, rank)
    result = diff_spans(base_spans, cand_spans, options)
    for side, info in (("base_steps", base_info), ("cand_steps", cand_info)):
        if not result.summary[side]:
            raise UsageError(
                f"run {info['run']!r} has no steps left to compare after skipping {skip_steps} "
                "(use --skip-steps 0)"
            )
    doc = document(result, base_info, cand_info, options, fail_on)
    click.echo(get_diff_renderer(fmt).render(doc, show_all=show_all), nl=False)
    if doc["summary"]["failed"]:
        raise click.exceptions.Exit(1)
