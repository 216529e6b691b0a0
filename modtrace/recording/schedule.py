"""Which steps of a long run are recorded: a schedule, as ``torch.profiler.schedule`` has.

A schedule skips the first ``skip_first`` steps, then repeats a cycle of
``wait`` steps (no hooks installed at all), ``warmup`` steps (hooks run, their
events are thrown away, so the first recorded step does not pay for the
hooks' first calls) and ``active`` steps (recorded whole).  ``repeat`` cycles,
or forever with ``repeat=0``; after the last cycle nothing more is recorded.

Steps are the program's own (optimizer steps or ``Recorder.step()``), numbered
from 0; recorded steps keep their number, so step 12 of the program is step
12 in the database whether or not steps 0-11 were recorded.

This module is pure: it answers "what happens in step N" and reads the
``--schedule`` text; the recorder acts on the answer.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields

from modtrace.core.errors import UsageError


class StepAction(enum.IntEnum):
    """What the recorder does during one step."""

    OFF = 0  # no module hook installed
    WARMUP = 1  # hooks run, events discarded at the step's end
    RECORD = 2  # hooks run, events written


@dataclass(frozen=True)
class Schedule:
    """``skip_first``, then ``repeat`` cycles (0: forever) of ``wait`` off,
    ``warmup`` warm-up and ``active`` recorded steps."""

    skip_first: int = 0
    wait: int = 0
    warmup: int = 0
    active: int = 1
    repeat: int = 0

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise UsageError(f"schedule {f.name} must be a whole number, not {value!r}")
            if value < 0:
                raise UsageError(f"schedule {f.name} must be 0 or more, not {value}")
        if self.active < 1:
            raise UsageError("schedule active must be at least 1 (a schedule that records nothing records no run)")

    @property
    def cycle(self) -> int:
        return self.wait + self.warmup + self.active

    def action(self, step: int) -> StepAction:
        """What happens during step ``step`` (from 0)."""
        if step < self.skip_first:
            return StepAction.OFF
        n = step - self.skip_first
        if self.repeat and n // self.cycle >= self.repeat:
            return StepAction.OFF
        k = n % self.cycle
        if k < self.wait:
            return StepAction.OFF
        if k < self.wait + self.warmup:
            return StepAction.WARMUP
        return StepAction.RECORD

    def last_step(self) -> int | None:
        """The last step recorded, or None when the schedule never ends."""
        if not self.repeat:
            return None
        return self.skip_first + self.repeat * self.cycle - 1

    def recorded_steps(self, steps: int) -> list[int]:
        """The recorded steps among the first ``steps`` of a run."""
        return [s for s in range(steps) if self.action(s) is StepAction.RECORD]

    def text(self) -> str:
        """The ``--schedule`` form of this schedule, every field named."""
        return ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))


def schedule(*, active: int, skip_first: int = 0, wait: int = 0, warmup: int = 0, repeat: int = 0) -> Schedule:
    """A recording schedule for ``Recorder(schedule=...)``; see ``Schedule``."""
    return Schedule(skip_first=skip_first, wait=wait, warmup=warmup, active=active, repeat=repeat)


_FIELDS = tuple(f.name for f in fields(Schedule))


def parse_schedule(text: str) -> Schedule:
    """Read ``skip_first=10,wait=5,warmup=1,active=20,repeat=3`` (any subset,
    any order; the rest take their defaults).  Bad text raises ``UsageError``
    with one line that says what is wrong."""
    values: dict[str, int] = {}
    for part in text.split(","):
        item = part.strip()
        if not item:
            continue
        key, sep, raw = item.partition("=")
        key, raw = key.strip(), raw.strip()
        if not sep:
            raise UsageError(f"bad schedule {text!r}: {item!r} is not KEY=N (keys: {', '.join(_FIELDS)})")
        if key not in _FIELDS:
            raise UsageError(f"bad schedule {text!r}: unknown key {key!r} (keys: {', '.join(_FIELDS)})")
        if key in values:
            raise UsageError(f"bad schedule {text!r}: {key} given twice")
        if not raw.isdigit():
            raise UsageError(f"bad schedule {text!r}: {key} must be a whole number 0 or more, not {raw!r}")
        values[key] = int(raw)
    if "active" not in values:
        raise UsageError(f"bad schedule {text!r}: active=N is required (keys: {', '.join(_FIELDS)})")
    try:
        return Schedule(**values)
    except UsageError as exc:
        raise UsageError(f"bad schedule {text!r}: {exc}") from None
