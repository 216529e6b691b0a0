"""How the CLI turns exceptions into one line and an exit code."""

from __future__ import annotations

import sys
import traceback
from typing import NoReturn

import click

from modtrace.core.errors import ModtraceError
from modtrace.core.secrets import mask


def _debug_requested(argv: list[str]) -> bool:
    # --debug is a group option; honour it wherever it appears before "--".
    for arg in argv:
        if arg == "--":
            break
        if arg == "--debug":
            return True
    return False


def run_main(group: click.Group, argv: list[str]) -> NoReturn:
    debug = _debug_requested(argv)
    try:
        rv = group.main(args=argv, prog_name="modtrace", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("modtrace: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        # UsageError and BadParameter: click's own message, on one line.
        msg = exc.format_message().replace("\n", " ")
        click.echo(mask(f"modtrace: error: {msg}"), err=True)
        sys.exit(exc.exit_code)
    except ModtraceError as exc:
        if debug:
            traceback.print_exc()
        click.echo(mask(f"modtrace: error: {exc.cli or exc}"), err=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        click.echo("modtrace: interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:
        sys.exit(0)
    except Exception as exc:  # an unexpected failure is still one line unless --debug
        if debug:
            traceback.print_exc()
        else:
            click.echo(mask(f"modtrace: error: {type(exc).__name__}: {exc} (rerun with --debug for a traceback)"), err=True)
        sys.exit(1)
    sys.exit(rv if isinstance(rv, int) else 0)
