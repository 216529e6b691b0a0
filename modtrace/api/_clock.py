"""Which clock a run's times are read on: host (when Python ran the hooks) or device.

A run has device times when its ``device_events`` hold a timed row
(``store.device_times.has_device_events``); its spans then carry the device
columns (``analysis.device``), and ``tree``, ``diff``, ``report`` and
``export`` read them by default.  ``--clock device`` on a run without them
is a usage error, said in one line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from modtrace.core.contracts import CLOCKS
from modtrace.core.errors import UsageError

if TYPE_CHECKING:
    from modtrace.store.engine import Store


def _check(clock: str | None) -> None:
    if clock is not None and clock not in CLOCKS:
        raise UsageError(f"clock={clock!r}: one of {', '.join(map(repr, CLOCKS))}",
                         cli=f"--clock {clock}: one of {', '.join(CLOCKS)}")


def _no_device_time(names: list[str]) -> UsageError:
    names = list(dict.fromkeys(names))
    which = f"run {names[0]!r} has" if len(names) == 1 else f"runs {' and '.join(map(repr, names))} have"
    return UsageError(f"clock='device': {which} no device times (recorded without CUDA, or with "
                      "Recorder(device_time=False)); use clock='host'",
                      cli=f"--clock device: {which} no device times (recorded without CUDA, or with "
                      "--no-device-time); use --clock host")


def resolve_clock(store: Store, run_id: int, run_name: str, clock: str | None) -> str:
    """``clock``, checked; None: ``device`` when the run has device times, else ``host``."""
    from modtrace.store.device_times import has_device_events

    _check(clock)
    if clock == "host":
        return clock
    has = has_device_events(store, run_id)
    if clock == "device" and not has:
        raise _no_device_time([run_name])
    return "device" if has else "host"


def common_clock(sides: list[tuple[Store, int, str]], clock: str | None) -> str:
    """One clock for every run of a comparison ((store, run id, name) each): ``clock``, checked
    against every run; None: ``device`` when every run has device times, else ``host``."""
    from modtrace.store.device_times import has_device_events

    _check(clock)
    if clock == "host":
        return clock
    missing = [name for store, run_id, name in sides if not has_device_events(store, run_id)]
    if clock == "device" and missing:
        raise _no_device_time(missing)
    return "host" if missing else "device"
