"""Options shared by several commands, as reusable decorators."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

F = TypeVar("F", bound=Callable[..., Any])


def db_option(fn: F) -> F:
    return click.option(
        "--db",
        metavar="DB",
        default=None,
        help="Database file or SQLAlchemy URL (default: $MODTRACE_DB, else ./modtrace.db).",
    )(fn)


def format_option(*choices: str, default: str = "table", help: str = "Output format.") -> Callable[[F], F]:  # noqa: A002
    def deco(fn: F) -> F:
        return click.option(
            "--format",
            "fmt",
            type=click.Choice(choices),
            default=default,
            show_default=True,
            help=help,
        )(fn)

    return deco


def rank_option(help: str) -> Callable[[F], F]:  # noqa: A002 -- click's own name for it
    """``--rank N``: one rank of a run (from 0); the command says what it selects."""

    def deco(fn: F) -> F:
        return click.option("--rank", type=click.IntRange(min=0), default=None, metavar="N", help=help)(fn)

    return deco


def clock_option(fn: F) -> F:
    """``--clock host|device``: which clock the run's times are read on (default: device when
    the run has device times, else host)."""
    return click.option(
        "--clock", type=click.Choice(["host", "device"]), default=None,
        help="Times on the host clock (when Python ran the hooks) or the device's "
             "(when CUDA ran the work; default when the run has device times).",
    )(fn)


def stdout_terminal() -> Any:
    """The ``renderers.Terminal`` of stdout, for renderers of text meant for a person."""
    import sys

    from modtrace.renderers.base import terminal_of

    return terminal_of(sys.stdout)


def quiet_option(help: str = "No progress bar or notes on stderr.") -> Callable[[F], F]:  # noqa: A002
    """``-q/--quiet``: nothing on stderr but errors."""

    def deco(fn: F) -> F:
        return click.option("-q", "--quiet", is_flag=True, help=help)(fn)

    return deco


def _peak(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    import math

    if value is not None and not (math.isfinite(value) and value > 0):
        raise click.BadParameter(f"{value} is not a number of TFLOP/s above 0", ctx=ctx, param=param)
    return value


def peak_option(fn: F) -> F:
    """``--peak-tflops X``: the device's peak FLOP/s, for each module's utilisation (% peak)."""
    return click.option(
        "--peak-tflops", type=float, default=None, metavar="X", callback=_peak,
        help="The device's peak throughput in TFLOP/s (e.g. its dense BF16 figure): adds each module's "
             "achieved FLOP/s as a percentage of it (% peak). Needs work counters (record --counters).",
    )(fn)
