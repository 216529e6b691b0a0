"""``modtrace export`` (Perfetto/Chrome trace, Parquet, CSV) and ``modtrace report`` (HTML)."""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import click

from modtrace.cli._options import (
    clock_option,
    db_option,
    format_option,
    peak_option,
    quiet_option,
    rank_option,
)
from modtrace.cli._steps import step_on_option

if TYPE_CHECKING:
    import polars as pl

    from modtrace.api import Database

# Runs with more spans (or events) than this get a progress bar on a terminal;
# MODTRACE_PROGRESS_MIN_ROWS overrides it (tests draw bars for small runs).
PROGRESS_MIN_ROWS = 200_000
TABLES = ("spans", "events")


@dataclass
class RunData:
    """What the renderers need of one run, read through ``modtrace.api``."""

    info: dict[str, Any]
    spans: pl.DataFrame
    issues: pl.DataFrame
    anchors: dict[int, int]
    thread_names: dict[tuple[int, int], str | None]


def load_run(database: Database, ref: str, *, quiet: bool = False, trace: str | None = None) -> RunData:
    """Resolve RUN and read its metadata, spans, issues, clock anchors and thread names.

    A run that was never analysed (recorded with analysis off, or killed) is
    analysed on the fly, without writing to the database.  For a trace on the
    ``trace`` clock only the span columns a trace shows are read (with the
    device columns on the device clock), and on the host clock no issues (an
    empty frame); that read begins first, and runs while the rest is read.
    """
    from modtrace.api._cli import analysis, has_analysis, start_spans_with
    from modtrace.api._cli import anchors as read_anchors
    from modtrace.api._cli import thread_names as read_thread_names

    run = database.run(ref)
    begun = None
    if trace == "host":
        from modtrace.renderers.trace_columns import TRACE_SPAN_COLUMNS

        begun = start_spans_with(database, run, TRACE_SPAN_COLUMNS)
    info = dict(run.details)

    def read() -> tuple[pl.DataFrame, pl.DataFrame]:
        if begun is None:
            found = analysis(database, run)
            return found.spans, found.issues
        import polars as pl

        return begun(), pl.DataFrame()

    with progress_spinner(f"reading run {run.name!r}", int(info.get("events") or 0) // 2, quiet=quiet):
        stored = has_analysis(database, run)
        if stored:
            anchors, thread_names = read_anchors(database, run), read_thread_names(database, run)
            spans, issues = read()
    if not stored:
        if not quiet and info.get("events"):
            click.echo(f"modtrace: run {run.name!r} has no stored analysis; analysing its events now "
                       f"(`modtrace analyze {run.name}` stores it)", err=True)
        with progress_spinner(f"analysing run {run.name!r}", int(info.get("events") or 0) // 2, quiet=quiet):
            spans, issues = read()
        anchors, thread_names = read_anchors(database, run), read_thread_names(database, run)
    return RunData(info=info, spans=spans, issues=issues, anchors=anchors, thread_names=thread_names)


# -- progress ------------------------------------------------------------------------


def _progress_wanted(total: int, quiet: bool) -> bool:
    from modtrace.recording.status_line import wanted

    try:
        threshold = int(os.environ.get("MODTRACE_PROGRESS_MIN_ROWS", PROGRESS_MIN_ROWS))
    except ValueError:
        threshold = PROGRESS_MIN_ROWS
    return total >= threshold and wanted(sys.stderr, quiet)


@contextlib.contextmanager
def progress_spinner(label: str, total: int, *, quiet: bool) -> Iterator[None]:
    """A spinner on a terminal's stderr while a big run is read (its size is known only roughly)."""
    if not _progress_wanted(total, quiet):
        yield
        return
    from rich.console import Console

    with Console(file=sys.stderr).status(f"modtrace: {label}"):
        yield


@contextlib.contextmanager
def progress_bar(label: str, total: int, *, quiet: bool) -> Iterator[Callable[[int], None] | None]:
    """A rich progress bar on stderr for big jobs on a terminal; None otherwise."""
    if not _progress_wanted(total, quiet):
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    console = Console(file=sys.stderr)
    with Progress(
        TextColumn("modtrace: {task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        console=console, transient=True, redirect_stdout=False, redirect_stderr=False,
    ) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


# -- writing files -----------------------------------------------------------------


@contextlib.contextmanager
def atomic_text(path: str) -> Iterator[TextIO]:
    """A text stream to ``path`` (``-``: stdout) that replaces the file only when complete."""
    if path == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            yield fh
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _write_frame(frame: pl.DataFrame, path: Path | str, fmt: str) -> None:
    if path == "-":
        sys.stdout.write(frame.write_csv())
        return
    target = Path(path)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        if fmt == "parquet":
            frame.write_parquet(tmp)
        else:
            frame.write_csv(tmp)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _check_output_dir(path: Path) -> None:
    from modtrace.core.errors import UsageError

    if path.exists() and not path.is_dir():
        raise UsageError(f"-o {path}: exists and is not a directory (exporting spans and events writes a directory; "
                         "use --what spans|events for a single file)")
    if not path.parent.is_dir():
        raise UsageError(f"-o {path}: directory {path.parent} does not exist")


def _check_output_file(path: str, db: str | None) -> None:
    from modtrace.api._cli import is_database_file
    from modtrace.core.errors import UsageError

    if path == "-":
        return
    if is_database_file(path, db):
        # replacing it would also pull the file from under SQLite's connections
        raise UsageError(f"-o {path}: is the database being read (or a file of SQLite's beside it); "
                         "refusing to write over it")
    parent = Path(path).parent
    if not parent.is_dir():
        raise UsageError(f"-o {path}: directory {parent} does not exist")
    if Path(path).is_dir():
        raise UsageError(f"-o {path}: is a directory")


@contextlib.contextmanager
def cycle_collector_paused() -> Iterator[None]:
    """The cycle collector off while a command reads and renders a run, then as it was.

    Such a command builds many containers (the modules it imports, rows) and frees them by
    reference count; the collector's passes over them found nothing to free yet cost a
    noticeable part of a large export, all of it on the thread that drives the work.
    When the process ends with the command (``modtrace.cli.ENDS_WITH_COMMAND``), what it made
    is frozen instead: the interpreter's last collection at exit skips it (that pass is
    as costly after a large export) and the exit frees it all the same (docs/performance.md,
    "Tree, check, export").
    """
    import modtrace.cli

    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if modtrace.cli.ENDS_WITH_COMMAND:
            gc.freeze()
        elif enabled:
            gc.enable()


# -- commands -------------------------------------------------------------------------


@click.command()
@click.argument("run")
@db_option
@format_option("perfetto", "parquet", "csv", default="perfetto",
               help="perfetto: Chrome trace event JSON; parquet/csv: tables for DataFrames.")
@click.option("-o", "--output", "output", required=True, metavar="PATH",
              help="Output file (perfetto, or one table); a directory for both tables; - for stdout (text formats).")
@click.option("--what", type=click.Choice(["spans", "events", "all"]), default=None,
              help="Tables to write with parquet/csv (default: all, into the directory PATH).")
@clock_option
@quiet_option()
def export(run: str, db: str | None, fmt: str, output: str, what: str | None, clock: str | None,
           quiet: bool) -> None:
    """Export RUN's spans as a Perfetto / chrome://tracing trace, or spans and events as Parquet or CSV.

    On the device clock (default for a run with device times) the trace has
    device tracks per stream beside the host threads' tracks, and the spans
    table's times are device times.

    \b
    modtrace export RUN -o trace.json                     # open in ui.perfetto.dev
    modtrace export RUN --format parquet -o out/          # out/spans.parquet, out/events.parquet
    modtrace export RUN --format csv --what spans -o spans.csv
    """
    with cycle_collector_paused():
        _export(run, db, fmt, output, what, clock, quiet)


def _export(run: str, db: str | None, fmt: str, output: str, what: str | None, clock: str | None,
            quiet: bool) -> None:
    import modtrace.api
    from modtrace.api import _cli
    from modtrace.core.errors import UsageError

    if fmt == "perfetto":
        if what not in (None, "spans"):
            raise UsageError("--format perfetto exports spans only; --what events|all needs --format parquet or csv")
        _check_output_file(output, db)
    else:
        what = what or "all"
        if output == "-" and fmt == "parquet":
            raise UsageError("-o - (stdout) takes text: Parquet is binary, give it a file or directory "
                             "(--format csv or perfetto can write to stdout)")
        if output == "-" and what == "all":
            raise UsageError("-o - (stdout) takes one table: add --what spans or --what events")
        if what == "all":
            _check_output_dir(Path(output))
        else:
            if output != "-" and Path(output).is_dir():
                output = str(Path(output) / f"{what}.{fmt}")
            _check_output_file(output, db)

    with modtrace.api.open(db) as database:
        chosen = _cli.clock(database, run, clock)
        data = load_run(database, run, quiet=quiet, trace=chosen) if fmt == "perfetto" else load_run(
            database, run, quiet=quiet)
        if fmt == "perfetto":
            from modtrace.renderers import get_renderer
            from modtrace.renderers.perfetto import Trace

            with progress_bar("writing trace", data.spans.height, quiet=quiet) as advance, atomic_text(output) as out:
                get_renderer("trace", fmt, progress=advance).write(
                    Trace(data.spans, data.anchors, data.thread_names, data.info, device_tracks=chosen == "device"), out
                )
            written = [(output, data.spans.height, "spans")]  # one slice per span
        else:
            written = []
            if what == "all":
                Path(output).mkdir(exist_ok=True)
            if what in ("spans", "all"):
                path = output if what == "spans" else str(Path(output) / f"spans.{fmt}")
                table = database.spans(data.info["id"], clock=chosen, named=True)
                _write_frame(table, path, fmt)
                written.append((path, table.height, "spans"))
            if what in ("events", "all"):
                import polars as pl

                path = output if what == "events" else str(Path(output) / f"events.{fmt}")
                total = int(data.info.get("events") or 0)
                parts = []
                with progress_bar("reading events", total, quiet=quiet) as advance:
                    for part in _cli.event_log(database, data.info["id"]):
                        parts.append(part)
                        if advance is not None:
                            advance(part.height)
                events = pl.concat(parts)
                _write_frame(events, path, fmt)
                written.append((path, events.height, "events"))
    if not quiet and output != "-":
        for path, n, kind in written:
            click.echo(f"modtrace: wrote {n:,} {kind} of run {data.info['name']!r} to {path}", err=True)


def _diff_document(database: Database, base: str, cand: str, step_on: str | None, clock: str,
                   window: int = 10) -> dict[str, Any]:
    """What ``modtrace diff BASE CAND --step-on STEP_ON --clock CLOCK --window WINDOW --format json``
    prints: the report's diff is that command's, read the same way, so both show the same numbers."""
    from modtrace.api import DiffOptions
    from modtrace.renderers.diff_document import document

    options = DiffOptions()
    result = database.diff(base, cand, options, step_on=step_on, clock=clock, window=window)
    assert result.sides is not None
    return document(result, result.sides[0], result.sides[1], options, "regression")


def _stragglers(database: Any, info: Mapping[str, Any]) -> dict[str, Any] | None:
    """A multi-rank run's ``modtrace stragglers`` for the report's section, when it can be had."""
    from modtrace.core.errors import UsageError

    if (info.get("ranks") or 0) < 2 or info.get("analysis") != "stored":
        return None
    try:
        found: dict[str, Any] = database.stragglers(info["id"]).to_dict()
    except UsageError:  # no step every rank recorded
        return None
    return found


@click.command()
@click.argument("run")
@db_option
@click.option("--vs", "base", metavar="BASE", default=None,
              help="Compare with run BASE, or with a history of runs ('tag:KEY=VALUE', as modtrace diff takes it): "
                   "the diff, regressions highlighted, and each blamed module's time across the runs.")
@click.option("--window", type=int, default=10, show_default=True,
              help="With --vs tag:KEY=VALUE: how many of the newest matching runs make the history.")
@click.option("-o", "--output", "output", required=True, metavar="FILE", help="HTML file to write (- for stdout).")
@click.option("--step", type=int, default=None, help="Step whose flame chart opens first (default: the step of median wall time).")
@rank_option("Rank shown in the flame chart (default: the lowest).")
@step_on_option
@clock_option
@peak_option
@quiet_option()
def report(run: str, db: str | None, base: str | None, window: int, output: str, step: int | None, rank: int | None,
           step_on: str | None, clock: str | None, peak_tflops: float | None, quiet: bool) -> None:
    """Write one self-contained HTML file about RUN: a flame chart of a step
    (forward, backward, recompute), per-step times, the modules by self time
    (with FLOPs/step, GFLOP/s and FLOP/B when the run counted work; % peak
    with --peak-tflops), the nesting issues and, with --vs BASE, the diff
    against BASE.  It needs no network to view."""
    from dataclasses import replace

    import modtrace.api
    from modtrace.api import _cli
    from modtrace.core.errors import UsageError
    from modtrace.renderers import get_renderer
    from modtrace.renderers.html_report import report_data

    _check_output_file(output, db)
    with modtrace.api.open(db) as database:
        # --vs compares on one clock (as diff does); the run's own times are on it too.
        history = base is not None and _cli.is_history(base)
        # against a history, the run's own clock (diff then reads every base run on it)
        chosen = _cli.clock(database, run, clock) if base is None or history else _cli.diff_clock(database, base, run, clock)
        data = load_run(database, run, quiet=quiet)
        data = replace(data, spans=database.spans(data.info["id"], clock=chosen), info={**data.info, "clock": chosen})
        stepped = _cli.restep(database, data.info["id"], data.spans, step_on)
        data = replace(data, spans=stepped.frame)
        diff = None
        if base is not None:
            if not history:
                base_run = database.run(base)
                if base_run.id == data.info["id"]:
                    raise UsageError(f"--vs {base}: is the same run as {run}")
                base = base_run.name
            diff = _diff_document(database, base, data.info["name"], step_on, chosen, window)
        stragglers = _stragglers(database, data.info)
    if rank is not None and data.spans.height and rank not in set(data.spans["rank"].unique().to_list()):
        raise UsageError(f"--rank {rank}: run {data.info['name']!r} has no spans on that rank")
    with progress_bar("building report", data.spans.height, quiet=quiet) as advance:
        payload = report_data(
            data.info, data.spans, data.issues, steps=_cli.step_table(data.spans), step=step, rank=rank, diff=diff,
            progress=advance, peak_tflops=peak_tflops, stragglers=stragglers,
        )
    html = get_renderer("report", "html").render(payload)
    with atomic_text(output) as out:
        out.write(html)
    if not quiet and output != "-":
        click.echo(f"modtrace: wrote report of run {data.info['name']!r} to {output}", err=True)
