"""``modtrace diff``: what got slower or changed between two runs, and which module to blame."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from modtrace.cli._options import db_option, format_option
from modtrace.cli._steps import step_kind_option, step_on_option

if TYPE_CHECKING:
    from modtrace.analysis.diff import RunCalls
    from modtrace.cli._steps import Stepped
    from modtrace.store.engine import Store
    from modtrace.store.samples import Window

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


def _load(db: str | None, ref: str, rank: int | None, step_on: str | None = None) -> tuple[RunCalls, dict[str, Any]]:
    """Open DB, resolve RUN[:RANK] and return its closed calls (one rank's when asked) and its description.

    The run's spans are fetched first, before this thread imports polars:
    the database works (without the GIL) while ``diff`` imports the rest.
    A run never analysed is analysed in memory, nothing written.
    """
    from modtrace.errors import UsageError
    from modtrace.store.engine import open_store
    from modtrace.store.samples import fetch_closed_calls

    store = open_store(db)
    try:
        run, ref_rank = _split_ref(store, ref)
        if ref_rank is not None:
            rank = ref_rank
        if rank is not None:
            ranks = _ranks(store, run.id)
            if rank not in ranks:
                raise UsageError(f"run {run.name!r} has no rank {rank} (ranks: {', '.join(map(str, ranks))})")
        fetched = fetch_closed_calls(store, run.id, rank=rank)
        calls = _calls(store, run.id, rank, fetched)
        stepped = _restep(store, run.id, run.name, calls, step_on, rank)
        label = store.label
    finally:
        store.dispose()
    if calls.calls.height == 0:
        raise UsageError(f"run {run.name!r} has no module calls to compare")
    return calls, {"run": run.name, "run_id": run.id, "db": label, "rank": rank, "_stepped": stepped}


def _restep(store: Store, run_id: int, name: str, calls: RunCalls, step_on: str | None,
            rank: int | None) -> Stepped:
    from modtrace.cli._steps import restep

    return restep(store, run_id, name, calls.calls, step_on, None if rank is None else [rank])


def _like_with_like(base: tuple[RunCalls, dict[str, Any]], cand: tuple[RunCalls, dict[str, Any]],
                    kind: str | None) -> tuple[RunCalls, RunCalls]:
    """Both runs' calls in steps of one kind (``cli._steps.like_with_like``); the runs'
    descriptions get their step rule and kinds."""
    from dataclasses import replace

    from modtrace.cli._steps import like_with_like

    sides = [(info["run"], info.pop("_stepped")) for _, info in (base, cand)]
    frames, chosen = like_with_like(sides, kind)
    for (_, info), (_, stepped) in zip((base, cand), sides, strict=True):
        info.update(stepped.describe(), step_kind=chosen)
    return replace(base[0], calls=frames[0]), replace(cand[0], calls=frames[1])


def _ranks(store: Store, run_id: int) -> list[int]:
    from modtrace.store.reader import read_ranks

    return read_ranks(store, run_id)


def _calls(store: Store, run_id: int, rank: int | None, fetched: list[Window]) -> RunCalls:
    """The run's closed calls from its fetched spans, or, for a run never analysed, from its events."""
    import polars as pl

    from modtrace.analysis.diff import RunCalls, calls_of_spans
    from modtrace.store.analysis_store import has_analysis
    from modtrace.store.reader import read_devices, read_modules
    from modtrace.store.samples import parse_closed_calls

    if fetched or has_analysis(store, run_id):
        ranks = None if rank is None else [rank]
        return RunCalls(
            parse_closed_calls(fetched),
            read_modules(store, run_id, ranks=ranks),
            read_devices(store, run_id, ranks=ranks),
        )
    from modtrace.analysis.materialize import compute

    spans = compute(store, run_id, rank=rank).spans
    return calls_of_spans(spans if rank is None else spans.filter(pl.col("rank") == rank))


def _load_both(
    base: tuple[str | None, str, int | None, str | None], cand: tuple[str | None, str, int | None, str | None]
) -> tuple[tuple[RunCalls, dict[str, Any]], tuple[RunCalls, dict[str, Any]]]:
    """Both runs, read side by side (the database driver releases the GIL while it steps), while
    this thread imports what the diff needs."""
    from concurrent.futures import ThreadPoolExecutor

    import modtrace.store.engine  # noqa: F401  (before the threads: they would import it at once)

    with ThreadPoolExecutor(max_workers=2) as pool:
        fb = pool.submit(_load, *base)
        fc = pool.submit(_load, *cand)
        import modtrace.analysis.diff  # noqa: F401
        import modtrace.renderers.diff  # noqa: F401
        import modtrace.renderers.diff_document  # noqa: F401
        import modtrace.store.analysis_store  # noqa: F401

        return fb.result(), fc.result()


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
@click.option("--absolute", is_flag=True,
              help="Judge absolute times only: do not also require a module's share of the step to change "
                   "(for runs recorded on an equally quiet machine).")
@step_on_option
@step_kind_option("the kind most steps of both runs share, when they have more than one")
@format_option("table", "json", "csv", "markdown")
@click.option("--fail-on", type=click.Choice(("regression", "structure", "any", "never")), default="regression",
              show_default=True, help="Which findings make the exit status 1.")
@click.option("--all", "show_all", is_flag=True, help="Also list unchanged modules (table and markdown).")
def diff(
    base: str, cand: str, db: str | None, cand_db: str | None, phases: tuple[str, ...], rank: int | None,
    threshold_pct: float, min_delta_us: float, alpha: float, skip_steps: int, absolute: bool,
    step_on: str | None, step_kind: str | None, fmt: str, fail_on: str, show_all: bool,
) -> None:
    """Compare run CAND against run BASE: structure changes and timing regressions per module.

    BASE and CAND are run references (name, id, @, @~N), optionally with
    :RANK to pick one rank, so `modtrace diff RUN:0 RUN:1` compares two ranks
    of one run (stragglers). A module is blamed when its own self time per
    step got slower by more than --threshold percent and --min-delta-us, its
    share of the step grew by more than --threshold percent relative to the
    rest of the step (so a machine that got busier between the runs blames
    nobody), and Mann-Whitney tests over the steps give p < --alpha for
    both. Steps follow --step-on; when the runs' steps come in several kinds
    (a generate() loop's prompt and its decode steps), steps of one kind are
    compared (--step-kind). Exit status: 0 clean, 1 findings (per
    --fail-on), 2 usage error.
    """
    from modtrace.analysis.diff import DiffOptions, diff_runs
    from modtrace.errors import UsageError
    from modtrace.renderers import get_renderer
    from modtrace.renderers.diff import DiffView
    from modtrace.renderers.diff_document import document

    options = DiffOptions(
        threshold=threshold_pct / 100.0,
        min_delta_ns=int(round(min_delta_us * 1000)),
        alpha=alpha,
        skip_steps=skip_steps,
        absolute=absolute,
        phases=tuple(p for p in PHASE_CHOICES if p in phases) if phases else None,
    )
    loaded_base, loaded_cand = _load_both(
        (db, base, rank, step_on), (cand_db if cand_db is not None else db, cand, rank, step_on)
    )
    base_calls, cand_calls = _like_with_like(loaded_base, loaded_cand, step_kind)
    base_info, cand_info = loaded_base[1], loaded_cand[1]
    result = diff_runs(base_calls, cand_calls, options)
    for side, info in (("base_steps", base_info), ("cand_steps", cand_info)):
        if not result.summary[side]:
            raise UsageError(
                f"run {info['run']!r} has no steps left to compare after skipping {skip_steps} "
                "(use --skip-steps 0)"
            )
    doc = document(result, base_info, cand_info, options, fail_on)
    click.echo(get_renderer("diff", fmt).render(DiffView(doc, show_all)), nl=False)
    code = result.exit_code(fail_on)
    if code:
        raise click.exceptions.Exit(code)
