"""``modtrace record``: run a script or module under the recorder, unedited.

Everything up to SCRIPT (or ``-m MODULE``) is modtrace's; everything after
it belongs to the target, exactly as after ``python SCRIPT`` or ``python -m
MODULE``.  The target's exit code becomes modtrace's.

Under a distributed launcher (``torchrun ... -m modtrace record ...``) every
rank records into the same run: give ``--run NAME``, or let the ranks derive
one shared name from the launch (see ``naming.shared_run_name``).
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Callable
from typing import Any

import click

from modtrace.cli._options import db_option, quiet_option
from modtrace.core.errors import UsageError
from modtrace.core.step_rules import STEP_RULES

AUTO_NAME_ATTEMPTS = 50


class RecordCommand(click.Command):
    """Stops option parsing at SCRIPT or at ``-m MODULE``, as python does.

    click alone would keep parsing options after ``-m MODULE`` (its value is
    not a positional), so the argument list is split here first and the
    target's part handed over after ``--``.
    """

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["modtrace.record.args"] = list(args)
        head, tail = self._split(ctx, list(args))
        return super().parse_args(ctx, [*head, "--", *tail])

    def _split(self, ctx: click.Context, args: list[str]) -> tuple[list[str], list[str]]:
        takes_value: set[str] = set()
        for param in self.get_params(ctx):
            if isinstance(param, click.Option) and not (param.is_flag or param.count):
                takes_value.update(param.opts)
        i = 0
        while i < len(args):
            arg = args[i]
            if arg == "--":
                return args[:i], args[i + 1 :]
            if arg == "-m":
                return args[: i + 2], args[i + 2 :]
            if arg.startswith("-m") and not arg.startswith("--"):  # -mpackage.module
                return args[: i + 1], args[i + 1 :]
            if arg in takes_value:
                i += 2
            elif arg.startswith("-") and arg != "-":
                i += 1  # a flag, --opt=value, or an unknown option click will report
            else:
                return args[:i], args[i:]
        return args, []


def parse_tags(values: tuple[str, ...]) -> dict[str, str]:
    tags: dict[str, str] = {}
    for value in values:
        key, sep, val = value.partition("=")
        key = key.strip()
        if not sep or not key:
            raise UsageError(f"--tag expects KEY=VALUE, got {value!r}")
        if key in tags:
            raise UsageError(f"--tag {key} given twice")
        tags[key] = val
    return tags


def check_run_name(name: str) -> str:
    if not name.strip():
        raise UsageError("--run needs a non-empty name")
    if name.startswith("@"):
        raise UsageError(f"--run {name!r}: a name cannot start with @ (that means the newest runs)")
    if name.isdigit():
        raise UsageError(f"--run {name!r}: a name cannot be all digits (RUN references read digits as ids)")
    if len(name) > 200:
        raise UsageError("--run: a name has at most 200 characters")
    return name


@click.command(cls=RecordCommand, context_settings={"allow_interspersed_args": False})
@db_option
@click.option("--run", "--run-name", "run_name", metavar="NAME", default=None,
              help="Run name, unique in the database (default: script or module name and start time).")
@click.option("--tag", "tags", metavar="KEY=VALUE", multiple=True, help="Attach a tag to the run (repeatable).")
@click.option("-m", "module", metavar="MODULE", default=None, help="Run a library module as a script, like python -m.")
@quiet_option("No progress line and no summary on stderr.")
@click.option("--no-analyze", is_flag=True, help="Skip building spans and nesting issues when the run ends.")
@click.option("--step-on", type=click.Choice(STEP_RULES), default="auto", show_default=True,
              help="What makes a step: optimizer steps when the run makes any, else each root call (auto); "
                   "optimizer; root (each outermost module call of any thread: one per generate() token, "
                   "per request, per batch); manual (Recorder.step() only). Root calls are always recorded, "
                   "so tree, diff and report can choose again with --step-on.")
@click.option("--schedule", "schedule_text", metavar="KEY=N,...", default=None,
              help="Record only some steps, as torch.profiler.schedule does: skip the first skip_first steps, "
                   "then repeat (0: forever) cycles of wait steps (no hooks at all), warmup steps (hooks run, "
                   "nothing written) and active steps (recorded), e.g. "
                   "skip_first=10,wait=5,warmup=1,active=20,repeat=3. active is required.")
@click.option("--eager", is_flag=True,
              help="Run with torch.compile disabled (TORCH_COMPILE_DISABLE=1): a model compiled as a whole "
                   "records only its own call, not its submodules'.")
@click.option("--no-device-time", is_flag=True,
              help="Do not record device time and memory of module calls on CUDA (on by default).")
@click.option("--counters", type=click.Choice(("first", "every-step", "off")), default="first", show_default=True,
              help="Count FLOPs, bytes and aten ops per module call (spans.flops, bytes, ops) on the first "
                   "recorded step of each step kind (first), on every recorded step, or never. Counting "
                   "routes every op of a counted step through Python; other steps cost nothing more.")
@click.option("--speed-probe", is_flag=True,
              help="Time a fixed piece of CPU work (about 0.6 ms) before each step, so that diff against a history "
                   "of runs recorded the same way judges step times at one machine speed: record the baseline "
                   "runs and the candidate of a CI gate with it on shared or loaded runners.")
@click.argument("target_args", nargs=-1, type=click.UNPROCESSED, metavar="SCRIPT [ARGS]...")
@click.pass_context
def record(
    ctx: click.Context,
    db: str | None,
    run_name: str | None,
    tags: tuple[str, ...],
    module: str | None,
    quiet: bool,
    no_analyze: bool,
    step_on: str,
    schedule_text: str | None,
    eager: bool,
    no_device_time: bool,
    counters: str,
    speed_probe: bool,
    target_args: tuple[str, ...],
) -> int:
    """Run SCRIPT (or -m MODULE) as python would, recording its module calls.

    Options for modtrace go before SCRIPT; everything after SCRIPT is passed
    to it.  The exit code is the target's: 1 after an uncaught exception
    (the run is marked failed), 130 on Ctrl-C and 143 on SIGTERM (marked
    interrupted; recorded events are kept).

    \b
    Examples:
      modtrace record train.py --lr 3e-4
      modtrace record --run base --tag lr=3e-4 -m pkg.train --steps 10
      torchrun --nproc-per-node 2 -m modtrace record --run-name R train.py

    Under torchrun every rank records into one run.  Name it with --run-name
    (torchrun's own parser rejects --run as an abbreviation of its
    --run-path), or let the ranks derive one name from the launch.
    """
    from modtrace.recording.script_runner import Target, check_target

    if module is not None:
        target = Target("module", module, tuple(target_args))
    elif target_args:
        target = Target("script", target_args[0], tuple(target_args[1:]))
    else:
        raise UsageError("record needs SCRIPT or -m MODULE (see modtrace record --help)")
    tag_map = parse_tags(tags)
    schedule = None
    if schedule_text is not None:
        from modtrace.recording.schedule import parse_schedule

        schedule = parse_schedule(schedule_text)
        if step_on == "root":
            raise UsageError("--schedule counts optimizer steps and Recorder.step() calls: "
                             "use it with --step-on auto, optimizer or manual, not root")
    if run_name is not None:
        check_run_name(run_name)
    check_target(target)
    command = shlex.join(["modtrace", "record", *ctx.meta.get("modtrace.record.args", [])])
    restore = disable_compilation() if eager else None
    try:
        code = _record(target, db=db, run_name=run_name, tags=tag_map, command=command,
                       quiet=quiet, analyze=not no_analyze, step_on=step_on, schedule=schedule,
                       device_time=False if no_device_time else None, counters=counters,
                       speed_probe=speed_probe)
    finally:
        if restore is not None:  # a caller in this process (an embedding, a test) compiles again
            restore()
    import modtrace.cli

    if modtrace.cli.ENDS_WITH_COMMAND and isinstance(code, int):
        # the run is stored: the user need not wait for the interpreter's teardown
        from modtrace.recording.process_end import end_process

        end_process(code)  # returns while the program's own (non-daemon) threads run
    return code


def disable_compilation() -> Callable[[], None]:
    """torch.compile runs the original code, for this process and its children,
    until the returned function is called."""
    before = os.environ.get("TORCH_COMPILE_DISABLE")
    os.environ["TORCH_COMPILE_DISABLE"] = "1"
    dynamo = sys.modules.get("torch._dynamo")
    was = dynamo.config.disable if dynamo is not None else None
    if dynamo is not None:  # read at import: set the live config too
        dynamo.config.disable = True

    def restore() -> None:
        if before is None:
            os.environ.pop("TORCH_COMPILE_DISABLE", None)
        else:
            os.environ["TORCH_COMPILE_DISABLE"] = before
        live = sys.modules.get("torch._dynamo")
        if live is not None:
            live.config.disable = bool(was) if was is not None else False

    return restore


def _record(
    target: Any,
    *,
    db: str | None,
    run_name: str | None,
    tags: dict[str, str],
    command: str,
    quiet: bool,
    analyze: bool,
    step_on: str = "auto",
    device_time: bool | None = None,
    schedule: Any = None,
    counters: str = "first",
    speed_probe: bool = False,
) -> int:
    from datetime import datetime

    from modtrace.core.errors import Terminated
    from modtrace.recording.run_names import default_run_name, shared_run_name
    from modtrace.recording.script_runner import EXIT_TERMINATED, git_commit

    auto = run_name is None
    if auto:
        run_name = shared_run_name(target.stem, os.environ, os.getppid())
        if run_name is not None:
            auto = False  # every rank must land in the same run: no suffixing
        else:
            run_name = default_run_name(target.stem, datetime.now())
    assert run_name is not None
    # The recorder fills in the process (cwd, host, pid, versions, world size); the commit is ours to find.
    meta = {"git_commit": git_commit(os.getcwd())}

    try:
        return _record_under(target, run_name, auto, db=db, tags=tags, command=command, meta=meta,
                             quiet=quiet, analyze=analyze, step_on=step_on, device_time=device_time, schedule=schedule,
                             counters=counters, speed_probe=speed_probe)
    except Terminated:
        # SIGTERM before the target started or after it ended; a started
        # recorder finishes from its atexit hook.
        return EXIT_TERMINATED


def _record_under(
    target: Any, run_name: str, auto: bool, *, db: str | None, tags: dict[str, str], command: str,
    meta: dict[str, Any], quiet: bool, analyze: bool, step_on: str = "auto", device_time: bool | None = None,
    schedule: Any = None, counters: str = "first", speed_probe: bool = False,
) -> int:
    from modtrace.core.errors import Terminated
    from modtrace.recording import status_line as progress_mod
    from modtrace.recording.script_runner import EXIT_TERMINATED, Outcome, SigtermGuard, execute

    with SigtermGuard() as guard:
        rec = _start_recorder(run_name, auto, db=db, tags=tags, command=command, meta=meta, analyze=analyze,
                              step_on=step_on, device_time=device_time, schedule=schedule,
                              counters=counters, speed_probe=speed_probe)
        line = None
        if progress_mod.wanted(sys.stderr, quiet):
            line = progress_mod.ProgressLine(
                sys.stderr, rec.run_name, lambda: (rec.events_recorded, rec.step_count)
            ).guard().start()
        try:
            outcome = execute(target)
        except Terminated:  # arrived while the runner was already handling the end
            outcome = Outcome("interrupted", EXIT_TERMINATED, "SIGTERM")
        except BaseException as exc:
            guard.shield()
            if line is not None:
                line.stop()
            rec.finish("failed", f"modtrace: {type(exc).__name__}: {exc}")
            raise
        guard.shield()
        if line is not None:
            line.stop()
        rec.finish(outcome.status, outcome.error)
        rec.wait_analyzed()  # the writer process analyses the run after the program: record returns after it

    if not quiet:
        _summary(rec, outcome)
    return outcome.exit_code


def _start_recorder(
    name: str, auto: bool, *, db: str | None, tags: dict[str, str], command: str,
    meta: dict[str, Any], analyze: bool, step_on: str = "auto", device_time: bool | None = None,
    schedule: Any = None, counters: str = "first", speed_probe: bool = False,
) -> Any:
    """Open the recorder, suffixing a default name that a run already took (-2, -3, ...)."""
    from modtrace.core.errors import RunNameTaken
    from modtrace.recording.recorder import Recorder

    attempt = 1
    while True:
        candidate = name if attempt == 1 else f"{name}-{attempt}"
        rec = Recorder(db, candidate, tags, command=command, meta=meta, analyze=analyze, step_on=step_on,
                       device_time=device_time, schedule=schedule, counters=counters,
                       speed_probe=speed_probe)
        try:
            rec.__enter__()  # Recorder.start
        except RunNameTaken:
            if not auto or attempt >= AUTO_NAME_ATTEMPTS:
                raise
            attempt += 1
            continue
        return rec


def _summary(rec: Any, outcome: Any) -> None:
    who = f"rank {rec.rank}: " if getattr(rec, "world_size", 1) > 1 else ""
    state = outcome.status if not outcome.error else f"{outcome.status} ({outcome.error})"
    if rec.status == "failed" and outcome.status != "failed":  # the recording failed (a write error), not the target
        state = "failed (recording stopped by a write error; the program itself " + state + ")"
    from modtrace.core.secrets import mask

    click.echo(mask(
        f"modtrace: {who}run {rec.run_name!r} (id {rec.run_id}) {state}: "
        f"{rec.events_recorded:,} events, {rec.step_count:,} steps"),
        err=True,
    )
