"""The ``modtrace`` command line: a thin click layer over the library.

Commands live one per module in this package and are imported only when
invoked, so ``modtrace --help`` stays fast and never imports torch, Alembic or
the SQLAlchemy ORM.  Every command opens the database, calls one library
function and hands the result to a renderer.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any

import click

from modtrace._version import __version__

# name -> (module in modtrace.cli, attribute, one-line help shown by --help)
COMMANDS: dict[str, tuple[str, str, str]] = {
    "record": ("record", "record", "Run a script or module under the recorder."),
    "runs": ("runs", "runs", "List recorded runs."),
    "show": ("runs", "show", "Show one run's metadata, status and counts."),
    "delete": ("runs", "delete", "Delete runs with every row they have (retention)."),
    "analyze": ("analysis", "analyze", "Rebuild a run's spans and nesting issues."),
    "tree": ("analysis", "tree", "Show the module tree of a run with timings."),
    "check": ("analysis", "check", "List a run's nesting issues; exit 1 on errors."),
    "diff": ("diff", "diff", "Compare two runs: structure and timing regressions."),
    "stragglers": ("stragglers", "stragglers", "Name the rank and module that held each step back."),
    "memory": ("memory", "memory", "Where memory goes per module; what checkpointing would buy."),
    "query": ("query", "query", "Run a SQL query from queries/, a file or a string."),
    "export": ("export", "export", "Export a run to Perfetto/Chrome trace, Parquet or CSV."),
    "report": ("export", "report", "Write a self-contained HTML report of a run."),
    "db": ("db", "db", "Manage the database schema (upgrade, current, check)."),
}


def _available(name: str) -> bool:
    module = COMMANDS[name][0]
    return importlib.util.find_spec(f"modtrace.cli.{module}") is not None


class LazyGroup(click.Group):
    """A group whose subcommands are imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name for name in COMMANDS if _available(name)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS or not _available(cmd_name):
            return None
        module, attr, _ = COMMANDS[cmd_name]
        cmd: click.Command = getattr(importlib.import_module(f"modtrace.cli.{module}"), attr)
        return cmd

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][2]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="modtrace")
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Record the nn.Module hierarchy of PyTorch programs and analyse it offline.

    Every command takes --db (a file path or SQLAlchemy URL; default
    $MODTRACE_DB, else ./modtrace.db).
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug


# True once main() runs as this process's command (the console entry point, python -m modtrace):
# the process then ends with the command, and a command that runs no user code may leave what
# it made to the exit (``cli.export.cycle_collector_paused``).
ENDS_WITH_COMMAND = False


def main(argv: list[str] | None = None) -> Any:
    """Console entry point: one-line errors, exit 2 for usage, 1 for failures."""
    global ENDS_WITH_COMMAND
    from modtrace.cli._errors import run_main

    if argv is None:
        ENDS_WITH_COMMAND = True
    return run_main(cli, argv if argv is not None else sys.argv[1:])
