"""``modtrace analyze``, ``modtrace tree`` and ``modtrace check``.

``analyze`` writes a run's spans and nesting issues into the database.
``tree`` and ``check`` read them when stored and otherwise compute them on
the fly without writing: read commands never modify the database.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import click

from modtrace.cli._options import (
    clock_option,
    db_option,
    format_option,
    peak_option,
    rank_option,
    stdout_terminal,
)
from modtrace.cli._steps import step_kind_option, step_on_option
from modtrace.core.contracts import PHASES, SEVERITIES

if TYPE_CHECKING:
    import polars as pl


def _counts(issues: pl.DataFrame) -> str:
    n = {s: int((issues["severity"] == s).sum()) for s in SEVERITIES}
    return f"{n['error']} error(s), {n['warning']} warning(s), {n['info']} info"


# How a severity stands out on a terminal that takes colour (first column of check's rows).
_SEVERITY_STYLE = {"error": "bold red", "warning": "yellow"}


def _styles(rows: list[tuple[Any, ...]]) -> list[str | None]:
    return [_SEVERITY_STYLE.get(str(row[0])) for row in rows]


def _ended(details: Mapping[str, Any]) -> str:
    """`` (the run failed: ERROR)`` and the like for a run that did not complete: an empty
    table of a run that failed before its first module call must not read as a healthy one."""
    from modtrace.renderers.notes import ended_note

    note = ended_note(details)
    return "" if note is None else f" ({note})"


@click.command()
@click.argument("run")
@db_option
def analyze(run: str, db: str | None) -> None:
    """Rebuild RUN's spans and nesting issues and store them (idempotent).

    RUN is a run name, a numeric id, @ (the newest run) or @~N.
    """
    import modtrace.api

    with modtrace.api.open(db) as database:
        done = database.analyze(run)
    click.echo(
        f"run {done.run.name} (id {done.run.id}): {done.spans} spans, "
        f"{done.issues.height} nesting issue(s): {_counts(done.issues)}"
    )


def _step_arg(value: str) -> int | None:
    if value == "all":
        return None
    try:
        step = int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a step number or 'all'", param_hint="'--step'") from None
    if step < 0:
        raise click.BadParameter("steps count from 0", param_hint="'--step'")
    return step


@click.command()
@click.argument("run")
@db_option
@click.option("--phase", type=click.Choice([*PHASES, "all"]), default="all",
              show_default=True, help="Show only calls of this phase.")
@click.option("--step", "step_opt", default="all", show_default=True, metavar="N|all",
              help="Only this step (from 0), or all steps.")
@rank_option("Only this rank (default: all ranks).")
@click.option("--max-depth", type=click.IntRange(min=0), default=None, help="Hide nodes deeper than this (0 = roots).")
@click.option("--min-percent", type=click.FloatRange(min=0), default=None,
              help="Hide nodes below this percentage of step time.")
@click.option("--sort", "sort_by", type=click.Choice(["self", "incl", "calls"]), default=None,
              help="Order each node's children by total self time, inclusive time or calls, largest first "
                   "(default: the order they were first called in).")
@click.option("--top", type=click.IntRange(min=1), default=None, metavar="N",
              help="Only the N nodes with the most --sort measure (self time by default), under their ancestors.")
@click.option("--full-names", is_flag=True, help="Name each node by its full name, not its part below its parent.")
@step_on_option
@step_kind_option("all")
@clock_option
@peak_option
@format_option("table", "json")
def tree(run: str, db: str | None, phase: str, step_opt: str, rank: int | None, max_depth: int | None,
         min_percent: float | None, sort_by: str | None, top: int | None, full_names: bool, step_on: str | None,
         step_kind: str | None, clock: str | None, peak_tflops: float | None, fmt: str) -> None:
    """Show RUN's module call tree: calls, inclusive and self time, % of step.

    Times are per-step medians (over the steps a node ran in) and totals;
    % step is a node's total inclusive time over the summed step time (time in
    root module calls, every phase) of the selected steps.  Backward,
    recompute and backward_call calls (modules called by backward code, such
    as a custom autograd Function's backward) form their own subtrees.  Steps follow --step-on;
    --step-kind keeps the steps of one kind (e.g. the decode steps of a
    generate() loop).  Times are on --clock: device time by default when
    the run has it (CUDA), else host time.  The table names each node by
    its part below its parent (--full-names: by its full name, as JSON does).

    A run with work counters (record --counters) adds, per node: FLOPs/step
    (the median over its counted steps of its inclusive FLOPs summed over its
    calls in the step), GFLOP/s (FLOPs/step over incl/step) and FLOP/B
    (FLOPs per byte of its ops' tensors); --peak-tflops adds % peak.
    """
    import modtrace.api
    from modtrace.api._cli import tree_rows
    from modtrace.core.tree_rows import sort_nodes, top_nodes
    from modtrace.renderers import get_renderer
    from modtrace.renderers.tree import TreeView

    step = _step_arg(step_opt)
    with modtrace.api.open(db) as database:
        # The run's details (several queries) only for an empty answer's line: a stored tree
        # answers in a few milliseconds, less than reading them (docs/performance.md, "Analysis").
        rows: list[dict[str, Any]] = tree_rows(
            database, run, phase=None if phase == "all" else phase, step=step, rank=rank, max_depth=max_depth,
            min_percent=min_percent, step_on=step_on, step_kind=step_kind, clock=clock, peak_tflops=peak_tflops)
        ref = database.run(run) if fmt == "table" and not rows else None
    if top is not None:
        rows = top_nodes(rows, sort_by or "self", top)
    if sort_by is not None:
        rows = sort_nodes(rows, sort_by)
    if ref is not None:
        click.echo(f"run {ref.name}: no module calls to show{_ended(ref.details)}")
        return
    renderer = get_renderer("tree", fmt, terminal=stdout_terminal())
    click.echo(renderer.render(TreeView(rows, full_names=full_names)), nl=False)


@click.command()
@click.argument("run")
@db_option
@format_option("table", "json")
@click.option("--all", "show_all", is_flag=True, help="List every info issue instead of one line per kind, module and phase.")
@click.pass_context
def check(ctx: click.Context, run: str, db: str | None, fmt: str, show_all: bool) -> None:
    """List RUN's nesting issues; exit 1 when any is an error.

    Issues are calls whose events do not nest: a lost or repeated event, a
    crossed exit, a call never exited; and, as info, unusual but healthy
    closes (a forward that raised, an early-stopped recompute, a backward
    closed at the end of the graph task).  Errors and warnings are listed
    one by one; info issues one line per kind, module and phase, with how
    many times and the first step, unless --all.  The JSON lists every issue.
    """
    import polars as pl

    import modtrace.api
    from modtrace.renderers import Table, get_renderer

    with modtrace.api.open(db) as database:
        ref = database.run(run)
        issues = database.issues(ref)
        summary = database.issues(ref, summary=True) if fmt == "table" and not show_all else None
    columns = ["severity", "kind", "rank", "seq", "step", "phase", "fqn", "message"]
    if fmt == "json":
        out = issues.with_columns(pl.col("phase").cast(pl.String)).select(columns).rows()
        click.echo(get_renderer("rows", "json").render(Table(columns, out)), nl=False)
    elif issues.height == 0:
        click.echo(f"run {ref.name}: no nesting issues{_ended(ref.details)}")
    elif show_all:
        out = issues.select("severity", "kind", "rank", "seq", "message").rows()
        table = Table(["severity", "kind", "rank", "seq", "message"], out, row_styles=_styles(out))
        click.echo(get_renderer("rows", "table", terminal=stdout_terminal()).render(table), nl=False)
        click.echo(f"run {ref.name}: {_counts(issues)}")
    else:
        assert summary is not None
        out = summary.select("severity", "kind", "rank", "seq", "count", "message").rows()
        table = Table(["severity", "kind", "rank", "seq", "count", "message"], out, row_styles=_styles(out))
        click.echo(get_renderer("rows", "table", terminal=stdout_terminal()).render(table), nl=False)
        click.echo(f"run {ref.name}: {_counts(issues)}")
    if fmt == "table" and (ref.details.get("ranks") or 0) > 1 and ref.details.get("analysis") == "stored":
        click.echo(_straggler_line(db, ref))
    if (issues["severity"] == "error").any():
        ctx.exit(1)


_STRAGGLER_CHECK_EVENTS = 5_000_000


def _straggler_line(db: str | None, ref: Any) -> str:
    """One line on a multi-rank run's persistent straggler (``modtrace stragglers``)."""
    import modtrace.api
    from modtrace.core.errors import UsageError
    from modtrace.renderers.stragglers import who

    if (ref.details.get("events") or 0) > _STRAGGLER_CHECK_EVENTS:  # the reduction reads every span
        return f"stragglers: not computed by check for a run this large (modtrace stragglers {ref.name})"
    try:
        with modtrace.api.open(db) as database:
            found = database.stragglers(ref).to_dict()
    except UsageError as exc:  # no step every rank recorded
        return f"stragglers: none compared ({exc})"
    if not found["persistent"]:
        return f"stragglers: no persistent straggler over {len(found['steps'])} steps of {found['ranks']} ranks"
    top = found["persistent"][0]
    return (f"stragglers: {who(top)} held back {top['steps']} of {len(found['steps'])} steps, median "
            f"+{top['median_excess_ns'] / 1e6:.2f} ms (modtrace stragglers {ref.name})")
