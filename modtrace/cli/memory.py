"""``modtrace memory``: where a run's memory goes, and what checkpointing modules would buy."""

from __future__ import annotations

from typing import Any

import click

from modtrace.cli._options import db_option, format_option, stdout_terminal


class ByteSize(click.ParamType):  # type: ignore[type-arg]
    """A size in bytes: ``2GiB``, ``500MB``, ``1.5G``, ``123456`` (``core.sizes.parse_bytes``)."""

    name = "bytes"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from modtrace.core.errors import UsageError
        from modtrace.core.sizes import parse_bytes

        try:
            return parse_bytes(value)
        except UsageError as exc:
            self.fail(str(exc), param, ctx)


@click.command()
@click.argument("run")
@db_option
@click.option("--checkpoint", "checkpoint", multiple=True, metavar="PATTERN",
              help="A glob on module names (blocks.*, *.mlp; repeatable): predict the step's peak and time had "
                   "the outermost matching calls been checkpointed (non-reentrant torch.utils.checkpoint).")
@click.option("--budget", type=ByteSize(), default=None, metavar="BYTES",
              help="Find the cheapest modules (by measured recompute time) whose checkpointing brings the "
                   "predicted peak within BYTES (2GiB, 500MB, 1.5G).")
@click.option("--device", default=None, metavar="NAME",
              help="The device the modules, what-if and budget are for (default: that of the largest peak).")
@click.option("--top", type=click.IntRange(min=1), default=15, show_default=True, metavar="N",
              help="The table and Markdown list the N modules that keep the most (JSON and CSV: all).")
@format_option("table", "json", "csv", "markdown")
def memory(run: str, db: str | None, checkpoint: tuple[str, ...], budget: int | None, device: str | None, top: int,
           fmt: str) -> None:
    """Where RUN's memory goes: the peak live tensor memory of each counted step, and each module
    by what its forward keeps (for its backward, and what it returns) beside its forward time,
    what recomputing it would cost.  Needs a run recorded with --counters first or every-step.

    With --checkpoint, the predicted peak and step time had those modules been checkpointed;
    with --budget, the cheapest set that fits.  The model: docs/memory.md.
    """
    import modtrace.api
    from modtrace.renderers import get_renderer

    with modtrace.api.open(db) as database:
        found = database.memory(run, checkpoint=checkpoint, budget=budget, device=device)
    model = {**found.to_dict(), "top": top}
    terminal = stdout_terminal() if fmt == "table" else None
    click.echo(get_renderer("memory", fmt, terminal=terminal).render(model), nl=False)
