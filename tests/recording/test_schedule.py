"""The recording schedule: which steps are off, warm-up or recorded, and
the ``--schedule`` text."""

from __future__ import annotations

import pytest

from modtrace.core.errors import UsageError
from modtrace.recording.schedule import Schedule, StepAction, parse_schedule, schedule

OFF, WARMUP, RECORD = StepAction.OFF, StepAction.WARMUP, StepAction.RECORD


def test_cycles_after_skip_first() -> None:
    s = schedule(skip_first=2, wait=1, warmup=1, active=2, repeat=2)
    assert [s.action(i) for i in range(12)] == [
        OFF, OFF,  # skip_first
        OFF, WARMUP, RECORD, RECORD,  # cycle 1
        OFF, WARMUP, RECORD, RECORD,  # cycle 2
        OFF, OFF,  # repeat exhausted
    ]
    assert s.recorded_steps(100) == [4, 5, 8, 9]
    assert s.last_step() == 9


def test_repeat_zero_goes_on_forever() -> None:
    s = schedule(wait=2, active=1)
    assert s.recorded_steps(10) == [2, 5, 8]
    assert s.action(10_000_001) is RECORD
    assert s.last_step() is None


def test_active_only_records_every_step() -> None:
    s = schedule(active=3)
    assert s.recorded_steps(5) == [0, 1, 2, 3, 4]


def test_text_round_trip() -> None:
    s = parse_schedule("skip_first=10, wait=5,warmup=1,active=20,repeat=3")
    assert s == Schedule(skip_first=10, wait=5, warmup=1, active=20, repeat=3)
    assert parse_schedule(s.text()) == s
    assert parse_schedule("active=4") == Schedule(active=4)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "active=N is required"),
        ("wait=3", "active=N is required"),
        ("active=0", "at least 1"),
        ("active=-2", "whole number"),
        ("active=2.5", "whole number"),
        ("active", "is not KEY=N"),
        ("actve=3", "unknown key 'actve'"),
        ("active=2,active=3", "given twice"),
    ],
)
def test_bad_text_is_one_clear_line(text: str, says: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_schedule(text)
    message = str(info.value)
    assert says in message and "\n" not in message


def test_bad_values_from_python() -> None:
    with pytest.raises(UsageError, match="wait must be 0 or more"):
        schedule(wait=-1, active=1)
    with pytest.raises(UsageError, match="whole number"):
        Schedule(active=True)
